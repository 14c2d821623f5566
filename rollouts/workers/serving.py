"""Which workers serve a run and their share of it (the run page's "Workers" table): per worker
that claimed any of the run's attempts, its name, host, the attempts of the run it has in flight
now, the attempts it ended (succeeded or failed) and whether its heartbeat is recent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from rollouts.models import Rollout, Worker

__all__ = ["WorkerShare", "run_workers"]


@dataclass(frozen=True)
class WorkerShare:
    """One worker's part of a run. ``share`` is its fraction (0–1) of the run's ended attempts."""

    name: str
    host: str
    inflight: int
    done: int
    share: float
    live: bool


def run_workers(run_id: int, lease_s: float) -> list[WorkerShare]:
    """The workers that claimed attempts of run ``run_id``, most in flight first, then most done.
    A worker is live when its heartbeat is within ``lease_s`` seconds (``GYMWEB_LEASE_S``); a
    stopped or dead one stays listed with what it ended. One grouped query over the run's attempts
    (its (run, status) index) and one over the ``Worker`` rows of those names."""
    rows = (
        Rollout.objects.filter(run_id=run_id)
        .exclude(worker="")
        .values("worker")
        .annotate(
            inflight=Count("id", filter=Q(status=Rollout.Status.RUNNING)),
            done=Count("id", filter=Q(status__in=[Rollout.Status.SUCCEEDED, Rollout.Status.FAILED])),
        )
        .order_by()
    )
    counts = {r["worker"]: (r["inflight"], r["done"]) for r in rows if r["inflight"] or r["done"]}
    if not counts:
        return []
    since = timezone.now() - timedelta(seconds=lease_s)
    known = {w.name: w for w in Worker.objects.filter(name__in=list(counts))}
    total = sum(done for _, done in counts.values())
    out = [
        WorkerShare(
            name=name,
            host=known[name].host if name in known else name.split(":")[0],
            inflight=inflight,
            done=done,
            share=done / total if total else 0.0,
            live=name in known and known[name].last_seen >= since,
        )
        for name, (inflight, done) in counts.items()
    ]
    out.sort(key=lambda w: (-w.inflight, -w.done, w.name))
    return out
