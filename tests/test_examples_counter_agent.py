"""The scripted example agent (`gymweb/examples/counter_agent.py`), driven by hand against the counter env."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gymweb.examples import counter_agent, counter_env
from gymweb.examples._serve import BackgroundServer

REPO = Path(__file__).resolve().parents[1]
TASKS = [
    json.loads(line)
    for line in (REPO / "gymweb" / "examples" / "data" / "counter_tasks.jsonl").read_text().splitlines()
    if line.strip()
]
USAGE_KEYS = {"input_tokens", "output_tokens", "total_tokens", "input_tokens_details", "output_tokens_details"}


def drive(env_url: str, agent_url: str, row: dict, max_steps: int = 8) -> tuple[dict, list[httpx.Response]]:
    """One rollout the way the contract describes it: seed, call the agent, run its unpaired asks
    against the env, append the outputs, repeat until an assistant message; then verify.

    Each party gets its own client, i.e. its own cookie jar. Returns (the /verify reply, the agent's
    raw HTTP replies)."""
    with (
        httpx.Client(base_url=env_url, timeout=30, trust_env=False) as env,
        httpx.Client(base_url=agent_url, timeout=30, trust_env=False) as agent,
    ):
        env.post("/seed_session", json=row).raise_for_status()
        params = dict(row["responses_create_params"])
        conversation = list(counter_agent.as_items(params["input"]))
        trajectory: list[dict] = []
        replies: list[httpx.Response] = []
        for _ in range(max_steps):
            reply = agent.post("/v1/responses", json={**params, "input": conversation})
            reply.raise_for_status()
            replies.append(reply)
            output = reply.json()["output"]
            paired = {item["call_id"] for item in output if item["type"] == "function_call_output"}
            asks = [item for item in output if item["type"] == "function_call" and item["call_id"] not in paired]
            conversation += output
            trajectory += output
            for ask in asks:
                result = env.post(
                    f"/{ask['name']}", content=ask["arguments"], headers={"Content-Type": "application/json"}
                )
                done = {"type": "function_call_output", "call_id": ask["call_id"], "output": result.text}
                conversation.append(done)
                trajectory.append(done)
            if not asks and any(item["type"] == "message" for item in output):
                break
        merged = {**replies[-1].json(), "output": trajectory}
        verified = env.post("/verify", json={**row, "response": merged})
        verified.raise_for_status()
        return verified.json(), replies


@pytest.fixture(scope="module")
def env_url():
    with BackgroundServer(counter_env.make_app()) as server:
        yield server.url


@pytest.fixture(scope="module")
def agent_url():
    with BackgroundServer(counter_agent.make_app()) as server:
        yield server.url


def call(agent_url: str, body: dict, **kwargs) -> httpx.Response:
    kwargs.setdefault("timeout", 10)
    return httpx.post(f"{agent_url}/v1/responses", json=body, trust_env=False, **kwargs)


def assert_full_responses_object(reply: dict) -> None:
    for key in ("id", "created_at", "model", "object", "output", "parallel_tool_calls", "tool_choice", "tools"):
        assert key in reply, key
    assert reply["object"] == "response"
    assert isinstance(reply["created_at"], (int, float))
    usage = reply["usage"]
    assert USAGE_KEYS <= set(usage)
    ints = [
        usage["input_tokens"],
        usage["output_tokens"],
        usage["total_tokens"],
        usage["input_tokens_details"]["cached_tokens"],
        usage["output_tokens_details"]["reasoning_tokens"],
    ]
    assert all(isinstance(n, int) and n >= 0 for n in ints)
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_tokens_details"]["cached_tokens"] <= usage["input_tokens"]


@pytest.mark.parametrize("row", TASKS, ids=[row["responses_create_params"]["input"][0]["content"] for row in TASKS])
def test_it_solves_every_counter_task_end_to_end_against_the_env(env_url, agent_url, row):
    result, replies = drive(env_url, agent_url, row)
    assert result["reward"] == 1.0
    assert len(replies) == 3, "increments, then get_counter_value, then the answer"
    kinds = [(item["type"], item.get("name")) for item in result["response"]["output"]]
    assert kinds == [
        ("function_call", "increment_counter"),
        ("function_call", "increment_counter"),
        ("function_call_output", None),
        ("function_call_output", None),
        ("function_call", "get_counter_value"),
        ("function_call_output", None),
        ("message", None),
    ]
    final = result["response"]["output"][-1]
    assert final["content"][0]["text"] == f"The count is {row['expected_count']}."


def test_its_first_reply_asks_for_both_increments_as_unpaired_calls(agent_url):
    row = TASKS[1]  # add 4 then add 5
    output = call(agent_url, row["responses_create_params"]).json()["output"]
    assert [item["type"] for item in output] == ["function_call", "function_call"]
    assert [item["name"] for item in output] == ["increment_counter", "increment_counter"]
    assert [json.loads(item["arguments"]) for item in output] == [{"count": 4}, {"count": 5}]
    assert all(isinstance(item["arguments"], str) for item in output), "arguments is a JSON string"
    call_ids = [item["call_id"] for item in output]
    assert len(set(call_ids)) == 2 and all(re.fullmatch(r"call_[0-9a-f]+", c) for c in call_ids)


def test_call_ids_are_fresh_on_every_call(agent_url):
    params = TASKS[0]["responses_create_params"]
    first = {item["call_id"] for item in call(agent_url, params).json()["output"]}
    second = {item["call_id"] for item in call(agent_url, params).json()["output"]}
    assert not first & second


def test_every_reply_is_a_full_responses_object_with_complete_usage(env_url, agent_url):
    _, replies = drive(env_url, agent_url, TASKS[2])
    for reply in replies:
        assert_full_responses_object(reply.json())
    usages = [reply.json()["usage"] for reply in replies]
    assert usages[0]["input_tokens_details"]["cached_tokens"] == 0
    assert usages[1]["input_tokens_details"]["cached_tokens"] > 0, "later calls re-read a cached prefix"
    assert usages[0]["input_tokens"] < usages[1]["input_tokens"] < usages[2]["input_tokens"]


def test_it_echoes_the_requests_tools_and_model(agent_url):
    params = {**TASKS[0]["responses_create_params"], "model": "my-model", "tool_choice": "required"}
    reply = call(agent_url, params).json()
    assert reply["tools"] == params["tools"]
    assert reply["model"] == "my-model" and reply["tool_choice"] == "required"


def test_it_reads_input_given_as_a_string(agent_url):
    params = {**TASKS[0]["responses_create_params"], "input": "add 2 then add 3 then get the count"}
    output = call(agent_url, params).json()["output"]
    assert [json.loads(item["arguments"]) for item in output] == [{"count": 2}, {"count": 3}]


def test_it_reads_content_given_as_a_list_of_parts(agent_url):
    message = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "add 7 then add 1 then get the count"}],
    }
    output = call(agent_url, {"input": [message], "tools": []}).json()["output"]
    assert [json.loads(item["arguments"]) for item in output] == [{"count": 7}, {"count": 1}]


@pytest.mark.parametrize(
    "params",
    [
        {"input": "write me a poem"},
        {"input": []},
        {"input": [{"type": "message", "role": "user", "content": "add 3 please"}]},
        {},
    ],
)
def test_it_answers_a_task_it_cannot_parse_with_a_final_message(agent_url, params):
    reply = call(agent_url, params)
    assert reply.status_code == 200
    (message,) = reply.json()["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert "cannot parse" in message["content"][0]["text"]
    assert_full_responses_object(reply.json())


def test_it_says_so_when_the_count_result_is_unreadable(agent_url):
    params = TASKS[0]["responses_create_params"]
    conversation = list(params["input"])
    for _ in range(2):
        output = call(agent_url, {**params, "input": conversation}).json()["output"]
        conversation += output
        conversation += [
            {"type": "function_call_output", "call_id": item["call_id"], "output": "boom"} for item in output
        ]
    text = call(agent_url, {**params, "input": conversation}).json()["output"][0]["content"][0]["text"]
    assert "could not read the count" in text and "boom" in text


def test_a_body_that_is_not_a_json_object_is_a_400(agent_url):
    reply = httpx.post(f"{agent_url}/v1/responses", content=b"[1, 2]", trust_env=False)
    assert reply.status_code == 400
    assert "JSON object" in reply.json()["error"]["message"]


def test_it_sets_an_agent_session_cookie_and_counts_calls_while_it_is_echoed(env_url, agent_url):
    _, replies = drive(env_url, agent_url, TASKS[0])
    assert replies[0].headers["set-cookie"].startswith(f"{counter_agent.COOKIE_NAME}=")
    assert "set-cookie" not in replies[1].headers, "set once per rollout"
    assert [reply.headers[counter_agent.CALL_HEADER] for reply in replies] == ["1", "2", "3"]
    assert [reply.headers[counter_agent.COOKIES_HEADER] for reply in replies] == ["", "agent_session", "agent_session"]


def test_without_its_cookie_every_call_counts_as_a_first_call(agent_url):
    params = TASKS[0]["responses_create_params"]
    for _ in range(2):
        reply = call(agent_url, params)
        assert reply.headers[counter_agent.CALL_HEADER] == "1"
        assert "set-cookie" in reply.headers


def test_an_unknown_path_is_a_404(agent_url):
    reply = httpx.post(f"{agent_url}/v1/chat/completions", json={}, trust_env=False)
    assert reply.status_code == 404 and reply.json() == {"detail": "Not Found"}


def test_the_latency_option_delays_every_call():
    with BackgroundServer(counter_agent.make_app(latency_ms=150)) as server:
        started = time.perf_counter()
        call(server.url, TASKS[0]["responses_create_params"]).raise_for_status()
        assert time.perf_counter() - started >= 0.15


@pytest.mark.slow
def test_it_starts_with_one_command_and_prints_its_address():
    proc = subprocess.Popen(
        [sys.executable, "-m", "gymweb.examples.counter_agent", "--port", "0", "--latency-ms", "1"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("counter agent listening on http://127.0.0.1:"), line
        reply = call(line.rsplit(" ", 1)[1], TASKS[0]["responses_create_params"])
        assert reply.json()["output"][0]["name"] == "increment_counter"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_a_latency_range_draws_each_calls_delay_between_its_bounds(monkeypatch):
    assert counter_agent.parse_latency_ms("500-1500") == (500.0, 1500.0)
    assert counter_agent.parse_latency_ms("50") == (50.0, 50.0)
    with pytest.raises(ValueError):
        counter_agent.parse_latency_ms("900-100")
    draws = []

    def drawn_at_the_top(low, high):
        draws.append((low, high))
        return high

    # The draw is observed rather than timed: an upper bound on wall time fails on a loaded machine.
    monkeypatch.setattr(counter_agent.random, "uniform", drawn_at_the_top)
    with BackgroundServer(counter_agent.make_app(latency_ms=(100.0, 200.0))) as server:
        started = time.perf_counter()
        call(server.url, TASKS[0]["responses_create_params"]).raise_for_status()
        assert time.perf_counter() - started >= 0.2
    assert draws == [(0.1, 0.2)]


def test_a_reset_task_asks_for_reset_counter_and_reports_its_error_without_a_count():
    task = [{"type": "message", "role": "user", "content": "add 5 then reset the counter then get the count"}]
    first = counter_agent.decide(task)
    assert [c["name"] for c in first] == ["increment_counter"]
    done = (
        task + first + [{"type": "function_call_output", "call_id": first[0]["call_id"], "output": '{"success":true}'}]
    )
    second = counter_agent.decide(done)
    assert [c["name"] for c in second] == ["reset_counter"]
    failed = (
        done
        + second
        + [{"type": "function_call_output", "call_id": second[0]["call_id"], "output": '{"detail":"Not Found"}'}]
    )
    final = counter_agent.decide(failed)
    text = final[0]["content"][0]["text"]
    assert final[0]["type"] == "message" and "reset_counter tool answered an error" in text and "Not Found" in text


def test_a_word_it_does_not_know_is_left_out_of_the_plan():
    task = [{"type": "message", "role": "user", "content": "add 4 then subtract 1 then get the count"}]
    assert [json.loads(c["arguments"]) for c in counter_agent.decide(task)] == [{"count": 4}]


def test_a_task_that_asks_for_partial_usage_gets_an_invalid_usage_object(agent_url):
    params = {"input": "add 3 then get the count and report partial usage"}
    reply = call(agent_url, params).json()
    assert reply["usage"] == {"input_tokens": reply["usage"]["input_tokens"]}
    assert call(agent_url, {"input": "add 3 then get the count"}).json()["usage"]["total_tokens"] > 0


def test_a_caller_that_gives_up_during_the_latency_leaves_no_traceback(caplog):
    # A cancelled run drops its calls to the agent mid-latency; the example agent must stay quiet.
    with BackgroundServer(counter_agent.make_app(latency_ms=400)) as server:
        with pytest.raises(httpx.ReadTimeout):
            call(server.url, {"input": "add 1 then add 2 then get the count", "model": "m"}, timeout=0.1)
        time.sleep(0.6)  # the handler's latency ends with nobody reading
        assert call(server.url, {"input": "add 1 then add 2 then get the count", "model": "m"}).status_code == 200
    errors = [r for r in caplog.records if r.levelno >= 40 or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]
