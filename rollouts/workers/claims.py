"""Claiming and leases: atomic claims of pending rollouts under the run's ``concurrency``, lease
renewal with each dispatcher's ``Worker`` row (the heartbeat), expired leases reaped (their keys
queued again), the running runs and the attempts each has left, and the scheduled ``supervise``.
All of it runs in a dispatcher's database thread or a django-q2 task."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from rollouts import background
from rollouts.collection import runs, writing
from rollouts.models import Rollout, Run, Task, Worker
from rollouts.operations import prometheus

log = logging.getLogger("gymweb.dispatch")

__all__ = ["claim", "heartbeat", "reap_expired", "reap_run", "retire", "running_runs", "runs_left", "supervise"]


def reap_expired(run_id: int) -> int:
    """Attempts whose lease expired (their worker died) become ``interrupted`` and their keys get a
    new pending attempt with the same number: a killed rollout is not an attempt (DESIGN.md,
    "Failure rows"). Returns how many were reaped. Call inside a transaction holding the run lock."""
    now = timezone.now()
    # Rows another transaction holds are skipped (PostgreSQL; SQLite has one writer): a writer is
    # ending them and takes the run's lock after them, so waiting here would deadlock with it.
    expired = list(
        Rollout.objects.select_for_update(skip_locked=True)
        .filter(run_id=run_id, status=Rollout.Status.RUNNING, lease_until__lt=now)
        .values_list("id", "task_id", "task_index", "rollout_index", "attempt")
    )
    if not expired:
        return 0
    running = Run.objects.filter(pk=run_id, status=Run.Status.RUNNING).exists()
    # Of a run no longer running (cancelled meanwhile), the attempt ends as the run's others did.
    Rollout.objects.filter(id__in=[e[0] for e in expired], status=Rollout.Status.RUNNING).update(
        status=Rollout.Status.INTERRUPTED if running else Rollout.Status.CANCELLED,
        finished=now,
        lease_until=None,
        error="the worker running this attempt stopped (its lease expired); the key runs again"
        if running
        else "the run was cancelled while the worker running this attempt was gone (its lease expired)",
    )
    if running:
        Rollout.objects.bulk_create(
            [
                Rollout(run_id=run_id, task_id=t, task_index=ti, rollout_index=ri, attempt=a)
                for _, t, ti, ri, a in expired
            ]
        )
    log.warning(
        "run %s: %d rollout(s) of a dead worker were %s",
        run_id,
        len(expired),
        "queued again" if running else "ended (the run was cancelled)",
    )
    return len(expired)


def claim(run_id: int, worker: str, want: int, lease_s: float, reap: bool = True) -> list[tuple[int, str, int]]:
    """Atomically claim up to ``want`` pending rollouts of a running run, never letting the run's
    running attempts exceed its ``concurrency`` over all workers.

    Returns ``[(rollout_id, materialised task row JSON text, rollout_index)]``; empty when the run is
    not running or has no room. The run row is locked for the check-and-update
    (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's IMMEDIATE transactions serialise writers).
    Plain SQL with the values the ORM would send: a claim follows nearly every completion, and
    compiling its five queries each time was a large part of the dispatcher's CPU.
    """
    from django.db import connection

    qn = connection.ops.quote_name
    run_t, rollout_t, task_t = (qn(m._meta.db_table) for m in (Run, Rollout, Task))
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    running, pending = Rollout.Status.RUNNING, Rollout.Status.PENDING
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT status, concurrency FROM {run_t} WHERE id = %s{lock}", [run_id])
        run = cursor.fetchone()
        if not run or run[0] != Run.Status.RUNNING:
            return []
        if reap:
            reap_expired(run_id)
        cursor.execute(f"SELECT COUNT(*) FROM {rollout_t} WHERE run_id = %s AND status = %s", [run_id, running])
        room = min(want, run[1] - cursor.fetchone()[0])
        if room <= 0:
            return []
        cursor.execute(
            f"SELECT id FROM {rollout_t} WHERE run_id = %s AND status = %s "
            "ORDER BY task_index, rollout_index, id LIMIT %s",
            [run_id, pending, room],
        )
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return []
        now = timezone.now()
        dt = Rollout._meta.get_field("started")
        started, lease_until = (
            dt.get_db_prep_save(now, connection),
            dt.get_db_prep_save(now + timedelta(seconds=lease_s), connection),
        )
        rows: list[tuple[int, str, int]] = []
        for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            chunk = ids[i : i + 500]
            marks = ", ".join(["%s"] * len(chunk))
            cursor.execute(
                f"UPDATE {rollout_t} SET status = %s, worker = %s, started = %s, lease_until = %s "
                f"WHERE id IN ({marks}) AND status = %s",
                [running, worker, started, lease_until, *chunk, pending],
            )
            cursor.execute(
                f"SELECT r.id, t.row_json, r.rollout_index FROM {rollout_t} r JOIN {task_t} t ON t.id = r.task_id "
                f"WHERE r.id IN ({marks}) AND r.worker = %s AND r.status = %s",
                [*chunk, worker, running],
            )
            rows.extend(cursor.fetchall())
        return rows


def running_runs(only: set[int] | None) -> list[dict[str, Any]]:
    qs = Run.objects.filter(status=Run.Status.RUNNING)
    if only is not None:
        qs = qs.filter(pk__in=only)
    fields = (
        "id",
        "concurrency",
        "agent_url",
        "env_url",
        "max_steps",
        "remote_responses_timeout_s",
        "run_timeout_s",
        "env_max_in_flight",
    )
    out = list(qs.values(*fields))
    pending = set(
        Rollout.objects.filter(run_id__in=[r["id"] for r in out], status=Rollout.Status.PENDING)
        .values_list("run_id", flat=True)
        .distinct()
    )
    expired = set(
        Rollout.objects.filter(
            run_id__in=[r["id"] for r in out], status=Rollout.Status.RUNNING, lease_until__lt=timezone.now()
        )
        .values_list("run_id", flat=True)
        .distinct()
    )
    for r in out:
        r["pending"] = r["id"] in pending or r["id"] in expired
        r["expired"] = r["id"] in expired
    return out


def reap_run(run_id: int) -> int:
    """Reap run ``run_id``'s expired leases now, under the run's lock (``reap_expired``), whether or
    not the caller has room to claim: a dispatcher at its fair share makes no claim, and the keys of
    a dead worker then waited for some claim to reap them. Returns how many were reaped."""
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run_id).first()
        return reap_expired(run_id)


def heartbeat(
    name: str,
    run_ids: frozenset[int],
    inflight: int,
    capacity: int,
    lease_s: float,
    renew_within_s: float | None = None,
) -> tuple[int, dict[int, str]]:
    """Renew this dispatcher's leases of the runs ``run_ids`` (those it holds rollouts of) and its
    Worker row (``inflight``: rollouts in flight in it). ``renew_within_s``: only the leases that
    end within that many seconds are renewed (None: all); a caller beating every ``h`` seconds
    passes at least ``2 h``, so no lease ends between two beats. Each renewal is a row and index
    write: renewing every lease at every beat wrote every in-flight rollout's row every beat, however
    long its agent call. Returns (live dispatchers, status of each of ``run_ids``) — a cancel is
    noticed here."""
    now = timezone.now()
    if run_ids:
        due = None if renew_within_s is None else now + timedelta(seconds=renew_within_s)
        _renew_leases(name, run_ids, now + timedelta(seconds=lease_s), due)
    Worker.objects.update_or_create(
        name=name,
        defaults={
            "host": name.split(":")[0],
            "pid": os.getpid(),
            "last_seen": now,
            "inflight": inflight,
            "capacity": capacity,
        },
    )
    Worker.objects.filter(last_seen__lt=now - timedelta(seconds=max(60.0, 10 * lease_s))).delete()
    prometheus.add("gymweb_worker_heartbeats")
    _flush_metrics()
    live = Worker.objects.filter(last_seen__gte=now - timedelta(seconds=lease_s)).count()
    statuses = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "status"))
    return max(1, live), statuses


def _renew_leases(name: str, run_ids: frozenset[int], until, due=None) -> None:
    """Renew the leases of ``name``'s running attempts of ``run_ids`` (those that end before ``due``
    when it is given) to ``until``. By run, status and worker,
    not by the ids in flight: the same rows (a running attempt whose worker is this dispatcher is
    one it holds, or one whose result it has yet to write), read through the (run, status) index.
    On PostgreSQL rows another transaction holds are skipped (``SKIP LOCKED``): they are being
    ended, by this dispatcher's own write or by a reap, and waiting for that transaction held the
    heartbeat back past the lease on a busy machine (benchmarks/README.md, issue 27)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        rows = Rollout.objects.filter(run_id__in=run_ids, status=Rollout.Status.RUNNING, worker=name)
        if due is not None:
            rows = rows.filter(lease_until__lt=due)
        rows.update(lease_until=until)
        return
    table = connection.ops.quote_name(Rollout._meta.db_table)
    marks = ", ".join(["%s"] * len(run_ids))
    field = Rollout._meta.get_field("lease_until")
    lease = field.get_db_prep_save(until, connection)
    ending = "" if due is None else " AND lease_until < %s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET lease_until = %s WHERE id IN (SELECT id FROM {table} "
            f"WHERE run_id IN ({marks}) AND status = %s AND worker = %s{ending} FOR UPDATE SKIP LOCKED)",
            [
                lease,
                *sorted(run_ids),
                Rollout.Status.RUNNING,
                name,
                *([] if due is None else [field.get_db_prep_save(due, connection)]),
            ],
        )


