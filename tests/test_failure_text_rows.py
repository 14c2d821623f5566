"""When the env's ``/seed_session`` or ``/verify`` answers an error status, the env hangs past the
run bound or is not listening at ``/seed_session`` or at ``/verify`` (NeMo Gym retries its env
calls until the run bound ends the rollout, so its row names the bound; gymweb gives up after its
connection attempts and writes that row), or
the agent service fails (an error status, a redirect, a body that is not JSON, a JSON
array, an invalid Responses object, no answer in time, not running), the failures sidecar and the
results stream carry NeMo Gym 0.7.0's row byte for byte, ``error`` text included, while the
database, the pages and the API keep gymweb's own message and finer kind.

``tests/data/failure_text_rows.json`` holds the rows NeMo Gym's own ``gym eval run`` wrote for these
tasks against services failing each way (``scripts/record_failure_text_rows.py``, services in
``scripts/failing_services.py``). gymweb's ``collect`` runs the same tasks against real HTTP services
on 127.0.0.1 failing the same way, with the same bounds. The recorded rows name the recording's
ports (and the hang case its run bound); those are replaced by this test's, exactly where they
appear, before the bytes are compared."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from django.core.management import call_command
from django.urls import reverse
from django.utils.html import escape

from gymweb.examples._serve import BackgroundServer
from rollouts.collection import export
from rollouts.engine.failures import FailureKind
from rollouts.models import Rollout, Run
from rollouts.review import curated
from rollouts.tokens import create_token

from .conftest import free_port

RECORDED = json.loads((Path(__file__).parent / "data" / "failure_text_rows.json").read_text())
CASES = RECORDED["cases"]
PORTS = RECORDED["ports"]
HANG_RUN_TIMEOUT_S = 1.0  # the hang case runs with a shorter run bound than the recording's

# gymweb's finer kind for each case (kept in the database, not written to the file)
KINDS = {
    "seed 500": FailureKind.SEED_FAILED,
    "seed 404": FailureKind.SEED_FAILED,
    "seed hangs": FailureKind.ROLLOUT_TIMEOUT,
    "verify 500": FailureKind.VERIFY_FAILED,
    "verify 404": FailureKind.VERIFY_FAILED,
    "agent 500": FailureKind.AGENT_HTTP_ERROR,
    "agent 404": FailureKind.AGENT_HTTP_ERROR,
    "agent redirect": FailureKind.AGENT_REDIRECT,
    "agent not JSON": FailureKind.AGENT_BAD_JSON,
    "agent JSON array": FailureKind.AGENT_BAD_JSON,
    "agent invalid object": FailureKind.AGENT_INVALID_RESPONSE,
    "agent too slow": FailureKind.AGENT_TIMEOUT,
    "agent unreachable": FailureKind.AGENT_UNREACHABLE,
    "env unreachable": FailureKind.SEED_FAILED,
    "verify unreachable": FailureKind.VERIFY_FAILED,
}
RECORDED_LINES = (
    RECORDED["failure_lines"]
    + RECORDED["unreachable_failure_lines"]
    + RECORDED["verify_unreachable_failure_lines"]
    + RECORDED["env_unreachable_failure_lines"]
)
FINAL_REPLY = {
    "id": "resp_final",
    "object": "response",
    "created_at": 0,
    "model": "failing-agent",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "status": "completed",
}


def _answer(case: dict) -> web.Response:
    headers = {"Content-Type": case["content_type"], **case.get("headers", {})}
    return web.Response(body=case["body"].encode(), status=case["status"], headers=headers)


async def _wait(case: dict, bound_s: float) -> None:
    # long enough to pass the bound under test, short enough that the server stops soon after
    if case.get("sleep_s"):
        await asyncio.sleep(bound_s + 1.0)


def _failing_env(bound_s: float) -> BackgroundServer:
    """``scripts/failing_services.py``'s env: ``/seed_session`` and ``/verify`` answer the bytes of
    the case the task names in ``failure_case`` when it is theirs (a ``go_dark`` case then stops
    listening), else as a healthy env."""

    def route(name: str, healthy: bytes):
        async def handler(request):
            case = CASES.get((await request.json()).get("failure_case") or "", {})
            if case.get("party") != name:
                return web.Response(body=healthy, content_type="application/json")
            await _wait(case, bound_s)
            if case.get("go_dark"):  # close the listener; this connection closes after the reply
                for site in list(server._runner.sites):
                    await site.stop()
            return _answer(case)

        return handler

    app = web.Application()
    app.router.add_post("/seed_session", route("seed_session", b"{}"))
    app.router.add_post("/verify", route("verify", b'{"reward":1.0}'))
    server = BackgroundServer(app)
    return server


def _failing_agent(bound_s: float) -> BackgroundServer:
    """``scripts/failing_services.py``'s agent service: the case named in ``metadata.failure_case``
    when it is the agent's, else a final assistant message."""

    async def responses(request):
        metadata = (await request.json()).get("metadata") or {}
        case = CASES.get(metadata.get("failure_case") or "", {})
        if case.get("party") != "agent":
            return web.json_response(FINAL_REPLY)
        await _wait(case, bound_s)
        return _answer(case)

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    return BackgroundServer(app)


