"""Workers: claim pending rollouts atomically, run them concurrently with asyncio, persist every step.

A *slice* is one django-q2 task working on one run in one process. It claims rollouts while its
run has room under ``concurrency`` (counted over all workers, under a lock on the run row), keeps
them in flight on one event loop with one shared HTTP client, and writes to the database only from
one dedicated thread, in batches, so the event loop never waits on the database (issue 4).

Bounds (DESIGN.md, known pitfalls): a slice claims new work for at most ``GYMWEB_SLICE_S`` seconds,
then enqueues a successor and only finishes what it holds, which takes at most the run's
``run_timeout_s``; django-q2's cluster timeout is derived from the largest allowed
``run_timeout_s``, so a slice is never killed mid-rollout. A claim carries a lease that the slice
renews; if its process dies, the lease expires and any slice of the run (or the supervisor) marks
the attempt ``interrupted`` (kill-shaped: not an attempt) and queues the key again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any, Callable, Optional

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from . import runs
from .loop import ItemRecord, LoopSettings, RolloutOutcome, StepRecord, make_client, run_rollout
from .models import AgentCall, Rollout, Run, Task, TrajectoryItem

log = logging.getLogger("gymweb.dispatch")

__all__ = ["enqueue_slices", "run_slice", "work_on_run", "supervise", "claim", "reap_expired"]


def worker_id() -> str:
    """A name for this slice: host, pid and a random suffix (shown on running rollouts)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _now() -> datetime:
    return timezone.now()


# -- claiming (runs in the DB thread) ------------------------------------------------------------
def reap_expired(run_id: int) -> int:
    """Attempts whose lease expired (their worker died) become ``interrupted`` and their keys get a
    new pending attempt with the same number: a killed rollout is not an attempt (DESIGN.md,
    "Failure rows"). Returns how many were reaped. Call inside a transaction holding the run lock."""
    now = _now()
    expired = list(
        Rollout.objects.filter(run_id=run_id, status=Rollout.Status.RUNNING, lease_until__lt=now).values_list(
            "id", "task_id", "task_index", "rollout_index", "attempt"
        )
    )
    if not expired:
        return 0
    Rollout.objects.filter(id__in=[e[0] for e in expired], status=Rollout.Status.RUNNING).update(
        status=Rollout.Status.INTERRUPTED,
        finished=now,
        error="the worker running this attempt stopped (its lease expired); the key runs again",
    )
    run_status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if run_status == Run.Status.RUNNING:
        Rollout.objects.bulk_create(
            [Rollout(run_id=run_id, task_id=t, task_index=ti, rollout_index=ri, attempt=a) for _, t, ti, ri, a in expired]
        )
    log.warning("run %s: %d rollout(s) interrupted by a dead worker were queued again", run_id, len(expired))
    return len(expired)


