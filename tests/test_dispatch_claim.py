"""The claim takes the first pending keys of a run in key order, and finds them through an index
rather than by walking the run's finished rows (late in a long run that walk is slow, with the run
row locked)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from rollouts.models import Rollout, Run
from rollouts.workers import claims

from .run_factories import make_run

pytestmark = pytest.mark.django_db


def _run_with_finished_head(n: int, finished: int) -> Run:
    run = make_run(n, status=Run.Status.RUNNING, concurrency=8)
    ids = list(Rollout.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))
    Rollout.objects.filter(id__in=ids[:finished]).update(status=Rollout.Status.SUCCEEDED, reward=1.0)
    return run


def test_it_claims_the_first_pending_keys_in_order():
    run = _run_with_finished_head(12, 5)
    claimed = claims.claim(run.pk, "w1", 3, lease_s=30)
    assert [Rollout.objects.get(pk=rid).task_index for rid, _, _ in claimed] == [5, 6, 7]
    assert set(Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).values_list("worker", flat=True)) == {
        "w1"
    }


def test_it_never_claims_past_the_runs_concurrency():
    run = _run_with_finished_head(20, 0)
    assert len(claims.claim(run.pk, "w1", 6, lease_s=30)) == 6
    assert len(claims.claim(run.pk, "w2", 6, lease_s=30)) == 2  # concurrency 8 over all workers
    assert claims.claim(run.pk, "w3", 6, lease_s=30) == []


@pytest.mark.skipif(connection.vendor != "sqlite", reason="reads SQLite's query plan")
def test_the_pending_keys_are_found_through_the_claim_index():
    run = _run_with_finished_head(30, 20)
    with CaptureQueriesContext(connection) as ctx:
        claims.claim(run.pk, "w1", 2, lease_s=30)
    select = next(q["sql"] for q in ctx.captured_queries if "ORDER BY task_index" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + select)
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert "rollout_run_status_key (run_id=? AND status=?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # no sort: the index gives the key order
