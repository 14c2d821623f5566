"""Reverifying NeMo Gym's runA (imported from its three files) does what NeMo Gym 0.7.0's ``gym eval
reverify`` does (``nemo_gym/rollout_reverification.py``): ``GET /reverify_mode`` first (the counter
answers ``unknown``: refused unless forced, then ``unsafe_``), then one ``POST /verify`` per success
with the materialised input row and the scored ``response`` (``_build_verify_payload``), no
``/seed_session``, no tool calls and no cookie. NeMo Gym's counter env (``example_session_state_mgmt``)
scores a verify whose session it never seeded 0.0, so NeMo Gym's own reverify of runA against it gives
0.0 for all 80 rows, and so does gymweb's; the output rows are the env's replies as they came plus
the keys NeMo Gym's reverify sets."""

from __future__ import annotations

import json
import uuid

import orjson
import pytest
from aiohttp import web
from django.core.management import CommandError, call_command

from gymweb.examples._serve import BackgroundServer
from rollouts.models import Run

pytestmark = pytest.mark.django_db

RUN_A = "eval_0.7.0/runA"


def _nemo_gym_counter():
    """NeMo Gym's counter resources server as its code behaves: Starlette's session middleware gives a
    request without a session cookie a new session id; ``/verify`` rewards 1.0 only when the
    session's counter equals ``expected_count`` and answers its ``BaseVerifyResponse`` dump (the
    task's other fields are not in it); ``/reverify_mode`` is the default ``unknown``."""
    counters: dict[str, int] = {}
    seen: list[tuple[str, str, dict | None]] = []

    def session(request):
        sid = request.cookies.get("session") or uuid.uuid4().hex
        return sid

    async def record(request):
        body = await request.json() if request.can_read_body else None
        seen.append((request.path, request.headers.get("Cookie", ""), body))
        return body

    async def reverify_mode(request):
        await record(request)
        return web.json_response("unknown")

    async def seed(request):
        body = await record(request)
        sid = session(request)
        counters.setdefault(sid, body["initial_count"])
        response = web.json_response({})
        response.set_cookie("session", sid)
        return response

    async def verify(request):
        body = await record(request)
        sid = session(request)
        reward = float(body["expected_count"] == counters[sid]) if sid in counters else 0.0
        reply = {
            "responses_create_params": body["responses_create_params"],
            "response": body["response"],
            "reward": reward,
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
        }
        response = web.json_response(reply)
        response.set_cookie("session", sid)
        return response

    app = web.Application()
    app.router.add_get("/reverify_mode", reverify_mode)
    app.router.add_post("/seed_session", seed)
    app.router.add_post("/verify", verify)
    return app, seen


