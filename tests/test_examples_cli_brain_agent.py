"""The command-line-brain agent (`gymweb/examples/cli_brain_agent.py`) with `gymweb/examples/fake_brain.py` as its model."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gymweb.examples import cli_brain_agent, counter_env
from gymweb.examples._serve import BackgroundServer
from tests.test_examples_counter_agent import TASKS, assert_full_responses_object, drive

REPO = Path(__file__).resolve().parents[1]
FAKE_BRAIN = REPO / "gymweb" / "examples" / "fake_brain.py"
# Runs the stand-in as a script path, so it works whatever the server's working directory is.
FAKE_BRAIN_CMD = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_BRAIN))}"


def python_cmd(code: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


@pytest.fixture(scope="module")
def env_url():
    with BackgroundServer(counter_env.make_app()) as server:
        yield server.url


@pytest.fixture(scope="module")
def agent_url():
    with BackgroundServer(cli_brain_agent.make_app(brain_cmd=FAKE_BRAIN_CMD, timeout_s=60)) as server:
        yield server.url


def call_with_brain(brain_cmd: str, params: dict, timeout_s: float = 30) -> httpx.Response:
    with BackgroundServer(cli_brain_agent.make_app(brain_cmd=brain_cmd, timeout_s=timeout_s)) as server:
        return httpx.post(f"{server.url}/v1/responses", json=params, timeout=30, trust_env=False)


@pytest.mark.parametrize("row", TASKS[:2], ids=["add 1 then add 2", "add 4 then add 5"])
def test_with_the_fake_brain_it_solves_a_counter_task_end_to_end(env_url, agent_url, row):
    result, replies = drive(env_url, agent_url, row)
    assert result["reward"] == 1.0
    assert result["response"]["output"][-1]["content"][0]["text"] == f"The count is {row['expected_count']}."
    for reply in replies:
        assert_full_responses_object(reply.json())
    first_asks = replies[0].json()["output"]
    assert [json.loads(item["arguments"]) for item in first_asks] == [
        {"count": int(n)} for n in re.findall(r"add (\d+)", row["responses_create_params"]["input"][0]["content"])
    ]


def test_a_failing_brain_command_is_a_502_with_its_exit_status_and_stderr():
    reply = call_with_brain(
        python_cmd("import sys; sys.stderr.write('not logged in'); sys.exit(3)"), TASKS[0]["responses_create_params"]
    )
    assert reply.status_code == 502
    message = reply.json()["error"]["message"]
    assert "exited with status 3" in message and "not logged in" in message


def test_a_missing_brain_command_is_a_502_naming_it():
    reply = call_with_brain("no-such-brain-command-xyz -p {prompt}", TASKS[0]["responses_create_params"])
    assert reply.status_code == 502
    message = reply.json()["error"]["message"]
    assert "not found" in message and "no-such-brain-command-xyz" in message and "AGENT_BRAIN_CMD" in message


def test_a_brain_that_runs_too_long_is_a_502_naming_the_timeout_knob():
    reply = call_with_brain(
        python_cmd("import time; time.sleep(30)"), TASKS[0]["responses_create_params"], timeout_s=0.5
    )
    assert reply.status_code == 502
    message = reply.json()["error"]["message"]
    assert "timed out after 0.5 s" in message and "AGENT_BRAIN_TIMEOUT_S" in message


@pytest.mark.parametrize(
    "stdout, expected",
    [
        ("plain words", "not a JSON envelope"),
        (json.dumps({"usage": {}}), "no string 'result'"),
        (json.dumps({"result": "I think we should add"}), "neither"),
        (json.dumps({"result": "rate limited", "is_error": True}), "reported an error"),
    ],
)
def test_a_brain_without_a_usable_decision_is_a_502_saying_what_was_wrong(stdout, expected):
    reply = call_with_brain(python_cmd(f"print({stdout!r})"), TASKS[0]["responses_create_params"])
    assert reply.status_code == 502
    assert expected in reply.json()["error"]["message"]


def test_a_decision_in_code_fences_is_accepted():
    fenced = json.dumps({"result": '```json\n{"final": "done"}\n```', "usage": {"input_tokens": 3}})
    reply = call_with_brain(python_cmd(f"print({fenced!r})"), TASKS[0]["responses_create_params"])
    assert reply.status_code == 200
    assert reply.json()["output"][0]["content"][0]["text"] == "done"


def test_usage_counts_the_clis_cache_tokens_as_cached_input():
    envelope = json.dumps(
        {
            "result": '{"final": "ok"}',
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 5,
                "output_tokens": 7,
            },
        }
    )
    usage = call_with_brain(python_cmd(f"print({envelope!r})"), {"input": "hi"}).json()["usage"]
    assert usage == {
        "input_tokens": 115,
        "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 122,
    }


def test_the_prompt_reaches_the_brain_as_one_argument_and_the_model_is_expanded(monkeypatch):
    monkeypatch.setenv("CLAUDE_MODEL", "sonnet")
    argv = cli_brain_agent.build_argv(
        "claude -p {prompt} --output-format json --model $CLAUDE_MODEL", "a prompt with spaces and $HOME", "haiku"
    )
    assert argv == ["claude", "-p", "a prompt with spaces and $HOME", "--output-format", "json", "--model", "sonnet"]


def test_a_command_without_a_prompt_placeholder_gets_claudes_flags_appended(monkeypatch):
    monkeypatch.delenv("CLAUDE_MODEL", raising=False)
    argv = cli_brain_agent.build_argv("python -m gymweb.examples.fake_brain", "P", "haiku")
    assert argv == [
        "python",
        "-m",
        "gymweb.examples.fake_brain",
        "-p",
        "P",
        "--output-format",
        "json",
        "--model",
        "haiku",
    ]


def test_the_rendered_prompt_shows_the_conversation_and_the_tools():
    items = [
        {"role": "user", "content": "add 1 then add 2 then get the count"},
        {"type": "function_call", "call_id": "c1", "name": "increment_counter", "arguments": '{"count": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"success":true}'},
    ]
    assert cli_brain_agent.render(items).splitlines() == [
        "[user] add 1 then add 2 then get the count",
        '[you asked for] increment_counter({"count": 1})',
        '[tool result] {"success":true}',
    ]


def test_the_fake_brain_has_claudes_command_line_shape():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymweb.examples.fake_brain",
            "-p",
            "[user] add 2 then add 9 then get the count",
            "--output-format",
            "json",
            "--model",
            "haiku",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    envelope = json.loads(done.stdout)
    assert envelope["type"] == "result" and envelope["is_error"] is False
    assert set(envelope["usage"]) >= {"input_tokens", "output_tokens"}
    assert json.loads(envelope["result"]) == {
        "tool_calls": [
            {"name": "increment_counter", "arguments": {"count": 2}},
            {"name": "increment_counter", "arguments": {"count": 9}},
        ]
    }


@pytest.mark.slow
def test_it_starts_with_one_command_and_prints_its_address():
    env = {"AGENT_BRAIN_CMD": FAKE_BRAIN_CMD, "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gymweb.examples.cli_brain_agent", "--port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("cli brain agent listening on http://127.0.0.1:"), line
        reply = httpx.post(
            f"{line.rsplit(' ', 1)[1]}/v1/responses",
            json=TASKS[0]["responses_create_params"],
            timeout=30,
            trust_env=False,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"][0]["name"] == "increment_counter"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()
        proc.stderr.close()
