"""The example counter env (`gymweb/examples/counter_env.py`) over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import httpx
import pytest

from gymweb.examples._serve import BackgroundServer
from gymweb.examples.counter_env import COOKIE_NAME, make_app

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "gymweb" / "examples" / "data" / "counter_tasks.jsonl"


def load_tasks() -> list[dict]:
    return [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def env_url():
    with BackgroundServer(make_app()) as server:
        yield server.url


@pytest.fixture
def env(env_url):
    # One client = one cookie jar = one rollout's view of the env.
    with httpx.Client(base_url=env_url, timeout=10, trust_env=False) as client:
        yield client


def set_cookie_value(response: httpx.Response) -> str:
    headers = response.headers.get_list("set-cookie")
    assert len(headers) == 1, headers
    name, _, rest = headers[0].partition("=")
    assert name == COOKIE_NAME
    return rest.split(";")[0]


def verify_body(row: dict, text: str = "The count is 6.") -> dict:
    response = {
        "id": "resp_1",
        "created_at": 1.0,
        "model": "m",
        "object": "response",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
    }
    return {**row, "response": response}


def test_the_project_carries_its_own_copy_of_the_five_counter_tasks():
    rows = load_tasks()
    assert len(rows) == 5
    for row in rows:
        assert {"responses_create_params", "initial_count", "expected_count"} <= set(row)
        names = [tool["name"] for tool in row["responses_create_params"]["tools"]]
        assert names == ["increment_counter", "get_counter_value"]


def test_seeding_starts_the_counter_at_the_rows_initial_count(env):
    row = load_tasks()[0]
    seed = env.post("/seed_session", json=row)
    assert seed.status_code == 200
    assert seed.json() == {}
    assert env.post("/get_counter_value", json={}).json() == {"count": row["initial_count"]}


def test_seeding_without_an_initial_count_starts_at_zero(env):
    env.post("/seed_session", json={"responses_create_params": {"input": "hi"}}).raise_for_status()
    assert env.post("/get_counter_value", json={}).json() == {"count": 0}


def test_increments_add_to_the_counter_and_answer_like_nemo_gym(env):
    env.post("/seed_session", json={"initial_count": 3}).raise_for_status()
    first = env.post("/increment_counter", json={"count": 1})
    assert first.status_code == 200
    assert first.text == '{"success":true}'  # FastAPI's compact JSON, as in NeMo Gym's rollouts
    env.post("/increment_counter", json={"count": 2}).raise_for_status()
    assert env.post("/get_counter_value", json={}).text == '{"count":6}'


def test_seeding_sets_an_httponly_session_cookie_for_the_whole_site(env):
    seed = env.post("/seed_session", json={"initial_count": 1})
    header = seed.headers["set-cookie"]
    assert header.startswith(f"{COOKIE_NAME}=")
    assert "HttpOnly" in header and "Path=/" in header


def test_it_re_sets_the_session_cookie_on_every_reply_tool_calls_included(env):
    values = [set_cookie_value(env.post("/seed_session", json={"initial_count": 3}))]
    values.append(set_cookie_value(env.post("/increment_counter", json={"count": 3})))
    values.append(set_cookie_value(env.post("/get_counter_value", json={})))
    values.append(
        set_cookie_value(env.post("/verify", json=verify_body({"expected_count": 6, "responses_create_params": {}})))
    )
    assert len(set(values)) == len(values), "every reply re-signs the cookie with a new value"
    assert len({value.split(".")[0] for value in values}) == 1, "...for the same session"


def test_every_cookie_value_it_issued_stays_valid(env_url):
    with httpx.Client(base_url=env_url, trust_env=False) as client:
        first = set_cookie_value(client.post("/seed_session", json={"initial_count": 5}))
        client.post("/increment_counter", json={"count": 1}).raise_for_status()
    stale = httpx.post(f"{env_url}/get_counter_value", json={}, headers={"Cookie": f"{COOKIE_NAME}={first}"})
    assert stale.json() == {"count": 6}


def test_it_keeps_sessions_apart_by_cookie(env_url):
    with httpx.Client(base_url=env_url, trust_env=False) as a, httpx.Client(base_url=env_url, trust_env=False) as b:
        a.post("/seed_session", json={"initial_count": 10}).raise_for_status()
        b.post("/seed_session", json={"initial_count": 100}).raise_for_status()
        a.post("/increment_counter", json={"count": 1}).raise_for_status()
        b.post("/increment_counter", json={"count": 7}).raise_for_status()
        assert a.post("/get_counter_value", json={}).json() == {"count": 11}
        assert b.post("/get_counter_value", json={}).json() == {"count": 107}


def test_seeding_again_starts_a_fresh_session(env):
    env.post("/seed_session", json={"initial_count": 1}).raise_for_status()
    env.post("/increment_counter", json={"count": 5}).raise_for_status()
    env.post("/seed_session", json={"initial_count": 2}).raise_for_status()
    assert env.post("/get_counter_value", json={}).json() == {"count": 2}


def test_a_tool_call_without_a_session_cookie_is_a_400_naming_the_cookie(env):
    reply = env.post("/increment_counter", json={"count": 1})
    assert reply.status_code == 400
    assert "no session" in reply.json()["detail"] and COOKIE_NAME in reply.json()["detail"]
    assert env.post("/get_counter_value", json={}).status_code == 400


def test_an_unknown_session_cookie_is_a_400(env_url):
    reply = httpx.post(f"{env_url}/get_counter_value", json={}, headers={"Cookie": f"{COOKIE_NAME}=0123456789abcdef.1"})
    assert reply.status_code == 400
    assert "unknown session" in reply.json()["detail"]


@pytest.mark.parametrize("body", [b'{"count": "two"}', b"{}", b"[1]", b"{not json", b'{"count": 1.5}'])
def test_bad_arguments_are_a_422_with_fastapi_style_detail(env, body):
    env.post("/seed_session", json={"initial_count": 0}).raise_for_status()
    reply = env.post("/increment_counter", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 422
    detail = reply.json()["detail"]
    assert isinstance(detail, list) and detail[0]["loc"][0] == "body" and detail[0]["msg"]
    assert env.post("/get_counter_value", json={}).json() == {"count": 0}, "nothing was added"


def test_verify_rewards_1_when_the_counter_equals_expected_count_and_echoes_the_body(env):
    row = load_tasks()[0]  # initial 3, expected 6
    env.post("/seed_session", json=row).raise_for_status()
    env.post("/increment_counter", json={"count": 1}).raise_for_status()
    env.post("/increment_counter", json={"count": 2}).raise_for_status()
    body = verify_body(row)
    reply = env.post("/verify", json=body)
    assert reply.status_code == 200
    result = reply.json()
    assert result["reward"] == 1.0 and isinstance(result["reward"], float)
    assert {k: v for k, v in result.items() if k != "reward"} == body


def test_verify_rewards_0_when_the_counter_differs(env):
    row = load_tasks()[0]
    env.post("/seed_session", json=row).raise_for_status()
    env.post("/increment_counter", json={"count": 1}).raise_for_status()
    assert env.post("/verify", json=verify_body(row)).json()["reward"] == 0.0


def test_verify_judges_the_session_counter_not_the_answer_text(env):
    row = load_tasks()[0]
    env.post("/seed_session", json=row).raise_for_status()
    env.post("/increment_counter", json={"count": 3}).raise_for_status()
    assert env.post("/verify", json=verify_body(row, text="no idea")).json()["reward"] == 1.0


def test_verify_replaces_a_stale_reward_in_the_row(env):
    row = {**load_tasks()[0], "reward": 1.0}
    env.post("/seed_session", json=row).raise_for_status()
    assert env.post("/verify", json=verify_body(row)).json()["reward"] == 0.0


def test_verify_without_a_session_rewards_0_like_nemo_gym(env):
    reply = env.post("/verify", json=verify_body(load_tasks()[0]))
    assert reply.status_code == 200
    assert reply.json()["reward"] == 0.0
    assert "no session" in reply.json()["failure_reason"]


def test_verify_without_expected_count_is_a_422(env):
    env.post("/seed_session", json={}).raise_for_status()
    reply = env.post("/verify", json=verify_body({"responses_create_params": {}}))
    assert reply.status_code == 422
    assert reply.json()["detail"][0]["loc"] == ["body", "expected_count"]


def test_an_unknown_tool_is_a_404_with_fastapis_text(env):
    env.post("/seed_session", json={}).raise_for_status()
    reply = env.post("/reset_counter", json={})
    assert reply.status_code == 404
    assert reply.text == '{"detail":"Not Found"}'


def test_a_known_route_with_the_wrong_method_is_a_405(env):
    reply = env.get("/verify")
    assert reply.status_code == 405
    assert reply.json() == {"detail": "Method Not Allowed"}


def test_it_answers_liveness_on_the_root(env):
    assert env.get("/").json() == {"status": "ok"}


def test_aggregate_metrics_has_nemo_gyms_shape(env):
    usage = {
        "input_tokens": 10,
        "output_tokens": 4,
        "total_tokens": 14,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {"usage": usage}},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "response": {"usage": usage}},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0, "response": {"usage": usage}},
    ]
    reply = env.post("/aggregate_metrics", json={"verify_responses": rows})
    assert reply.status_code == 200
    result = reply.json()
    assert list(result) == [
        "group_level_metrics",
        "agent_metrics",
        "key_metrics",
        "perf_summary",
        "repeat_level_metrics",
    ]
    first, second = result["group_level_metrics"]
    assert first["_ng_task_index"] == 0 and second["_ng_task_index"] == 1
    assert first["mean/reward"] == 0.5 and first["max/reward"] == 1.0 and first["min/reward"] == 0.0
    assert first["median/reward"] == 0.5 and first["std/reward"] == pytest.approx(0.7071067811865476)
    assert second["std/reward"] == 0.0, "std of one value is 0, as NeMo Gym reports it"
    assert first["mean/input_tokens"] == 10
    agent = result["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(2 / 3)
    assert agent["std/reward"] == pytest.approx(0.5773502691896257)  # ddof=1
    assert list(agent)[:4] == ["mean/reward", "mean/input_tokens", "mean/output_tokens", "mean/total_tokens"]
    assert result["key_metrics"] == {k: v for k, v in agent.items() if k.startswith("mean/")}
    assert agent["num_repeats"] == 2 and result["perf_summary"] is None
    assert [r["_ng_rollout_index"] for r in result["repeat_level_metrics"]] == [0, 1]
    assert first["rollout_infos"][1] == {
        "rollout_id": "0:1",
        "_ng_task_index": 0,
        "_ng_rollout_index": 1,
        "reward": 0.0,
        "input_tokens": 10,
        "output_tokens": 4,
        "total_tokens": 14,
    }


def test_aggregate_metrics_of_no_rows_is_empty(env):
    reply = env.post("/aggregate_metrics", json={"verify_responses": []})
    assert reply.json() == {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }


def test_aggregate_metrics_can_be_left_out_and_then_answers_404():
    with BackgroundServer(make_app(aggregate_metrics_route=False)) as server:
        reply = httpx.post(f"{server.url}/aggregate_metrics", json={"verify_responses": []}, trust_env=False)
    assert reply.status_code == 404


@pytest.mark.slow
def test_it_serves_thousands_of_concurrent_sessions_without_mixing_them(env_url):
    async def one(session: aiohttp.ClientSession, n: int) -> int:
        async with session.post(f"{env_url}/seed_session", json={"initial_count": n}) as r:
            cookie = r.headers["Set-Cookie"].split(";")[0]
        headers = {"Cookie": cookie}
        async with session.post(f"{env_url}/increment_counter", json={"count": n}, headers=headers) as r:
            assert r.status == 200
        async with session.post(f"{env_url}/get_counter_value", json={}, headers=headers) as r:
            return (await r.json())["count"]

    async def main() -> list[int]:
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
            return await asyncio.gather(*(one(session, n) for n in range(2000)))

    assert asyncio.run(main()) == [2 * n for n in range(2000)]


@pytest.mark.slow
def test_it_starts_with_one_command_and_prints_its_address():
    proc = subprocess.Popen(
        [sys.executable, "-m", "gymweb.examples.counter_env", "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("counter env listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]
        with httpx.Client(base_url=url, trust_env=False) as client:
            client.post("/seed_session", json={"initial_count": 4}).raise_for_status()
            assert client.post("/get_counter_value", json={}).json() == {"count": 4}
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_aggregate_metrics_takes_a_big_runs_verify_replies(env):
    # Past aiohttp's default body limit (1 MiB): a run of a few thousand rollouts sends this much.
    row = {**verify_body(load_tasks()[0]), "reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0}
    row["response"]["output"][0]["content"][0]["text"] = "x" * 4096
    rows = [{**row, "_ng_rollout_index": i} for i in range(600)]
    response = env.post("/aggregate_metrics", json={"verify_responses": rows})
    assert len(response.request.content) > 2 * 1024 * 1024
    assert response.status_code == 200, response.text[:300]
    assert response.json()["agent_metrics"]["mean/reward"] == 1.0
