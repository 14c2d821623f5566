"""An import in short transactions (the import page's background task): each batch commits on its
own and reports progress; a refused file still leaves nothing stored."""

from __future__ import annotations

import io
import json

import pytest

from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import ROWS_PER_BATCH, import_shards
from rollouts.models import Rollout, Run

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
        batched=True,
        on_batch=lambda: seen.append(Rollout.objects.count()),  # the rows committed so far
    )
    assert summary.rows == len(lines) and Run.objects.get().rollouts.count() == len(lines)
    assert len(seen) >= 2 and seen[0] == ROWS_PER_BATCH


def test_a_bad_line_after_committed_batches_leaves_nothing_stored():
    lines = [_row(i) for i in range(2 * ROWS_PER_BATCH + 50)] + ["{broken"]
    with pytest.raises(DatasetError, match=f"r.jsonl, line {len(lines)}"):
        import_shards([(io.BytesIO("\n".join(lines).encode()), "r.jsonl")], batched=True)
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0