def _flush_metrics() -> None:
    """Add this process's metric counts to the fleet's totals; a failure keeps them for next time."""
    try:
        prometheus.flush()
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        log.exception("the metric totals could not be written; they are kept for the next heartbeat")


def retire(name: str) -> None:
    _flush_metrics()
    Worker.objects.filter(name=name).delete()


def runs_left(run_ids: set[int]) -> dict[int, int]:
    """Attempts of each of ``run_ids`` that some worker still has to end, over every worker
    sharing the database: ``{run_id: n}``. Pending and running attempts count. A running attempt
    whose lease expired belonged to a dead worker: while its run is running it counts (it is
    reaped and runs again); once the run was cancelled or completed it is not waited for."""
    now = timezone.now()
    running_runs = Run.objects.filter(pk__in=run_ids, status=Run.Status.RUNNING).values("pk")
    rows = (
        Rollout.objects.filter(run_id__in=run_ids, status__in=Rollout.ACTIVE)
        .filter(Q(status=Rollout.Status.PENDING) | Q(lease_until__gte=now) | Q(run_id__in=running_runs))
        .values("run_id")
        .annotate(n=Count("id"))
        .values_list("run_id", "n")
    )
    left = {run_id: 0 for run_id in run_ids}
    left.update(dict(rows))
    return left