def _expected(line: str, ports: dict[str, int], task_index: int, run_timeout_s: float | None = None) -> bytes:
    """A recorded line with the recording's ports replaced by this test's where a URL or an address
    names them, its task index by the task's index in this test's input file (the hang case runs
    alone), and the run bound for the hang case."""
    recorded_index = f'"_ng_task_index":{orjson.loads(line)["_ng_task_index"]},'
    assert line.count(recorded_index) == 1
    line = line.replace(recorded_index, f'"_ng_task_index":{task_index},')
    for name, port in ports.items():
        recorded = PORTS[name]
        line = line.replace(f"127.0.0.1:{recorded}", f"127.0.0.1:{port}")
        line = line.replace(f"('127.0.0.1', {recorded})", f"('127.0.0.1', {port})")
    if run_timeout_s is not None:
        line = line.replace(f"run_timeout_secs={RECORDED['run_timeout_s']!r}s", f"run_timeout_secs={run_timeout_s!r}s")
    return line.encode()


def _case(line: bytes | str) -> str:
    return orjson.loads(line)["failure_case"]


def _collect(tmp_path: Path, name: str, tasks: list[dict], agent_url: str, env_url: str, *extra: str) -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in tasks))
    out = tmp_path / name / "rollouts.jsonl"
    out.parent.mkdir()
    call_command(
        "collect",
        *("--agent-url", agent_url, "--env-url", env_url, "--input", str(path), "--output", str(out)),
        *("--no-progress", "--max-attempts", "1", "--name", name, "--no-health-check", *extra),
    )
    return out


@pytest.fixture
def collected(tmp_path) -> dict[str, tuple[bytes, bytes]]:
    """Each case's (row gymweb wrote, row NeMo Gym wrote with this test's ports)."""
    timeout_s, run_timeout_s = RECORDED["remote_responses_timeout_s"], RECORDED["run_timeout_s"]
    hang = [row for row in RECORDED["tasks"] if row["failure_case"] == "seed hangs"]
    rest = [row for row in RECORDED["tasks"] if row["failure_case"] != "seed hangs"]
    mine: dict[str, bytes] = {}
    with _failing_env(run_timeout_s) as env, _failing_agent(timeout_s) as agent:
        ports = {"env": env.port, "agent": agent.port}
        bounds = ("--remote-responses-timeout-s", str(timeout_s), "--run-timeout-s")
        outs = [
            _collect(tmp_path, "cases", rest, agent.url, env.url, *bounds, str(run_timeout_s)),
            _collect(tmp_path, "hang", hang, agent.url, env.url, *bounds, str(HANG_RUN_TIMEOUT_S)),
        ]
        with _failing_env(run_timeout_s) as going_dark:
            outs.append(
                _collect(
                    tmp_path,
                    "verify_unreachable",
                    RECORDED["verify_unreachable_tasks"],
                    agent.url,
                    going_dark.url,
                    *(*bounds, str(run_timeout_s)),
                )
            )
        dead = free_port()
        ports["dead"] = dead
        outs.append(
            _collect(
                tmp_path,
                "env_unreachable",
                RECORDED["env_unreachable_tasks"],
                agent.url,
                f"http://127.0.0.1:{free_port()}",
                *(*bounds, str(run_timeout_s)),
            )
        )
        outs.append(
            _collect(
                tmp_path,
                "unreachable",
                RECORDED["unreachable_tasks"],
                f"http://127.0.0.1:{dead}",
                env.url,
                *("--agent-name", "unreachable_remote_agent", *bounds, str(run_timeout_s)),
            )
        )
    for out in outs:
        assert out.read_bytes() == b""
        for line in (out.parent / "rollouts_failures.jsonl").read_bytes().split(b"\n")[:-1]:
            mine[_case(line)] = line
    index = {
        row["failure_case"]: n
        for rows in (
            rest,
            hang,
            RECORDED["verify_unreachable_tasks"],
            RECORDED["env_unreachable_tasks"],
            RECORDED["unreachable_tasks"],
        )
        for n, row in enumerate(rows)
    }
    theirs = {}
    for line in RECORDED_LINES:
        case = _case(line)
        theirs[case] = _expected(line, ports, index[case], HANG_RUN_TIMEOUT_S if case == "seed hangs" else None)
    assert sorted(mine) == sorted(theirs)
    return {case: (mine[case], theirs[case]) for case in mine}


