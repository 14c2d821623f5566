"""An env's ``/verify`` reply NeMo Gym 0.7.0's remote_agent refuses (a reply without ``reward``, a
list for a reward, a body that is not JSON, a JSON array) gives NeMo Gym's failures-sidecar row byte
for byte. ``tests/data/verify_refusal_rows.json`` holds the rows NeMo Gym's own ``gym eval run``
wrote for these tasks against an env answering each case's bytes
(``scripts/record_verify_refusal_rows.py``): a ``remote_agent_error`` row with the task's record and
NeMo Gym's ``error`` text (its ``run()`` catches the refusal; ``/run`` answers 200). gymweb's loop
runs the same tasks against a real HTTP env on 127.0.0.1 answering the same bytes; its finer kind
(``verify_failed``) stays in the database, the pages and the API."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from django.core.management import call_command
from django.urls import reverse

from gymweb.examples._serve import BackgroundServer
from rollouts.collection import export
from rollouts.collection.importer import import_rollouts
from rollouts.engine.failures import FailureKind
from rollouts.models import Rollout, Run
from rollouts.tokens import create_token

from .nemo_fakes import counter_tools_env

RECORDED = json.loads((Path(__file__).parent / "data" / "verify_refusal_rows.json").read_text())


def _by_task(lines) -> dict[int, bytes]:
    return {orjson.loads(line)["_ng_task_index"]: line.encode() if isinstance(line, str) else line for line in lines}


def _refusing_env() -> BackgroundServer:
    """``nemo_fakes.counter_tools_env`` whose ``/verify`` answers the bytes of the case the task
    names in ``refusal_case``."""

    async def verify(request):
        case = RECORDED["cases"][(await request.json())["refusal_case"]]
        return web.Response(body=case["body"].encode(), status=case["status"], content_type=case["content_type"])

    return counter_tools_env(verify)


@pytest.fixture
def collected(tmp_path, counter_agent_url) -> tuple[Run, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in RECORDED["tasks"]))
    out = tmp_path / "rollouts.jsonl"
    with _refusing_env() as env:
        call_command(
            "collect",
            *("--agent-url", counter_agent_url, "--env-url", env.url, "--input", str(tasks), "--output", str(out)),
            *("--no-progress", "--max-attempts", "1"),
        )
    return Run.objects.get(), tmp_path


def test_the_recording_is_one_refused_reply_per_case_and_no_success():
    assert len(RECORDED["cases"]) >= 4 and RECORDED["success_lines"] == []
    rows = [orjson.loads(line) for line in RECORDED["failure_lines"]]
    assert sorted(row["refusal_case"] for row in rows) == sorted(RECORDED["cases"])
    assert {row["_ng_failure_class"] for row in rows} == {"remote_agent_error"}


@pytest.mark.django_db(transaction=True)
def test_each_refused_verify_reply_is_nemo_gyms_failure_row_byte_for_byte(collected):
    run, folder = collected
    assert (folder / "rollouts.jsonl").read_bytes() == b""
    mine = _by_task((folder / "rollouts_failures.jsonl").read_bytes().split(b"\n")[:-1])
    assert mine == _by_task(RECORDED["failure_lines"])
    materialized = (folder / "rollouts_materialized_inputs.jsonl").read_text().splitlines()
    assert sorted(materialized) == sorted(RECORDED["materialized_lines"])
    # gymweb's finer kind is kept in the database, not written to the file
    for rollout in Rollout.objects.filter(run=run).select_related("task"):
        row = orjson.loads(mine[rollout.task_index])
        assert rollout.status == Rollout.Status.FAILED and rollout.failure_kind == FailureKind.VERIFY_FAILED
        assert rollout.error == row["error"] and rollout.terminal is False
        assert "_gymweb_failure_kind" not in row and FailureKind.VERIFY_FAILED not in mine[rollout.task_index].decode()


@pytest.mark.django_db(transaction=True)
def test_the_results_stream_and_the_rollout_page_show_the_refusal(collected, client, django_user_model):
    run, _folder = collected
    admin = django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    _row, token = create_token(admin, "trainer")
    response = client.get(f"/api/v1/runs/{run.pk}/results?after=0&wait=0", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    streamed = [line for line in b"".join(response.streaming_content).split(b"\n") if line.strip()]
    assert _by_task(streamed) == _by_task(RECORDED["failure_lines"])

    client.force_login(admin)
    rollout = Rollout.objects.get(run=run, task_index=1)  # "a list reward"
    page = client.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert "verify_failed" in page and "not terminal" in page
    assert "1 validation error for RemoteAgentVerifyResponse\nreward\n  Input should be a valid number" in page
    listing = client.get(reverse("run", args=[run.pk])).content.decode()
    assert "verify_failed" in listing


@pytest.mark.django_db
def test_nemo_gyms_refusal_rows_survive_import_and_download_byte_for_byte():
    failures = "".join(line + "\n" for line in RECORDED["failure_lines"])
    materialized = "".join(line + "\n" for line in RECORDED["materialized_lines"])
    run = import_rollouts(None, failures=RECORDED["failure_lines"], materialized=RECORDED["materialized_lines"]).run
    assert "".join(line + "\n" for line in export.iter_failures(run)) == failures
    assert "".join(line + "\n" for line in export.iter_materialized(run)) == materialized
    rows = {orjson.loads(line)["_ng_task_index"]: orjson.loads(line) for line in RECORDED["failure_lines"]}
    for rollout in Rollout.objects.filter(run=run):
        assert rollout.status == Rollout.Status.FAILED and rollout.error == rows[rollout.task_index]["error"]