def _lines(path):
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def _reverify(folder, out, env_url, *extra):
    call_command(
        "reverify",
        "--inputs",
        str(folder / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(folder / "rollouts.jsonl"),
        "--output",
        str(out),
        "--env-url",
        env_url,
        *extra,
    )


def test_reverifying_run_a_sends_and_writes_what_nemo_gyms_reverify_does(shared_data, tmp_path, capsys):
    folder = shared_data / RUN_A
    inputs = {}
    for line in _lines(folder / "rollouts_materialized_inputs.jsonl"):
        row = orjson.loads(line)
        inputs[(row["_ng_task_index"], row["_ng_rollout_index"])] = row
    recorded = {
        (r["_ng_task_index"], r["_ng_rollout_index"]): r for r in map(orjson.loads, _lines(folder / "rollouts.jsonl"))
    }
    app, seen = _nemo_gym_counter()
    with BackgroundServer(app) as server:
        with pytest.raises(CommandError, match="reverify_mode=unknown"):
            _reverify(folder, tmp_path / "out.jsonl", server.url)
        assert [path for path, _, _ in seen] == ["/reverify_mode"]
        assert not Run.objects.filter(reverified_from__isnull=False).exists()
        seen.clear()
        _reverify(folder, tmp_path / "out.jsonl", server.url, "--force")
    assert "80 reverified, 0 /verify failure(s)" in capsys.readouterr().out

    # what was sent: the mode, then one /verify per success, nothing else, never a cookie
    assert seen[0][0] == "/reverify_mode"
    verifies = seen[1:]
    assert len(verifies) == 80 and {path for path, _, _ in verifies} == {"/verify"}
    assert all(cookie == "" for _, cookie, _ in seen)
    for _, _, body in verifies:
        key = (body["_ng_task_index"], body["_ng_rollout_index"])
        # NeMo Gym's _build_verify_payload: the materialised input row | {"response": the rollout's}
        assert orjson.dumps(body) == orjson.dumps(inputs[key] | {"response": recorded[key]["response"]})

    # what was written: unsafe_ (forced), every reward 0.0, each row the env's reply with the keys
    # NeMo Gym's reverify sets (the indices and agent_ref, from the input row)
    assert not (tmp_path / "out.jsonl").exists()
    lines = _lines(tmp_path / "unsafe_out.jsonl")
    assert len(lines) == 80
    replies = {(b["_ng_task_index"], b["_ng_rollout_index"]): b for _, _, b in verifies}
    for line in lines:
        row = orjson.loads(line)
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        body = replies[key]
        nemo_gym = {
            "responses_create_params": body["responses_create_params"],
            "response": body["response"],
            "reward": 0.0,
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
            "_ng_task_index": key[0],
            "_ng_rollout_index": key[1],
            "agent_ref": inputs[key]["agent_ref"],
        }
        assert line == orjson.dumps(nemo_gym)
    # the recorded run had mixed rewards; the reverified one has none left (the session is gone)
    assert {r["reward"] for r in recorded.values()} == {0.0, 1.0}


def test_the_example_counter_env_gives_the_same_rewards_as_nemo_gyms_counter(shared_data, counter_env_url, tmp_path):
    """gymweb's example counter env, like NeMo Gym's, cannot see the rollout's session on a
    reverify: every reward of runA comes back 0.0 (the rewards NeMo Gym's reverify gets)."""
    folder = shared_data / RUN_A
    _reverify(folder, tmp_path / "out.jsonl", counter_env_url, "--force")
    rows = [json.loads(line) for line in _lines(tmp_path / "unsafe_out.jsonl")]
    assert len(rows) == 80 and {r["reward"] for r in rows} == {0.0}


def test_keys_of_the_input_row_nemo_gyms_reverify_copies_are_in_the_reverified_row(shared_data, tmp_path):
    """NeMo Gym's reverify copies ``_ng_environment_server``, ``task_source``, ``skills_ref`` and
    ``_ng_atif_provenance`` from the materialised input row into the env's reply, after the indices
    and ``agent_ref``; a value the env echoed is replaced by the row's and keeps its place."""
    folder = shared_data / RUN_A
    inputs = tmp_path / "rollouts_materialized_inputs.jsonl"
    rows = [orjson.loads(line) for line in _lines(folder / "rollouts_materialized_inputs.jsonl")]
    for row in rows:
        row["_ng_environment_server"] = "counter_environment_server"
        row["task_source"] = "counter"
    inputs.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / "rollouts.jsonl").write_bytes((folder / "rollouts.jsonl").read_bytes())
    app, seen = _nemo_gym_counter()
    with BackgroundServer(app) as server:
        _reverify(tmp_path, tmp_path / "out.jsonl", server.url, "--force")
    by_key = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in rows}
    lines = _lines(tmp_path / "unsafe_out.jsonl")
    assert len(lines) == 80
    for line in lines:
        row = orjson.loads(line)
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        assert list(row)[-5:] == [
            "_ng_task_index",
            "_ng_rollout_index",
            "agent_ref",
            "_ng_environment_server",
            "task_source",
        ]
        assert row["agent_ref"] == by_key[key]["agent_ref"]
        assert (row["_ng_environment_server"], row["task_source"]) == ("counter_environment_server", "counter")


def test_an_echoed_environment_server_is_replaced_by_the_input_rows_in_its_place(shared_data, tmp_path):
    folder = shared_data / RUN_A
    rows = [orjson.loads(line) for line in _lines(folder / "rollouts_materialized_inputs.jsonl")]
    for row in rows:
        row["_ng_environment_server"] = "from_the_row"
    (tmp_path / "rollouts_materialized_inputs.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / "rollouts.jsonl").write_bytes((folder / "rollouts.jsonl").read_bytes())

    async def reverify_mode(request):
        return web.json_response("stateless")

    async def verify(request):
        body = await request.json()
        rest = {k: v for k, v in body.items() if k != "_ng_environment_server"}
        return web.json_response({"_ng_environment_server": "echoed", **rest, "reward": 0.5})

    app = web.Application()
    app.router.add_get("/reverify_mode", reverify_mode)
    app.router.add_post("/verify", verify)
    with BackgroundServer(app) as server:
        _reverify(tmp_path, tmp_path / "out.jsonl", server.url)
    rows_out = [orjson.loads(line) for line in _lines(tmp_path / "out.jsonl")]
    assert len(rows_out) == 80
    for row in rows_out:
        assert list(row)[0] == "_ng_environment_server" and row["_ng_environment_server"] == "from_the_row"
