"""An import in short transactions (the import command, the page's and the API's background task):
each batch commits on its own, where other connections see it, and reports progress; a file refused
or a write failing after batches were committed still leaves nothing stored, and the refusal names
the file and line."""

from __future__ import annotations

import io
import json

import pytest

from rollouts.collection import importer
from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import ROWS_PER_BATCH, import_shards
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

pytestmark = pytest.mark.django_db(transaction=True)  # real commits, as on a worker


def _row(i: int) -> str:
    return json.dumps(
        {"responses_create_params": {"input": f"task {i}"}, "response": {"id": f"r{i}", "output": []}, "reward": 1.0}
    )


def test_batches_commit_as_they_go_and_report_progress():
    lines = [_row(i) for i in range(2 * ROWS_PER_BATCH + 50)]
    seen: list[int] = []
    summary = import_shards(
        [(io.BytesIO(("\n".join(lines) + "\n").encode()), "r.jsonl")],
        on_batch=lambda: seen.append(Rollout.objects.count()),  # the rows committed so far
    )
    assert summary.rows == len(lines) and Run.objects.get().rollouts.count() == len(lines)
    assert len(seen) >= 2 and seen[0] == ROWS_PER_BATCH


def test_a_bad_line_after_committed_batches_leaves_nothing_stored():
    lines = [_row(i) for i in range(2 * ROWS_PER_BATCH + 50)] + ["{broken"]
    with pytest.raises(DatasetError, match=f"r.jsonl, line {len(lines)}"):
        import_shards([(io.BytesIO("\n".join(lines).encode()), "r.jsonl")])
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0


def test_the_import_command_refused_mid_file_leaves_nothing_and_names_file_and_line(tmp_path):
    from django.core.management import CommandError, call_command

    path = tmp_path / "big.jsonl"
    lines = [_row(i) for i in range(2 * ROWS_PER_BATCH + 50)] + [
        '{"responses_create_params": {"input": "x"}, "reward": "high"}'
    ]
    path.write_text("\n".join(lines) + "\n")
    committed: list[int] = []
    real_flush = importer._Importer.flush

    def flush(self):
        real_flush(self)
        committed.append(Rollout.objects.count())

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(importer._Importer, "flush", flush)
        with pytest.raises(CommandError, match=rf"big\.jsonl, line {len(lines)}: 'reward' must be a number"):
            call_command("import_rollouts", str(path), "--no-health-check")
    assert committed[:2] == [ROWS_PER_BATCH, 2 * ROWS_PER_BATCH]  # batches were committed before the bad line
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0 and Task.objects.count() == 0
    assert AgentCall.objects.count() == 0 and TrajectoryItem.objects.count() == 0


def test_a_database_failure_after_committed_batches_leaves_nothing(monkeypatch):
    lines = [_row(i) for i in range(3 * ROWS_PER_BATCH)]
    real = Rollout.objects.bulk_create
    calls: list[int] = []

    def failing(objs, *args, **kwargs):
        calls.append(len(objs))
        if len(calls) == 3:
            raise OSError("disk full")
        return real(objs, *args, **kwargs)

    monkeypatch.setattr(Rollout.objects, "bulk_create", failing)
    with pytest.raises(OSError):
        import_shards([(io.BytesIO("\n".join(lines).encode()), "r.jsonl")])
    assert len(calls) == 3 and Run.objects.count() == 0 and Rollout.objects.count() == 0
    assert Task.objects.count() == 0


def test_each_batch_is_committed_where_another_connection_sees_it():
    from django.db import connections

    lines = [_row(i) for i in range(2 * ROWS_PER_BATCH + 50)]
    seen: list[int] = []

    def look() -> None:  # a second connection, as a page or a worker would read
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT COUNT(*) FROM rollouts_rollout")
                seen.append(cursor.fetchone()[0])
        finally:
            other.close()

    import_shards([(io.BytesIO("\n".join(lines).encode()), "r.jsonl")], on_batch=look)
    assert seen[:2] == [ROWS_PER_BATCH, 2 * ROWS_PER_BATCH]
