"""An uploaded dataset stored in bounded memory (``rollouts.collection.streamed_upload``): the run it
makes has exactly the tasks and keys ``runs.create_run`` makes from the same file (identical lines
share a task, carried task indices kept, limit, repeats, overrides, stale result fields stripped);
it is written in short transactions of ``BULK`` rows; a file over the key limit is refused while
read, before anything is stored; a failure half-way leaves nothing behind; a second upload of the
same file reuses the stored dataset."""

from __future__ import annotations

import io
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from rollouts.collection import run_rows, runs, streamed_upload
from rollouts.collection.datasets import DatasetError, read_jsonl
from rollouts.models import Dataset, DatasetRow, Rollout, Run, Task

pytestmark = pytest.mark.django_db

SERVICES = {"agent_url": "http://127.0.0.1:9102", "env_url": "http://127.0.0.1:9101"}


def _lines() -> list[str]:
    rows = []
    for i in range(9):
        rows.append({"responses_create_params": {"input": f"task {i % 6}"}, "expected": i % 6})  # 3 repeated lines
    rows.append({"responses_create_params": {"input": "carried"}, "_ng_task_index": 2})
    rows.append({"responses_create_params": {"input": "stale"}, "reward": 1.0, "response": {"x": 1}})
    return [json.dumps(r) for r in rows]


def _file(tmp_path, lines):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    return path


def _keys(run):
    tasks = sorted(Task.objects.filter(run=run).values_list("task_index", "row_json"))
    keys = sorted(Rollout.objects.filter(run=run).values_list("task_index", "rollout_index", "attempt", "status"))
    return tasks, keys


def _streamed(path, monkeypatch=None, **options):
    found = streamed_upload.scan(path, "tasks.jsonl", 1000, 1 << 20)
    run, reused = streamed_upload.store_and_create_run(
        path, "tasks.jsonl", found, dataset_name="tasks.jsonl", run_name="s", max_line_bytes=1 << 20, **options
    )
    return run, reused


@pytest.mark.parametrize(
    "options",
    [{}, {"num_repeats": 3}, {"limit": 4, "num_repeats": 2}, {"overrides": {"temperature": 0.5}}],
)
def test_the_streamed_run_has_the_tasks_and_keys_create_run_makes(tmp_path, options):
    path = _file(tmp_path, _lines())
    with path.open("rb") as fh:
        expected = runs.create_run(read_jsonl(fh), name="m", **SERVICES, **options)
    run, reused = _streamed(path, **SERVICES, **options)
    assert not reused and run.status == Run.Status.QUEUED
    assert _keys(run) == _keys(expected)
    assert (run.num_tasks, run.num_keys) == (expected.num_tasks, expected.num_keys)
    stored = [
        json.loads(t)
        for t in DatasetRow.objects.filter(dataset=run.dataset).order_by("line").values_list("data_json", flat=True)
    ]
    assert len(stored) == 11 and "reward" not in stored[-1] and "response" not in stored[-1]


def test_rows_are_written_in_batches_of_bulk_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(streamed_upload, "BULK", 4)
    path = _file(tmp_path, [json.dumps({"responses_create_params": {"input": f"t{i}"}}) for i in range(10)])
    found = streamed_upload.scan(path, "tasks.jsonl", 1000, 1 << 20)
    with CaptureQueriesContext(connection) as queries:
        run, _ = streamed_upload.store_and_create_run(
            path, "tasks.jsonl", found, dataset_name="d", run_name="s", max_line_bytes=1 << 20, **SERVICES
        )
    row_inserts = [q["sql"] for q in queries if q["sql"].startswith('INSERT INTO "rollouts_datasetrow"')]
    assert len(row_inserts) == 3  # 4 + 4 + 2 rows, each batch its own transaction
    assert run.num_keys == 10 and Rollout.objects.filter(run=run).count() == 10


def test_a_file_over_the_key_limit_is_refused_at_the_first_row_past_it(tmp_path):
    path = _file(tmp_path, [json.dumps({"responses_create_params": {"input": f"t{i}"}}) for i in range(6)])
    with pytest.raises(DatasetError, match="line 6: the dataset has more than 5 rows"):
        streamed_upload.scan(path, "tasks.jsonl", 5, 1 << 20)
    assert not Dataset.objects.exists() and not Run.objects.exists()