def claim(run_id: int, worker: str, want: int, lease_s: float) -> list[tuple[int, str, int]]:
    """Atomically claim up to ``want`` pending rollouts of a running run, never letting the run's
    running attempts exceed its ``concurrency`` over all workers.

    Returns ``[(rollout_id, materialised row JSON text, rollout_index)]``; empty when the run is not
    running or has no room. The run row is locked for the check-and-update (``select_for_update`` on
    PostgreSQL; SQLite's IMMEDIATE transactions serialise writers).
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).values("status", "concurrency").first()
        if not run or run["status"] != Run.Status.RUNNING:
            return []
        reap_expired(run_id)
        running = Rollout.objects.filter(run_id=run_id, status=Rollout.Status.RUNNING).count()
        room = min(want, run["concurrency"] - running)
        if room <= 0:
            return []
        ids = list(
            Rollout.objects.filter(run_id=run_id, status=Rollout.Status.PENDING)
            .order_by("task_index", "rollout_index", "id")
            .values_list("id", flat=True)[:room]
        )
        if not ids:
            return []
        now = _now()
        Rollout.objects.filter(id__in=ids, status=Rollout.Status.PENDING).update(
            status=Rollout.Status.RUNNING, worker=worker, started=now, lease_until=now + timedelta(seconds=lease_s)
        )
        rows = Rollout.objects.filter(id__in=ids, worker=worker, status=Rollout.Status.RUNNING).values_list(
            "id", "task__row_json", "rollout_index"
        )
        return list(rows)


# -- persistence (batched, in the DB thread) -----------------------------------------------------
@dataclass
class _Batch:
    calls: list[AgentCall] = field(default_factory=list)
    items: list[TrajectoryItem] = field(default_factory=list)
    seeds: dict[int, float] = field(default_factory=dict)
    finished: list[tuple[int, RolloutOutcome]] = field(default_factory=list)
    killed: list[tuple[int, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.calls or self.items or self.seeds or self.finished or self.killed)


def _item_row(rollout_id: int, rec: ItemRecord) -> TrajectoryItem:
    item = rec.item
    return TrajectoryItem(
        rollout_id=rollout_id,
        seq=rec.seq,
        step=rec.step,
        kind=str(item.get("type") or "")[:40],
        role=str(item.get("role") or "")[:20],
        call_id=str(item.get("call_id") or "")[:300],
        name=str(item.get("name") or "")[:300],
        origin=rec.origin,
        asked=rec.asked,
        paired=rec.paired,
        refused=rec.refused,
        latency_ms=rec.latency_ms,
        tool_status=rec.tool_status,
        payload=item,
    )


def _call_row(rollout_id: int, step: StepRecord) -> AgentCall:
    return AgentCall(
        rollout_id=rollout_id,
        index=step.index,
        started=datetime.fromtimestamp(step.started_at, tz=dt_timezone.utc),
        latency_ms=step.latency_ms,
        http_status=step.http_status,
        response_id=(step.response_id or "")[:300] if isinstance(step.response_id, str) else "",
        model=(step.model or "")[:300] if isinstance(step.model, str) else "",
        usage=step.usage,
        incomplete_details=step.incomplete_details,
        num_asks=step.num_asks,
        error=step.error or "",
    )


def _usage_fields(usage: Optional[dict[str, Any]]) -> dict[str, Any]:
    if not usage:
        return {"usage_reported": False}
    return {
        "usage_reported": True,
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
    }


def write_batch(batch: _Batch, worker: str) -> None:
    """Persist one batch in one short transaction (the DB thread only)."""
    now = _now()
    with transaction.atomic():
        if batch.calls:
            AgentCall.objects.bulk_create(batch.calls, ignore_conflicts=True)
        if batch.items:
            TrajectoryItem.objects.bulk_create(batch.items, ignore_conflicts=True)
        for rollout_id, seed_ms in batch.seeds.items():
            Rollout.objects.filter(pk=rollout_id).update(seed_ms=seed_ms)
        for rollout_id, out in batch.finished:
            fields = dict(
                status=Rollout.Status.SUCCEEDED if out.ok else Rollout.Status.FAILED,
                finished=now,
                lease_until=None,
                reward=out.reward if out.ok else 0.0,
                failure_kind=out.failure_kind or "",
                error=out.error or "",
                terminal=out.terminal,
                verify_json=json.dumps(out.verify_response, ensure_ascii=False) if out.ok else "",
                partial_response_json=""
                if out.ok or out.response is None
                else json.dumps(out.response, ensure_ascii=False),
                warnings=out.warnings,
                num_agent_calls=out.num_agent_calls,
                num_tool_calls=out.num_tool_calls,
                verify_ms=out.verify_ms,
                duration_ms=out.total_ms,
                **_usage_fields(out.usage),
            )
            if out.response is not None:
                fields["num_items"] = len(out.response.get("output") or [])
            if not Rollout.objects.filter(pk=rollout_id, status=Rollout.Status.RUNNING, worker=worker).update(**fields):
                # Our lease expired and the key was queued again: the newer attempt owns the key.
                log.warning("rollout %s finished after its lease was taken over; result dropped", rollout_id)
        for rollout_id, status in batch.killed:
            Rollout.objects.filter(pk=rollout_id, status=Rollout.Status.RUNNING, worker=worker).update(
                status=status, finished=now, lease_until=None,
                error="cancelled with its run" if status == Rollout.Status.CANCELLED else "its worker stopped; the key runs again",
            )
            if status == Rollout.Status.INTERRUPTED:
                r = Rollout.objects.filter(pk=rollout_id).values("task_id", "task_index", "rollout_index", "attempt", "run_id").first()
                if r and Run.objects.filter(pk=r["run_id"], status=Run.Status.RUNNING).exists():
                    Rollout.objects.create(run_id=r["run_id"], task_id=r["task_id"], task_index=r["task_index"], rollout_index=r["rollout_index"], attempt=r["attempt"])


class _Recorder:
    """The loop's observer for one rollout: queues rows for the next batch (never blocks)."""

    __slots__ = ("rollout_id", "slice")

    def __init__(self, rollout_id: int, slice_: "Slice"):
        self.rollout_id = rollout_id
        self.slice = slice_

    def on_seeded(self, latency_ms: float) -> None:
        self.slice.batch.seeds[self.rollout_id] = latency_ms

    def on_step(self, step: StepRecord, items: list[ItemRecord]) -> None:
        batch = self.slice.batch
        batch.calls.append(_call_row(self.rollout_id, step))
        batch.items.extend(_item_row(self.rollout_id, rec) for rec in items)

    def on_items(self, items: list[ItemRecord]) -> None:
        self.slice.batch.items.extend(_item_row(self.rollout_id, rec) for rec in items)