def test_the_recording_covers_every_failure_class_and_no_success():
    cases = [_case(line) for line in RECORDED_LINES]
    assert sorted(cases) == sorted(KINDS)
    assert {orjson.loads(line)["_ng_failure_class"] for line in RECORDED["failure_lines"]} == {"remote_agent_error"}


@pytest.mark.django_db(transaction=True)
def test_each_failure_is_nemo_gyms_row_byte_for_byte_in_the_file_and_the_results_stream(
    collected, client, django_user_model
):
    differ = {case: pair for case, pair in collected.items() if pair[0] != pair[1]}
    for case, (mine, theirs) in differ.items():  # shown when the test fails
        print(f"{case}:\n  gymweb:   {mine.decode()}\n  NeMo Gym: {theirs.decode()}")
    assert sorted(differ) == []

    admin = django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    _row, token = create_token(admin, "trainer")
    for run in Run.objects.all():
        response = client.get(f"/api/v1/runs/{run.pk}/results?after=0&wait=0", HTTP_AUTHORIZATION=f"Bearer {token}")
        streamed = [line for line in b"".join(response.streaming_content).split(b"\n") if line.strip()]
        assert len(streamed) == run.rollouts.count()
        for line in streamed:
            assert line == collected[_case(line)][1]

    # the rollout page's raw row and the export with review fields carry the same text
    client.force_login(admin)
    for rollout in Rollout.objects.select_related("task", "run"):
        theirs = collected[json.loads(rollout.task.row_json)["failure_case"]][1]
        raw = client.get(reverse("rollout_raw", args=[rollout.run_id, rollout.pk]))
        assert export.row_line(json.loads(raw.content)).encode() == theirs
    for run in Run.objects.all():
        for line in curated.iter_failures(run, None, curated.ExportOptions(review=True)):
            row = orjson.loads(line)
            assert row["error"] == orjson.loads(collected[_case(line)][1])["error"]


@pytest.mark.django_db(transaction=True)
def test_gymwebs_own_message_and_kind_stay_in_the_database_and_pages_and_an_older_attempt_exports_its_message(
    collected, client, django_user_model
):
    for rollout in Rollout.objects.select_related("task", "run"):
        case = json.loads(rollout.task.row_json)["failure_case"]
        nemo_text = orjson.loads(collected[case][1])["error"]
        assert rollout.status == Rollout.Status.FAILED and rollout.failure_kind == KINDS[case]
        assert rollout.nemo_error == nemo_text and rollout.error and rollout.error != nemo_text
        assert rollout.terminal is (case == "agent invalid object")

    client.force_login(django_user_model.objects.create_superuser("admin", "admin@example.com", "pw"))
    rollout = Rollout.objects.get(task__row_json__contains='"seed 500"')
    page = client.get(reverse("rollout", args=[rollout.run_id, rollout.pk])).content.decode()
    assert "seed_failed" in page and escape(rollout.error) in page and "ClientResponseError" not in page

    # an attempt stored before NeMo Gym's text was kept (blank nemo_error) exports its stored message
    Rollout.objects.filter(pk=rollout.pk).update(nemo_error="")
    rows = [orjson.loads(line) for line in export.iter_failures(rollout.run)]
    row = next(row for row in rows if row["_ng_task_index"] == rollout.task_index)
    assert row["error"] == rollout.error
