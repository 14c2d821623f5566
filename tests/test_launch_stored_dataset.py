"""A run launched from a dataset already stored (the new-run form's dataset choice, ``POST
/api/v1/runs`` with a dataset id) is written as an upload is (``streamed_upload.
create_run_from_dataset``): the dataset's rows read in line order ``BULK`` at a time, the run's
tasks and pending rollouts stored one batch per transaction while the run is shown nowhere, with
exactly the tasks and keys ``runs.create_run`` makes from the whole dataset in memory; a failure
half-way leaves the dataset and no run."""

from __future__ import annotations

import io
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from rollouts.collection import run_rows, runs, streamed_upload, writing
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Dataset, DatasetRow, Rollout, Run, Task
from rollouts.tokens import create_token

pytestmark = pytest.mark.django_db

SERVICES = {"agent_url": "http://127.0.0.1:9102", "env_url": "http://127.0.0.1:9101"}


def _stored(user, rows: list[dict]) -> Dataset:
    text = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    return runs.store_dataset(read_jsonl(io.BytesIO(text), source="tasks.jsonl"), "tasks.jsonl", user)


def _mixed() -> list[dict]:
    rows: list[dict] = [{"responses_create_params": {"input": f"task {i % 4}"}, "expected": i % 4} for i in range(7)]
    rows.insert(2, {"responses_create_params": {"input": "carried"}, "_ng_task_index": 1})
    rows.append({"responses_create_params": {"input": "late carried"}, "_ng_task_index": 0})  # row 9
    rows.append({"responses_create_params": {"input": "own agent"}, "agent_ref": {"name": "other"}})
    return rows


def _numbered(n: int) -> list[dict]:
    return [{"responses_create_params": {"input": f"task {i}"}, "expected": i} for i in range(n)]


def _keys(run):
    tasks = sorted(Task.objects.filter(run=run).values_list("task_index", "row_json"))
    keys = sorted(Rollout.objects.filter(run=run).values_list("task_index", "rollout_index", "attempt", "status"))
    return tasks, keys


def _in_memory(dataset, **options) -> Run:
    """The run ``create_run`` makes from the whole dataset held in memory: what to compare with."""
    return runs.create_run(runs.load_dataset(dataset), name="m", dataset=dataset, **SERVICES, **options)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_repeats": 3},
        {"limit": 4, "num_repeats": 2},  # the carried index of row 9 is past the limit: not skipped
        {"limit": 9},
        {"overrides": {"temperature": 0.5}, "agent_name": "mine"},
    ],
)
def test_the_run_has_the_tasks_and_keys_create_run_makes(user, monkeypatch, options):
    monkeypatch.setattr(streamed_upload, "BULK", 3)
    dataset = _stored(user, _mixed())
    expected = _in_memory(dataset, **options)
    run = streamed_upload.create_run_from_dataset(dataset, name="s", user=user, **SERVICES, **options)
    assert run.status == Run.Status.QUEUED and run.writing_until is None and run.dataset_id == dataset.pk
    assert _keys(run) == _keys(expected)
    assert (run.num_tasks, run.num_keys) == (expected.num_tasks, expected.num_keys)
    assert run.team_id == dataset.team_id


def _batches(monkeypatch) -> list[tuple]:
    """Each batch's (run id, whether the run was still being written); ``BULK`` set to 4."""
    monkeypatch.setattr(streamed_upload, "BULK", 4)
    seen, real = [], writing.renew

    def renew(*objs):
        real(*objs)
        for obj in objs:
            seen.append((obj.pk, Run.objects.get(pk=obj.pk).writing_until is not None))

    monkeypatch.setattr(writing, "renew", renew)
    return seen


def test_a_dataset_chosen_through_the_api_is_written_in_batches_with_the_same_keys(client, user, monkeypatch):
    dataset = _stored(user, _numbered(10))
    expected = _in_memory(dataset, num_repeats=2)
    seen = _batches(monkeypatch)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'tests')[1]}"}
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            "/api/v1/runs",
            data=json.dumps({"dataset": dataset.pk, "num_repeats": 2, **SERVICES}),
            content_type="application/json",
            **auth,
        )
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    inserts = [q["sql"] for q in queries if 'INSERT INTO "rollouts_rollout"' in q["sql"]]  # "N times: INSERT …"
    assert len(inserts) == 3 and seen == [(run.pk, True)] * 3  # 4 + 4 + 2 rows, each batch its own transaction
    assert run.status == Run.Status.RUNNING and run.writing_until is None
    assert _keys(run) == _keys(expected) and (run.num_tasks, run.num_keys) == (10, 20)


def test_a_dataset_chosen_on_the_new_run_page_is_written_in_batches_with_the_same_keys(signed_in, user, monkeypatch):
    dataset = _stored(user, _mixed())
    expected = _in_memory(dataset, limit=9)
    seen = _batches(monkeypatch)
    data = {
        "dataset": dataset.pk,
        "agent_name": "remote_agent",
        "concurrency": "8",
        "num_repeats": "1",
        "limit": "9",
        "max_attempts": "3",
        "remote_responses_timeout_s": "60",
        "run_timeout_s": "120",
        "overrides": "",
        **SERVICES,
    }
    response = signed_in.post(reverse("run_new"), data)
    run = Run.objects.exclude(pk=expected.pk).get()
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[run.pk])
    assert seen == [(run.pk, True)] * 3  # 4 + 4 + 1 rows
    assert _keys(run) == _keys(expected) and run.status == Run.Status.RUNNING


def test_a_failure_half_way_deletes_the_run_and_keeps_the_dataset(user, monkeypatch):
    monkeypatch.setattr(streamed_upload, "BULK", 4)
    dataset = _stored(user, _numbered(10))
    real, calls = run_rows.insert_from_template, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_rows, "insert_from_template", failing)  # the pending rollouts' insert
    with pytest.raises(OSError, match="disk full"):
        streamed_upload.create_run_from_dataset(dataset, name="s", user=user, **SERVICES)
    assert not (Run.objects.exists() or Task.objects.exists() or Rollout.objects.exists())
    assert DatasetRow.objects.filter(dataset=dataset).count() == 10


def test_a_run_over_the_key_limit_stores_nothing(user, settings):
    dataset = _stored(user, _numbered(10))
    settings.GYMWEB_MAX_KEYS_PER_RUN = 15
    with pytest.raises(run_rows.RunTooLarge):
        streamed_upload.create_run_from_dataset(dataset, name="s", user=user, num_repeats=2, **SERVICES)
    assert not Run.objects.exists()