class Slice:
    """One process's share of one run. ``run()`` returns when the slice has nothing left to do."""

    def __init__(self, run_id: int, *, claim_for_s: Optional[float] = None, on_progress: Optional[Callable[[int], None]] = None):
        self.run_id = run_id
        self.worker = worker_id()
        self.claim_for_s = settings.GYMWEB_SLICE_S if claim_for_s is None else claim_for_s
        self.lease_s = settings.GYMWEB_LEASE_S
        self.heartbeat_s = settings.GYMWEB_HEARTBEAT_S
        self.poll_s = settings.GYMWEB_POLL_S
        self.flush_s = settings.GYMWEB_FLUSH_S
        self.batch = _Batch()
        self.inflight: dict[int, asyncio.Task] = {}
        self.db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gymweb-db")
        self.on_progress = on_progress
        self.handed_over = False
        self.cancelled = False

    async def _db(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.db, _db_call, fn, *args)

    async def _flush(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, _Batch()
            await self._db(write_batch, batch, self.worker)
            if self.on_progress and batch.finished:
                self.on_progress(len(batch.finished))

    async def _run_one(self, rollout_id: int, row: dict[str, Any], loop_settings: LoopSettings, client) -> None:
        try:
            outcome = await run_rollout(client, row, loop_settings, _Recorder(rollout_id, self))
        except asyncio.CancelledError:
            status = Rollout.Status.CANCELLED if self.cancelled else Rollout.Status.INTERRUPTED
            self.batch.killed.append((rollout_id, status))
            raise
        self.batch.finished.append((rollout_id, outcome))

    async def _sync(self, want: int) -> list[tuple[int, str, int]]:
        """Flush what is queued and claim up to ``want`` more, in one trip to the DB thread.
        Flushing first matters: finished rollouts free their slots in the run's count."""
        batch, self.batch = self.batch, _Batch()
        claimed = await self._db(_flush_and_claim, batch, self.run_id, self.worker, want, self.lease_s)
        if self.on_progress and batch.finished:
            self.on_progress(len(batch.finished))
        return claimed

    async def run(self) -> None:
        """Work on the run until it has nothing left for this slice (see the module docstring)."""
        run = await self._db(lambda: Run.objects.filter(pk=self.run_id).first())
        if run is None or run.status != Run.Status.RUNNING:
            return
        loop_settings = LoopSettings(
            agent_base_url=run.agent_url,
            env_base_url=run.env_url,
            max_steps=run.max_steps or None,
            remote_responses_timeout_s=run.remote_responses_timeout_s,
            run_timeout_s=run.run_timeout_s,
            retry_pause_s=settings.GYMWEB_CONNECT_RETRY_PAUSE_S,
        )
        client = make_client(run.concurrency)
        claim_until = time.monotonic() + self.claim_for_s
        next_beat = next_flush = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                claiming = now < claim_until and not self.cancelled
                want = run.concurrency - len(self.inflight) if claiming else 0
                claimed = await self._sync(want) if (want > 0 or self.batch) else []
                for rollout_id, row_json, rollout_index in claimed:
                    row = json.loads(row_json)
                    row["_ng_rollout_index"] = rollout_index
                    self.inflight[rollout_id] = asyncio.create_task(self._run_one(rollout_id, row, loop_settings, client))
                if not claiming and not self.handed_over and not self.cancelled:
                    # Claiming time is up: a successor takes new work while we finish ours.
                    self.handed_over = True
                    await self._db(enqueue_slices, self.run_id, 1)
                if not self.inflight:
                    if not claiming:
                        break
                    state = await self._db(_run_state, self.run_id)
                    if state["status"] != Run.Status.RUNNING or (state["pending"] == 0 and state["running"] == 0):
                        break
                    # No room now, or others hold the rest: wait, so an interrupted key or a
                    # freed slot is picked up soon, without spinning on the database.
                    await asyncio.sleep(self.poll_s)
                    continue
                timeout = max(0.0, min(self.poll_s, next_flush - time.monotonic()))
                done, _ = await asyncio.wait(self.inflight.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if done:
                    self.inflight = {k: v for k, v in self.inflight.items() if not v.done()}
                now = time.monotonic()
                if now >= next_flush:
                    next_flush = now + self.flush_s
                    if not done:  # a completion syncs at the top of the loop anyway
                        batch, self.batch = self.batch, _Batch()
                        if batch:
                            await self._db(write_batch, batch, self.worker)
                if now >= next_beat:
                    next_beat = now + self.heartbeat_s
                    status = await self._db(_heartbeat, self.run_id, self.worker, list(self.inflight), self.lease_s)
                    if status != Run.Status.RUNNING:
                        self.cancelled = status == Run.Status.CANCELLED
                        await self._cancel_inflight()
                        claim_until = 0.0
            await self._flush()
        except asyncio.CancelledError:
            self.cancelled = False
            await self._cancel_inflight()
            await self._flush()
            raise
        finally:
            await client.aclose()
            await self._db(runs.finish_if_done, self.run_id)
            self.db.shutdown(wait=True)

    async def _cancel_inflight(self) -> None:
        tasks = list(self.inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.inflight.clear()


def _db_call(fn: Callable, *args: Any) -> Any:
    close_old_connections()
    return fn(*args)


def _flush_and_claim(batch: _Batch, run_id: int, worker: str, want: int, lease_s: float) -> list[tuple[int, str, int]]:
    if batch:
        write_batch(batch, worker)
    return claim(run_id, worker, want, lease_s) if want > 0 else []


def _run_state(run_id: int) -> dict[str, Any]:
    now = _now()
    status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
    qs = Rollout.objects.filter(run_id=run_id)
    return {
        "status": status,
        "pending": qs.filter(status=Rollout.Status.PENDING).count(),
        "running": qs.filter(status=Rollout.Status.RUNNING).count(),
        "expired": qs.filter(status=Rollout.Status.RUNNING, lease_until__lt=now).count(),
    }


def _heartbeat(run_id: int, worker: str, rollout_ids: list[int], lease_s: float) -> str:
    """Renew our leases; return the run's status (a cancel is noticed here)."""
    if rollout_ids:
        Rollout.objects.filter(id__in=rollout_ids, worker=worker, status=Rollout.Status.RUNNING).update(
            lease_until=_now() + timedelta(seconds=lease_s)
        )
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first() or ""


# -- django-q2 entry points --------------------------------------------------------------------
def work_on_run(run_id: int) -> str:
    """django-q2 task: one slice of a run in this worker process. Returns a short summary."""
    started = time.monotonic()
    asyncio.run(Slice(run_id).run())
    return f"run {run_id}: slice done in {time.monotonic() - started:.1f} s"


def enqueue_slices(run_id: int, slices: Optional[int] = None) -> None:
    """Queue ``slices`` django-q2 tasks for a run (default ``GYMWEB_SLICES_PER_RUN``)."""
    from django_q.tasks import async_task

    for _ in range(slices or settings.GYMWEB_SLICES_PER_RUN):
        async_task("rollouts.dispatch.work_on_run", run_id, task_name=f"run-{run_id}-slice", group=f"run-{run_id}")


def supervise() -> str:
    """django-q2 scheduled task: keep every running run moving.

    Reaps expired leases and queues a slice for any running run that has pending work but no live
    worker (no lease renewed recently), e.g. after its only worker was killed.
    """
    now = _now()
    revived = 0
    for run_id in Run.objects.filter(status=Run.Status.RUNNING).values_list("id", flat=True):
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run_id).first()
            reap_expired(run_id)
        live = Rollout.objects.filter(run_id=run_id, status=Rollout.Status.RUNNING, lease_until__gte=now).exists()
        pending = Rollout.objects.filter(run_id=run_id, status=Rollout.Status.PENDING).exists()
        if pending and not live:
            enqueue_slices(run_id, 1)
            revived += 1
        elif not pending and not live:
            runs.finish_if_done(run_id)
    return f"revived {revived} run(s)"


def run_in_process(run_id: int, slices: int = 1, on_progress: Optional[Callable[[int], None]] = None) -> None:
    """Run a whole run in this process (the CLI's path: no separate worker needed). Same slices as
    the workers, several on one event loop when ``slices`` > 1."""

    async def main() -> None:
        while True:
            await asyncio.gather(*(Slice(run_id, claim_for_s=float("inf"), on_progress=on_progress).run() for _ in range(slices)))
            state = await asyncio.get_running_loop().run_in_executor(None, _db_call, _run_state, run_id)
            if state["status"] != Run.Status.RUNNING or (state["pending"] == 0 and state["running"] == 0):
                break
            await asyncio.sleep(0.1)

    asyncio.run(main())
