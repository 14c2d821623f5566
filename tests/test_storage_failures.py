"""No quiet fallback: when part of a rollout cannot be stored, the rollout is not "succeeded
with holes". It ends as a ``storage_failed`` failure (retried like any failure), its page says what
is missing, and the worker log names the rollout. An import whose row the database refuses reports
the line and stores nothing, never an HTTP 500.

With every string now storable, the database refusing a value is simulated: ``rollouts.lossless.dumps``
(the writer of every JSON column) raises the ``DataError`` a database would."""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import DataError
from django.urls import reverse

from rollouts import lossless
from rollouts.collection import runs
from rollouts.collection.datasets import DatasetError, read_jsonl
from rollouts.collection.importer import import_rollouts
from rollouts.engine.failures import FailureKind
from rollouts.engine.loop import RolloutOutcome
from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem
from rollouts.workers import writer
from rollouts.workers.writer import Batch, write_batch

pytestmark = pytest.mark.django_db(transaction=True)

real_dumps = lossless.dumps


def refuse(predicate, error=None):
    """A ``dumps`` that raises ``DataError`` (or ``error``) for values matching ``predicate``."""

    def fake(value):
        if predicate(value):
            raise error or DataError("simulated: the database refused this value")
        return real_dumps(value)

    return fake


def is_tool_output(value):
    return isinstance(value, dict) and value.get("type") == "function_call_output"


def _read(path):
    return [json.loads(line) for line in path.read_text().split("\n") if line]


def test_a_trajectory_item_that_cannot_be_stored_fails_the_rollout_and_says_what_is_missing(
    monkeypatch, caplog, tmp_path, counter_env_url, counter_agent_url, counter_tasks_path, client, django_user_model
):
    monkeypatch.setattr(lossless, "dumps", refuse(is_tool_output))
    out = tmp_path / "rollouts.jsonl"
    args = [
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--limit",
        "2",
        "--no-progress",
    ]
    with caplog.at_level(logging.ERROR, logger="gymweb.dispatch"):
        call_command("collect", *args)
    run = Run.objects.get()
    rollouts = list(Rollout.objects.filter(run=run).order_by("task_index"))
    assert [r.status for r in rollouts] == ["failed", "failed"]
    assert {r.failure_kind for r in rollouts} == {FailureKind.STORAGE_FAILED}
    for rollout in rollouts:
        assert "gymweb could not store all of this rollout" in rollout.error
        assert "trajectory item #" in rollout.error and "(function_call_output): DataError" in rollout.error
        assert "The rollout itself ended as: success with reward 1.0" in rollout.error
        assert rollout.storage_error.startswith("trajectory item #")
        assert not rollout.terminal
        # What could be stored is there; the merged response keeps the whole trajectory for inspection.
        kinds = set(TrajectoryItem.objects.filter(rollout=rollout).values_list("kind", flat=True))
        assert "function_call" in kinds and "function_call_output" not in kinds
        assert "function_call_output" in rollout.partial_response_json
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(
            m.startswith(
                f"rollout {rollout.pk} (run {run.pk}, task {rollout.task_index}, rollout 0, attempt 1): could not store trajectory item #"
            )
            for m in logged
        ), logged
    assert _read(out) == []
    failures = _read(tmp_path / "rollouts_failures.jsonl")
    assert len(failures) == 2 and all("_gymweb_failure_kind" not in f for f in failures)  # NeMo Gym's rows
    assert [r.failure_kind for r in rollouts] == ["storage_failed", "storage_failed"]  # gymweb's kind: in the database

    client.force_login(django_user_model.objects.create_user("bob", password="pw-pw-pw-pw"))
    page = client.get(reverse("rollout", args=[run.pk, rollouts[0].pk])).content.decode()
    assert 'id="storage-error"' in page and "Not stored:" in page and "trajectory item #" in page

    # Once the database takes it, --resume retries the key (a storage failure is not terminal).
    monkeypatch.setattr(lossless, "dumps", real_dumps)
    call_command("collect", *args[:-1], "--resume", "--no-progress")
    assert len(_read(out)) == 2


