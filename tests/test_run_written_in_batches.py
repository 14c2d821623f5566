"""Every run's tasks and pending rollouts are written ``BULK`` rows per short transaction, whatever
made it: ``runs.create_run`` (``gymweb collect``, the demo, the API over rows in memory) writes as a
streamed upload writes, so a big dataset never holds SQLite's write lock for long. The keys are
NeMo Gym's (``materialize``); the run is being written (shown nowhere) until its last batch is in;
a failure half-way leaves nothing."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from rollouts.collection import run_rows, runs
from rollouts.collection.datasets import materialize, read_jsonl
from rollouts.lossless import dumps
from rollouts.models import Rollout, Run, Task

pytestmark = pytest.mark.django_db

SERVICES = {"agent_url": "http://127.0.0.1:9102", "env_url": "http://127.0.0.1:9101"}


def _parsed():
    rows = [{"responses_create_params": {"input": f"task {i % 6}"}, "expected": i % 6} for i in range(9)]
    rows.append({"responses_create_params": {"input": "carried"}, "_ng_task_index": 2})
    rows.append({"responses_create_params": {"input": "own ref"}, "agent_ref": {"name": "other"}})
    return read_jsonl([json.dumps(r) for r in rows], source="tasks.jsonl")


@pytest.mark.parametrize("options", [{}, {"num_repeats": 3}, {"limit": 4, "num_repeats": 2}, {"overrides": {"t": 1}}])
def test_a_run_from_rows_in_memory_has_nemo_gyms_keys_written_bulk_rows_per_transaction(monkeypatch, options):
    monkeypatch.setattr(run_rows, "BULK", 4)
    with CaptureQueriesContext(connection) as queries:
        run = runs.create_run(_parsed(), name="m", **SERVICES, **options)

    expected = materialize(
        _parsed(),
        agent_name=run.agent_name,
        num_repeats=options.get("num_repeats", 1),
        limit=options.get("limit"),
        overrides=options.get("overrides"),
    )
    tasks = sorted(Task.objects.filter(run=run).values_list("task_index", "row_json"))
    assert tasks == sorted((t.task_index, dumps(t.row)) for t in expected)
    keys = sorted(Rollout.objects.filter(run=run).values_list("task_index", "rollout_index", "attempt", "status"))
    assert keys == sorted((t.task_index, r, 1, Rollout.Status.PENDING) for t in expected for r in t.rollout_indices)
    run.refresh_from_db()
    assert (run.num_tasks, run.num_keys, run.writing_until) == (len(expected), len(keys), None)

    # each batch (at most 4 rows' rollouts) is its own transaction: a commit between two inserts
    sql = [q["sql"] for q in queries]
    inserts = [
        i for i, s in enumerate(sql) if 'INSERT INTO "rollouts_rollout"' in s
    ]  # executemany: "N times: INSERT …"
    assert len(inserts) == -(-min(11, options.get("limit") or 11) // 4)
    for a, b in zip(inserts, inserts[1:], strict=False):
        assert any(s.startswith("RELEASE SAVEPOINT") for s in sql[a:b])


def test_the_run_is_shown_nowhere_while_written_and_a_failure_half_way_leaves_nothing(monkeypatch):
    monkeypatch.setattr(run_rows, "BULK", 4)
    write = run_rows.RunRows.write
    seen = []

    def failing_second(self, prepared):
        seen.append(Run.objects.get(pk=self.run.pk).writing_until)
        if len(seen) == 2:
            raise OSError("disk full")
        write(self, prepared)

    monkeypatch.setattr(run_rows.RunRows, "write", failing_second)
    with pytest.raises(OSError, match="disk full"):
        runs.create_run(_parsed(), name="m", **SERVICES)
    assert all(until is not None for until in seen)  # being written: no page or worker takes it
    assert not Run.objects.exists() and not Task.objects.exists() and not Rollout.objects.exists()