def supervise() -> str:
    """django-q2 scheduled job (and on every worker spawn): reap expired leases of every running run
    (their keys are queued again), finish runs with nothing left to do, and delete the runs and
    datasets whose upload or import died part-way (``collection.writing.sweep``), end the rollouts a
    dead worker held of runs cancelled since (they blocked delete and archive), fail the
    background tasks whose worker died (``background.reap``) and send again the queued ones no
    worker took (``background.resend``: a lost broker message)."""
    swept_runs, swept_datasets = writing.sweep()
    dead_tasks = background.reap()
    resent = background.resend()
    reaped = 0
    for run_id in Run.objects.filter(status=Run.Status.RUNNING).values_list("id", flat=True):
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run_id).first()
            reaped += reap_expired(run_id)
        runs.finish_if_done(run_id)
    # A run cancelled while a dead worker held some of its rollouts: no dispatcher ends those
    # (none serves a cancelled run), and the run could be neither deleted nor archived.
    stranded = (
        Rollout.objects.filter(status=Rollout.Status.RUNNING, lease_until__lt=timezone.now())
        .exclude(run__status=Run.Status.RUNNING)
        .values_list("run_id", flat=True)
        .distinct()
    )
    ended = 0
    for run_id in list(stranded):
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run_id).first()
            ended += reap_expired(run_id)
    swept = (
        f"; deleted {swept_runs} run(s) and {swept_datasets} dataset(s) left part-written"
        if swept_runs or swept_datasets
        else ""
    )
    dead = f"; failed {dead_tasks} background task(s) whose worker stopped" if dead_tasks else ""
    dead += f"; sent {resent} queued background task(s) again (no worker took them)" if resent else ""
    dead += f"; ended {ended} rollout(s) of cancelled runs whose worker stopped" if ended else ""
    return f"requeued {reaped} interrupted rollout(s){swept}{dead}"
