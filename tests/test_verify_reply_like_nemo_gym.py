"""An env's ``/verify`` reply is accepted or refused as NeMo Gym 0.7.0's remote_agent does
(``RemoteAgentVerifyResponse.model_validate``, lax mode): the recorded corpus
(``tests/data/agent_results.json``, from the real model) gives the verdicts; a refused reply becomes a
failed attempt (``verify_failed`` in the database) written as NeMo Gym's failure row; an accepted
string or bool reward is stored as the float NeMo Gym's model makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from django.core.management import call_command

from gymweb.examples._serve import BackgroundServer
from rollouts.collection import export
from rollouts.engine.failures import FailureKind
from rollouts.engine.nemo_request import verify_refusal, verify_reward
from rollouts.models import Rollout

from .nemo_fakes import counter_tools_env

DATA = Path(__file__).parent / "data"


def _cases() -> list[dict]:
    return json.loads((DATA / "agent_results.json").read_text())["cases"]


def test_every_recorded_verify_reply_gets_nemo_gyms_verdict_and_reward():
    cases = _cases()
    refused = [c for c in cases if c["result"] is None]
    assert len(refused) >= 15 and len(cases) - len(refused) >= 20
    for case in cases:
        verdict = verify_refusal(case["reply"])
        if case["result"] is None:
            assert verdict is not None, case["case"]
        else:
            assert verdict is None, (case["case"], verdict)
            assert verify_reward(case["reply"]) == case["result"]["reward"], case["case"]


def _env(verify_reply) -> BackgroundServer:
    """``nemo_fakes.counter_tools_env`` whose ``/verify`` answers ``verify_reply(body)``."""

    async def verify(request):
        return web.json_response(verify_reply(await request.json()))

    return counter_tools_env(verify)


def _collect(agent_url, env_url, tasks, out):
    call_command(
        "collect",
        *("--agent-url", agent_url, "--env-url", env_url, "--input", str(tasks), "--output", str(out)),
        *("--no-progress", "--limit", "1", "--max-attempts", "1"),
    )


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "name, drop, fields",
    [
        ("no response", ("response",), {"reward": 1.0}),
        ("no responses_create_params", ("responses_create_params",), {"reward": 1.0}),
        ("a word reward", (), {"reward": "abc"}),
        ("mask_sample not a bool", (), {"reward": 1.0, "mask_sample": "maybe"}),
        ("failure_kind a number", (), {"reward": 1.0, "failure_kind": 3}),
    ],
)
def test_a_reply_nemo_gym_refuses_is_a_failure_row_as_its_remote_agent_writes_it(
    name, drop, fields, tmp_path, counter_agent_url, counter_tasks_path
):
    def reply(body):
        return {**{k: v for k, v in body.items() if k not in drop}, **fields}

    out = tmp_path / "rollouts.jsonl"
    with _env(reply) as env:
        _collect(counter_agent_url, env.url, counter_tasks_path, out)
    assert _lines(out) == [], name
    (line,) = _lines(tmp_path / "rollouts_failures.jsonl")
    (rollout,) = Rollout.objects.all()
    assert rollout.status == Rollout.Status.FAILED and rollout.failure_kind == FailureKind.VERIFY_FAILED
    assert rollout.terminal is False
    # NeMo Gym's words: its run() catches the ValidationError and writes pydantic's listing
    assert rollout.error.startswith("unexpected error: ValidationError: ")
    assert "validation error" in rollout.error and "for RemoteAgentVerifyResponse\n" in rollout.error
    task = json.loads(rollout.task.row_json)
    # NeMo Gym's remote_agent: run() catches the ValidationError and returns _failure_response(record, ...)
    assert line == orjson.dumps(export.failure_row(task, rollout.rollout_index, rollout.error, False))
    row = orjson.loads(line)
    assert (row["reward"], row["mask_sample"], row["failure_kind"], row["failure_reason"]) == (0.0, False, None, None)
    assert row["_ng_failure_class"] == "remote_agent_error" and "_ng_failure_terminal" not in row
    assert "_gymweb_failure_kind" not in row


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reward, expected", [("0.5", 0.5), (True, 1.0), (" 0 ", 0.0)])
def test_a_reward_nemo_gym_reads_as_a_number_is_stored_and_written_as_that_float(
    reward, expected, tmp_path, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    with _env(lambda body: {**body, "reward": reward}) as env:
        _collect(counter_agent_url, env.url, counter_tasks_path, out)
    (rollout,) = Rollout.objects.all()
    assert rollout.status == Rollout.Status.SUCCEEDED and rollout.reward == expected
    (line,) = _lines(out)
    row = orjson.loads(line)
    assert row["reward"] == expected and isinstance(row["reward"], float)
    assert list(row)[:6] == [
        "responses_create_params",
        "response",
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
    ]
    assert _lines(tmp_path / "rollouts_failures.jsonl") == []