def _fail_third_call(monkeypatch, owner, name: str) -> list:
    """``owner.<name>`` (a bulk insert) raises OSError("disk full") on its third call (a disk
    filling up half-way through an upload); returns the list that counts the calls."""
    real, calls = getattr(owner, name), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    return calls


def test_a_failure_half_way_leaves_no_dataset_and_no_run(tmp_path, monkeypatch):
    monkeypatch.setattr(streamed_upload, "BULK", 2)
    path = _file(tmp_path, [json.dumps({"responses_create_params": {"input": f"t{i}"}}) for i in range(7)])
    found = streamed_upload.scan(path, "tasks.jsonl", 1000, 1 << 20)
    _fail_third_call(monkeypatch, run_rows, "insert_from_template")  # the pending rollouts' insert
    with pytest.raises(OSError):
        streamed_upload.store_and_create_run(
            path, "tasks.jsonl", found, dataset_name="d", run_name="s", max_line_bytes=1 << 20, **SERVICES
        )
    assert not Dataset.objects.exists() and not Run.objects.exists() and not Rollout.objects.exists()
    assert not DatasetRow.objects.exists() and not Task.objects.exists()


def test_the_same_file_uploaded_again_reuses_the_stored_dataset(tmp_path, django_user_model):
    user = django_user_model.objects.create_user(username="u", password="x")
    path = _file(tmp_path, _lines())
    first, reused_first = _streamed(path, user=user, **SERVICES)
    second, reused_second = _streamed(path, user=user, **SERVICES)
    assert (reused_first, reused_second) == (False, True)
    assert second.dataset_id == first.dataset_id and Dataset.objects.count() == 1
    assert _keys(second)[1] == _keys(first)[1]


def test_a_dataset_alone_is_stored_from_an_open_upload_in_batches_and_reused(django_user_model, monkeypatch):
    from django.core.files.uploadedfile import SimpleUploadedFile

    monkeypatch.setattr(streamed_upload, "BULK", 4)
    user = django_user_model.objects.create_user(username="u", password="x")
    lines = [json.dumps({"responses_create_params": {"input": f"t{i}"}, "reward": 1.0}) for i in range(10)]
    upload = SimpleUploadedFile("tasks.jsonl", ("\n".join(lines) + "\n").encode())
    found = streamed_upload.scan(upload, "tasks.jsonl", 1000, 1 << 20)
    with CaptureQueriesContext(connection) as queries:
        dataset, reused = streamed_upload.store_dataset(
            upload, "tasks.jsonl", found, name="tasks.jsonl", user=user, max_line_bytes=1 << 20
        )
    row_inserts = [q["sql"] for q in queries if q["sql"].startswith('INSERT INTO "rollouts_datasetrow"')]
    assert not reused and len(row_inserts) == 3  # 4 + 4 + 2 rows, each batch its own transaction
    assert (
        dataset.num_rows == 10 and dataset.sha256 == read_jsonl(io.BytesIO(("\n".join(lines) + "\n").encode())).sha256
    )
    stored = list(DatasetRow.objects.filter(dataset=dataset).order_by("line").values_list("line", "data_json"))
    assert [line for line, _ in stored] == list(range(1, 11)) and all("reward" not in t for _, t in stored)
    assert not Run.objects.exists() and not Task.objects.exists()
    again, reused_again = streamed_upload.store_dataset(
        upload, "tasks.jsonl", found, name="tasks.jsonl", user=user, max_line_bytes=1 << 20
    )
    assert reused_again and again.pk == dataset.pk and Dataset.objects.count() == 1


def test_a_dataset_alone_failing_half_way_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(streamed_upload, "BULK", 2)
    path = _file(tmp_path, [json.dumps({"responses_create_params": {"input": f"t{i}"}}) for i in range(7)])
    found = streamed_upload.scan(path, "tasks.jsonl", 1000, 1 << 20)
    calls = _fail_third_call(monkeypatch, DatasetRow.objects, "bulk_create")
    with pytest.raises(OSError):
        streamed_upload.store_dataset(path, "tasks.jsonl", found, name="d", reuse=False, max_line_bytes=1 << 20)
    assert len(calls) == 3 and not Dataset.objects.exists() and not DatasetRow.objects.exists()
