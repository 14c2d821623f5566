"""The writer stores a wave's seed times (``seed_ms``) with a few statements, not one per rollout:
a batch transaction of thousands of single-row UPDATEs holds those rows locked long enough for their
leases to lapse on a loaded machine."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout
from rollouts.workers import writer
from rollouts.workers.writer import Batch, write_batch

pytestmark = pytest.mark.django_db(transaction=True)


def _run(n):
    lines = [json.dumps({"responses_create_params": {"input": f"task {i}"}}) for i in range(n)]
    return runs.create_run(read_jsonl(lines), name="seeds", agent_url="http://a", env_url="http://e")


def test_every_seed_time_of_a_batch_is_stored_with_one_update_per_seed_batch(monkeypatch):
    monkeypatch.setattr(writer, "SEED_BATCH", 2)
    run = _run(5)
    ids = list(Rollout.objects.filter(run=run).order_by("id").values_list("id", flat=True))
    seeds = {rid: 10.0 + k / 4 for k, rid in enumerate(ids)}

    with CaptureQueriesContext(connection) as ctx:
        write_batch(Batch(seeds=seeds), "worker-1")

    assert dict(Rollout.objects.filter(run=run).values_list("id", "seed_ms")) == seeds
    updates = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 3  # 5 rollouts, 2 per statement


def test_a_seed_time_is_stored_beside_rows_of_other_rollouts_and_leaves_other_columns_alone():
    run = _run(3)
    first, second, third = Rollout.objects.filter(run=run).order_by("id")
    Rollout.objects.filter(pk=third.pk).update(seed_ms=7.5)

    write_batch(Batch(seeds={first.pk: 1.25, second.pk: 2.5}), "worker-1")

    stored = {r.pk: (r.seed_ms, r.status) for r in Rollout.objects.filter(run=run)}
    assert stored == {first.pk: (1.25, "pending"), second.pk: (2.5, "pending"), third.pk: (7.5, "pending")}