def _running_rollout():
    parsed = read_jsonl(['{"responses_create_params": {"input": "hi"}}'])
    run = runs.create_run(parsed, name="t", agent_url="http://127.0.0.1:1", env_url="http://127.0.0.1:2")
    runs.launch(run)
    rollout = Rollout.objects.get(run=run)
    Rollout.objects.filter(pk=rollout.pk).update(status="running", worker="w")
    return run, rollout


def test_a_result_that_cannot_be_stored_becomes_a_storage_failure_row(monkeypatch, caplog):
    run, rollout = _running_rollout()
    monkeypatch.setattr(writer, "dumps", refuse(lambda v: isinstance(v, dict) and "reward" in v))
    outcome = RolloutOutcome(ok=True, reward=1.0, verify_response={"reward": 1.0}, response={"output": []})
    with caplog.at_level(logging.ERROR, logger="gymweb.dispatch"):
        write_batch(Batch(finished=[(rollout.pk, outcome)]), "w")
    rollout.refresh_from_db()
    assert (rollout.status, rollout.failure_kind, rollout.reward) == ("failed", "storage_failed", 0.0)
    assert "Missing: the rollout's result (status, reward, verify reply, counts): DataError" in rollout.error
    assert (
        f"rollout {rollout.pk} (run {run.pk}, task 0, rollout 0, attempt 1): could not store the rollout's result"
        in caplog.text
    )


def test_an_agent_call_lost_in_one_batch_fails_the_rollout_when_it_finishes_in_a_later_one(monkeypatch):
    from datetime import datetime

    run, rollout = _running_rollout()
    monkeypatch.setattr(lossless, "dumps", refuse(lambda v: isinstance(v, dict) and v.get("refuse") is True))
    call = AgentCall(rollout_id=rollout.pk, index=0, started=datetime.now(UTC), latency_ms=1.0, usage={"refuse": True})
    item = TrajectoryItem(
        rollout_id=rollout.pk, seq=0, step=0, kind="message", origin="agent", payload={"type": "message"}
    )
    write_batch(Batch(calls=[call], items=[item]), "w")
    rollout.refresh_from_db()
    assert rollout.status == "running" and rollout.storage_error.startswith("agent call 1: DataError")
    assert TrajectoryItem.objects.filter(rollout=rollout).count() == 1
    monkeypatch.setattr(lossless, "dumps", real_dumps)
    outcome = RolloutOutcome(
        ok=True, reward=1.0, verify_response={"reward": 1.0}, response={"output": [{"type": "message"}]}
    )
    write_batch(Batch(finished=[(rollout.pk, outcome)]), "w")
    rollout.refresh_from_db()
    assert (rollout.status, rollout.failure_kind) == ("failed", "storage_failed")
    assert "Missing: agent call 1: DataError" in rollout.error
    assert writer._missing == {}


@pytest.mark.parametrize(
    "error, says",
    [
        (None, "the row cannot be stored (DataError: simulated"),
        (RecursionError("maximum recursion depth exceeded"), "the row is nested too deeply to store"),
    ],
)
def test_an_import_row_the_database_refuses_is_reported_with_its_line_not_a_500(monkeypatch, signed_in, error, says):
    monkeypatch.setattr(
        lossless, "dumps", refuse(lambda v: isinstance(v, dict) and v.get("text") == "refuse me", error)
    )
    rows = [
        {"responses_create_params": {"input": "a"}, "response": {"id": "r", "output": []}, "reward": 1.0},
        {
            "responses_create_params": {"input": "b"},
            "reward": 1.0,
            "response": {
                "id": "r",
                "output": [{"type": "message", "role": "assistant", "content": [], "text": "refuse me"}],
            },
        },
    ]
    body = "".join(json.dumps(r) + "\n" for r in rows)
    response = signed_in.post(reverse("import"), {"rollouts": SimpleUploadedFile("mine.jsonl", body.encode())})
    assert response.status_code == 400
    message = response.context["form"].errors["rollouts"][0]
    assert message.startswith(f"mine.jsonl, line 2: {says}")
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0 and TrajectoryItem.objects.count() == 0
    with pytest.raises(DatasetError, match="mine.jsonl, line 2: the row"):
        import_rollouts(io.BytesIO(body.encode()), source="mine.jsonl")
    assert Run.objects.count() == 0
