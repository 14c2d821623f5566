"""The dispatcher: one thread with one event loop and one shared HTTP client that serves every
running run (or the runs it is given), claiming rollouts while a run has room and its own fair
share is not used up, running them with the engine's loop, and handing every row to its database
thread in batches. Stopping releases what it holds at once (``Dispatcher._release``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections

from rollouts import targets
from rollouts.collection import runs
from rollouts.collection.run_settings import NOT_ASKED
from rollouts.engine.contract import prepare_reply_validation
from rollouts.engine.env_gate import EnvGate
from rollouts.engine.failures import FailureKind
from rollouts.engine.loop import ItemRecord, LoopSettings, RolloutOutcome, StepRecord, run_rollout
from rollouts.models import Rollout, Run
from rollouts.nemo import miswiring
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME
from rollouts.operations import prometheus
from rollouts.workers import wakeup
from rollouts.workers.claims import claim, heartbeat, reap_run, retire, running_runs, runs_left
from rollouts.workers.dbthread import DbThread, db_call
from rollouts.workers.tuning import collector_tuned, raise_fd_limit
from rollouts.workers.writer import Batch, call_row, item_row, write_batch

log = logging.getLogger("gymweb.dispatch")

__all__ = ["Dispatcher", "finish_idle", "worker_name"]


def worker_name() -> str:
    """A unique name for a dispatcher: host, pid and a random suffix (shown on running rollouts)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class _Recorder:
    """The loop's observer for one rollout: queues rows for the next batch (never blocks)."""

    __slots__ = ("rollout_id", "dispatcher", "tool_items")

    def __init__(self, rollout_id: int, dispatcher: Dispatcher):
        self.rollout_id = rollout_id
        self.dispatcher = dispatcher
        # (item, origin) of the tool calls and results, for the mis-wiring check at the end
        self.tool_items: list[tuple[dict[str, Any], str]] = []

    def on_seeded(self, latency_ms: float) -> None:
        self.dispatcher.batch.seeds[self.rollout_id] = latency_ms

    def _keep_tools(self, items: list[ItemRecord]) -> None:
        self.tool_items.extend(
            (rec.item, rec.origin) for rec in items if rec.kind in ("function_call", "function_call_output")
        )

    def on_step(self, step: StepRecord, items: list[ItemRecord]) -> None:
        batch = self.dispatcher.batch
        batch.calls.append(call_row(self.rollout_id, step))
        batch.items.extend(item_row(self.rollout_id, rec) for rec in items)
        self._keep_tools(items)

    def on_items(self, items: list[ItemRecord]) -> None:
        self.dispatcher.batch.items.extend(item_row(self.rollout_id, rec) for rec in items)
        self._keep_tools(items)

    def miswiring_warning(self, row: dict[str, Any]) -> str | None:
        """The rollout's warning when its agent reported results of the env's tools that the env
        never executed (``rollouts.nemo.miswiring``), else None."""
        if not self.tool_items:
            return None
        unexecuted = miswiring.unexecuted_tool_results(
            self.tool_items, miswiring.declared_tools(row.get("responses_create_params"))
        )
        return miswiring.rollout_warning(unexecuted) if unexecuted else None


@dataclass
class _RunInfo:
    """What a dispatcher needs of a running run (refreshed every poll)."""

    id: int
    concurrency: int
    settings: LoopSettings
    pending: bool


def _release_held(batch: Batch, worker: str, after_finish: bool) -> None:
    """A stopping dispatcher's last write: its batch (partial trajectories, finished results and
    the ``interrupted`` rows of the rollouts it cancelled, whose keys get a pending attempt with
    the same number), runs left with nothing to do completed, and its ``Worker`` row removed."""
    if batch:
        write_batch(batch, worker)
    finish_idle(sorted(batch.run_ids), after_finish)
    retire(worker)


def _flush_and_claim(
    batch: Batch, worker: str, wants: list[tuple[int, int]], lease_s: float, reap: bool = False
) -> list[tuple[int, int, str, int]]:
    if batch:
        write_batch(batch, worker)
    claimed: list[tuple[int, int, str, int]] = []
    for run_id, want in wants:
        claimed.extend((run_id, *row) for row in claim(run_id, worker, want, lease_s, reap=reap))
    prometheus.record_claimed(len(claimed))
    return claimed


def finish_idle(run_ids: list[int], after_finish: bool = True) -> None:
    """Complete runs that have nothing left; a worker then queues the /aggregate_metrics call
    (not for a run launched without it: ``NOT_ASKED``, a training loop's batch)."""
    from django_q.tasks import async_task

    for run_id in run_ids:
        if (
            runs.finish_if_done(run_id)
            and after_finish
            and not Run.objects.filter(pk=run_id, aggregate_metrics_error=NOT_ASKED).exists()
        ):
            async_task(
                "rollouts.evaluation.run_aggregate_metrics.fetch_aggregate_metrics",
                run_id,
                task_name=f"run-{run_id}-aggregate",
            )


class Dispatcher:
    """Runs rollouts of every running run (or of ``only`` runs) in this process.

    ``capacity``: most rollouts in flight in this process over all runs (memory bound; default
    ``GYMWEB_PROCESS_CAPACITY``). ``exit_when_idle`` (the CLI, with ``only``): return once every
    attempt of those runs has ended, on any worker sharing the database (``runs_left``); otherwise
    it serves until ``stop()`` or until the process's main thread ends. ``on_progress(left)``
    (with ``only``): called after each poll with how many attempts of those runs are still pending
    or running over all workers.
    """

    _next_flush: float  # monotonic time of the next flush (set when serving starts)

    def __init__(
        self,
        *,
        only: set[int] | None = None,
        exit_when_idle: bool = False,
        capacity: int | None = None,
        on_progress: Callable[[int], None] | None = None,
    ):
        if exit_when_idle and not only:
            raise ValueError("exit_when_idle needs the runs to wait for (only=)")
        self.name = worker_name()
        self.only = only
        self.exit_when_idle = exit_when_idle
        self.capacity = capacity or settings.GYMWEB_PROCESS_CAPACITY
        self.on_progress = on_progress
        self.lease_s = settings.GYMWEB_LEASE_S
        self.heartbeat_s = settings.GYMWEB_HEARTBEAT_S
        self.poll_s = settings.GYMWEB_POLL_S
        self.flush_s = settings.GYMWEB_FLUSH_S
        self.release_timeout_s = settings.GYMWEB_RELEASE_TIMEOUT_S
        self.env_gate = EnvGate(settings.GYMWEB_ENV_MAX_IN_FLIGHT)
        self.batch = Batch()
        self.tasks: dict[int, asyncio.Task] = {}  # rollout id -> task
        self.run_of: dict[int, int] = {}  # rollout id -> run id
        self.inflight: dict[int, int] = {}  # run id -> rollouts of it in flight here
        # Ended tasks, pushed by their done callbacks: a turn costs O(what ended), not O(in flight)
        # (asyncio.wait over every task adds and removes a callback per task on every call).
        self._ended: list[int] = []
        self._next_sync = 0.0
        self._freed = 0  # slots freed by ended rollouts since the last trip to the DB thread
        self.cancelling: set[int] = set()  # runs whose in-flight rollouts end as `cancelled`
        self.runs: dict[int, _RunInfo] = {}
        self.live_workers = 1  # set by each heartbeat (the lease keeper's thread)
        self._held_runs: frozenset[int] = frozenset()  # runs with rollouts in flight here, for the keeper
        self._statuses: dict[int, str] | None = None  # the statuses of held runs, when one stopped
        self._keeper_stop = threading.Event()
        self.left: int | None = None  # attempts of the `only` runs not yet ended, over all workers
        self._reap_due = True
        self.db: DbThread | None = None  # started by run()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    # -- control from other threads -----------------------------------------------------------
    def stop(self) -> None:
        """Ask the dispatcher to release what it holds and return (thread-safe)."""
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # its loop already closed: it has returned
                pass

    @property
    def stop_requested(self) -> bool:
        """True once ``stop()`` was called (or the dispatcher stopped by itself)."""
        return self._stop.is_set()

    def poke(self) -> None:
        """Look at the running runs at once instead of at the next poll (thread-safe; called by
        the ``wakeup.Watcher`` when a run is launched)."""
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._poked)
            except RuntimeError:  # its loop already closed
                pass

    def _poked(self) -> None:
        self._next_poll = 0.0
        if self._wake is not None:
            self._wake.set()

    # -- internals -----------------------------------------------------------------------------
    async def _db(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.wrap_future(self.db.submit(db_call, fn, *args))

    def _inflight_of(self, run_id: int) -> int:
        return self.inflight.get(run_id, 0)

    def _wants(self) -> list[tuple[int, int]]:
        if self._stop.is_set():
            return []
        free = self.capacity - len(self.tasks)
        wants = []
        for info in self.runs.values():
            if free <= 0 or not info.pending or info.id in self.cancelling:
                continue
            share = math.ceil(info.concurrency / self.live_workers)
            want = min(free, share - self._inflight_of(info.id))
            if want > 0:
                wants.append((info.id, want))
                free -= want
        return wants

    # A trip to the DB thread for a few freed slots is put off for at most SYNC_GAP_S after the
    # previous trip, so that slots freed one by one are claimed together (each claim is a locked
    # transaction of five queries); a trip goes at once when at least 1/CLAIM_CHUNK_DIV of the
    # dispatcher's share is free, when nothing is in flight, or when the flush is due. Finished
    # results wait for the next trip (within SYNC_GAP_S), not for the flush: a stream reads them.
    SYNC_GAP_S = 0.01
    CLAIM_CHUNK_DIV = 8

    async def _sync(self) -> None:
        """Flush what is queued and claim what there is room for, in one trip to the DB thread.
        Flushing first matters: finished rollouts free their slots in the runs' counts."""
        wants = self._wants()
        if not self.batch and not wants:
            return
        now = time.monotonic()
        if self.tasks and now < self._next_sync and now < self._next_flush:
            chunk = max(
                1, sum(math.ceil(i.concurrency / self.live_workers) for i in self.runs.values()) // self.CLAIM_CHUNK_DIV
            )
            if sum(w for _, w in wants) < chunk:
                return
        batch, self.batch = self.batch, Batch()
        self._freed = 0
        # Expired leases are looked for once per poll, not on every claim: claims are frequent.
        reap, self._reap_due = self._reap_due, False
        try:
            claimed = await self._db(_flush_and_claim, batch, self.name, wants, self.lease_s, reap)
        except Exception:
            self.batch = batch.absorb(self.batch)  # written again at the next sync
            raise
        finally:
            self._next_sync = time.monotonic() + self.SYNC_GAP_S
            self._next_flush = time.monotonic() + self.flush_s
        if self.exit_when_idle and not self.tasks and (batch.finished or batch.killed):
            self._next_poll = 0.0  # its last rollouts are stored: see at once whether the run has ended
        if self._stopping():
            # Stopped while this claim was under way: the claimed rollouts never start, and
            # _release hands them back as pending (no attempt happened).
            self.batch.unclaimed.extend(rollout_id for _, rollout_id, _, _ in claimed)
            return
        for run_id, rollout_id, row_json, rollout_index in claimed:
            row = json.loads(row_json)
            row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
            self.run_of[rollout_id] = run_id
            self.inflight[run_id] = self.inflight.get(run_id, 0) + 1
            task = self.tasks[rollout_id] = asyncio.create_task(self._run_one(rollout_id, run_id, row))
            task.add_done_callback(lambda _t, r=rollout_id: self._task_ended(r))  # type: ignore[misc]
        if claimed:
            self._held_runs = frozenset(self.inflight) | frozenset(self.batch.run_ids)

    def _task_ended(self, rollout_id: int) -> None:
        self._ended.append(rollout_id)
        if self._wake is not None:
            self._wake.set()

    async def _run_one(self, rollout_id: int, run_id: int, row: dict[str, Any]) -> None:
        info = self.runs[run_id]
        recorder = _Recorder(rollout_id, self)
        try:
            outcome = await run_rollout(self.client, row, info.settings, recorder, self.env_gate)
            warning = recorder.miswiring_warning(row)
            if warning:
                outcome.warnings.append(warning)
        except Exception as exc:  # the loop turns failures into outcomes; this is the last guard
            log.exception("rollout %s crashed", rollout_id)
            outcome = RolloutOutcome(
                ok=False,
                failure_kind=FailureKind.INTERNAL_ERROR,
                error=f"gymweb internal error: {exc.__class__.__name__}: {exc}",
                agent_url=info.settings.agent_base_url,
                env_url=info.settings.env_base_url,
            )
        except asyncio.CancelledError:
            status = Rollout.Status.CANCELLED if run_id in self.cancelling else Rollout.Status.INTERRUPTED
            self.batch.killed.append((rollout_id, status))  # type: ignore[arg-type]
            self.batch.run_ids.add(run_id)
            raise
        self.batch.finished.append((rollout_id, outcome))
        self.batch.run_of[rollout_id] = run_id
        self.batch.run_ids.add(run_id)

    async def _refresh_runs(self) -> None:
        rows = await self._db(running_runs, self.only)
        fresh = {}
        for r in rows:
            known = self.runs.get(r["id"])
            if known is None:
                log.info(
                    "run %s: worker %s serves it (concurrency %s)",
                    r["id"],
                    self.name,
                    r["concurrency"],
                    extra={"run": r["id"], "worker": self.name},
                )
            # The run's bound on env calls is run-wide: this process's fair part of it, as for concurrency.
            env_bound = math.ceil(r["env_max_in_flight"] / max(1, self.live_workers)) if r["env_max_in_flight"] else 0
            # a retry may have moved the env (a NeMo Gym resources server resolved again by name)
            same = known and (
                known.settings.agent_base_url,
                known.settings.env_base_url,
                known.settings.env_max_in_flight,
            ) == (r["agent_url"], r["env_url"], env_bound)
            loop_settings = (
                known.settings
                if same
                else LoopSettings(
                    agent_base_url=r["agent_url"],
                    env_base_url=r["env_url"],
                    max_steps=r["max_steps"] or None,
                    remote_responses_timeout_s=r["remote_responses_timeout_s"],
                    run_timeout_s=r["run_timeout_s"],
                    retry_pause_s=settings.GYMWEB_CONNECT_RETRY_PAUSE_S,
                    connect_retry_budget_s=settings.GYMWEB_CONNECT_RETRY_BUDGET_S,
                    refused_reply_max_bytes=settings.GYMWEB_FAILED_REPLY_MAX_BYTES,
                    env_max_in_flight=env_bound,
                )
            )
            fresh[r["id"]] = _RunInfo(r["id"], r["concurrency"], loop_settings, r["pending"])
        # Runs we still hold rollouts of stay known until those end.
        for run_id in set(self.run_of.values()) - set(fresh):
            fresh[run_id] = self.runs[run_id]
            fresh[run_id].pending = False
        self.runs = fresh
        self._reap_due = True
        for r in rows:
            if r["expired"] and r["id"] not in self.cancelling:
                # A dead worker's rollouts run again now, not at this dispatcher's next claim
                # (none comes while it is at its share).
                await self._db(reap_run, r["id"])
        held = set(self.run_of.values())
        idle = [run_id for run_id, info in fresh.items() if not info.pending and run_id not in held]
        if idle:
            # Completes each run whose attempts have all ended, on every worker (finish_if_done).
            await self._db(finish_idle, idle, not self.exit_when_idle)
        if self.only and (self.exit_when_idle or self.on_progress):
            self.left = sum((await self._db(runs_left, self.only)).values())
            if self.on_progress:
                self.on_progress(self.left)

    async def _cancel(self, rollout_ids: list[int]) -> None:
        tasks = [self.tasks[r] for r in rollout_ids if r in self.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._ended.extend(r for r in rollout_ids if r in self.tasks and self.tasks[r].done())
        self._reap_done()

    def _reap_done(self) -> int:
        """Forget the tasks that ended (as their callbacks reported); returns how many."""
        ended, self._ended = self._ended, []
        n = 0
        for rollout_id in ended:
            if self.tasks.pop(rollout_id, None) is None:
                continue  # reported twice (a cancel and its callback)
            run_id = self.run_of.pop(rollout_id)
            left = self.inflight[run_id] - 1
            if left:
                self.inflight[run_id] = left
            else:
                del self.inflight[run_id]
                # its results wait in the batch (batch.run_ids): their leases are still renewed
                self._held_runs = frozenset(self.inflight) | frozenset(self.batch.run_ids)
            n += 1
        self._freed += n
        return n

    def _keep_leases(self) -> None:
        """The lease keeper's thread: every ``heartbeat_s`` renew this dispatcher's leases and its
        ``Worker`` row on the thread's own database connection, whatever the event loop and the DB
        thread are doing. A loop busy with a wave of thousands of replies, or a DB thread writing a
        large batch, on a machine short of CPU, went longer than a lease without a heartbeat, and
        every rollout in flight was reaped while it still ran (benchmarks/README.md, issue 27)."""
        while not self._keeper_stop.wait(self.heartbeat_s):
            try:
                live, statuses = db_call(
                    heartbeat,
                    self.name,
                    self._held_runs,
                    len(self.tasks),
                    self.capacity,
                    self.lease_s,
                    max(2 * self.lease_s / 3, 4 * self.heartbeat_s),  # renewed once a third has passed, 4 beats early
                )
            except Exception:
                log.exception("dispatcher %s: a heartbeat failed; trying again in %.1f s", self.name, self.heartbeat_s)
                continue
            self.live_workers = live
            if any(status != Run.Status.RUNNING for status in statuses.values()):
                self._statuses = statuses
                self.poke()
        connections.close_all()  # this thread's own connection

    async def _act_on_statuses(self) -> None:
        """Cancel the in-flight rollouts of runs the last heartbeat found stopped (cancelled,
        paused or completed elsewhere)."""
        statuses, self._statuses = self._statuses, None
        if not statuses:
            return
        stopped = [run_id for run_id, status in statuses.items() if status != Run.Status.RUNNING]
        for run_id in stopped:
            if statuses[run_id] == Run.Status.CANCELLED:
                self.cancelling.add(run_id)
            await self._cancel([r for r, rid in self.run_of.items() if rid == run_id])
            # The run may be resumed later: only the rollouts just ended are "cancelled".
            self.cancelling.discard(run_id)

    async def run(self) -> None:
        """Serve until stopped (or, with ``exit_when_idle``, until its runs' attempts have all
        ended on every worker), then release and write what is held. An error in one step (a
        locked or unreachable database, a bug) is logged and the step is tried again: no failure
        stops a worker (DESIGN.md, "Failure rows")."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self._stop.is_set():  # stopped before it started: nothing to serve, nothing held
            return
        prepare_reply_validation()  # before any rollout is in flight, not at the first reply
        self.db = DbThread()
        # The DB thread's ORM work holds the GIL in 5 ms slices by default, which adds up to that
        # much latency to every HTTP step of every in-flight rollout; hand the GIL over sooner.
        sys.setswitchinterval(0.0005)
        # The instance's target policy and reply cap apply to every request of every rollout
        # (rollouts.targets): a refused host or an oversized reply is a failure row of its own kind.
        raise_fd_limit(2 * self.capacity + 64)
        self.client = targets.async_client(max(self.capacity, 32))
        self._next_poll = self._next_flush = 0.0
        # The first heartbeat before the first claim: the fair share needs the live workers.
        self.live_workers, self._statuses = await self._db(
            heartbeat, self.name, self._held_runs, 0, self.capacity, self.lease_s
        )
        keeper = threading.Thread(target=self._keep_leases, name="gymweb-lease", daemon=True)
        keeper.start()
        # A launched run wakes a dispatcher that serves every run (rollouts.workers.wakeup).
        watcher = wakeup.Watcher(self.poke).start() if self.only is None else None
        try:
            with collector_tuned(settings.GYMWEB_GC_THRESHOLD):
                await self._serve(keeper)
        finally:
            if watcher is not None:
                watcher.stop()

    async def _serve(self, keeper: threading.Thread) -> None:
        try:
            while not self._stop.is_set():
                try:
                    if await self._step():
                        break
                except Exception:
                    if self._stopping():
                        break
                    log.exception("dispatcher %s: a step failed; trying again in %.1f s", self.name, self.poll_s)
                    await asyncio.sleep(self.poll_s)
        finally:
            self._stop.set()  # from here on nothing is claimed
            # No heartbeat after the release retires this dispatcher's Worker row.
            self._keeper_stop.set()
            # Polled, not joined in an executor: a worker process's stop ends the interpreter's
            # executors first (see DbThread).
            deadline = time.monotonic() + self.heartbeat_s + self.release_timeout_s
            while keeper.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await self._release()

    def _stopping(self) -> bool:
        """True once the dispatcher was asked to stop or its process is ending: the process's main
        thread has returned, which is how a django-q2 worker process ends on a cluster stop
        (SIGTERM or SIGINT to the cluster's main process, Ctrl-C)."""
        if self._stop.is_set():
            return True
        main_thread = threading.main_thread()
        if threading.current_thread() is not main_thread and not main_thread.is_alive():
            self._stop.set()
            return True
        return False

    async def _step(self) -> bool:
        """One turn of the loop; True when the dispatcher should stop."""
        if self._stopping():
            return True
        now = time.monotonic()
        if self._statuses:
            await self._act_on_statuses()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_s
            await self._refresh_runs()
            if self.exit_when_idle and not self.tasks and not self.batch and self.left == 0:
                return True
        if self._stopping():
            return True
        await self._sync()
        if not self.tasks:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, self._next_poll - time.monotonic()))
            except TimeoutError:
                pass
            return False
        deadline = min(self._next_poll, self._next_flush)
        if (self._freed and self._wants()) or self.batch.finished:
            deadline = min(deadline, self._next_sync)  # slots were freed or results wait: go soon
        timeout = max(0.0, deadline - time.monotonic())
        if not self._ended and timeout > 0:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)
            except TimeoutError:
                pass
        done = self._reap_done()
        if not done and time.monotonic() >= self._next_flush:
            self._next_flush = time.monotonic() + self.flush_s
            batch, self.batch = self.batch, Batch()
            if batch:
                try:
                    await self._db(write_batch, batch, self.name)
                except Exception:
                    self.batch = batch.absorb(self.batch)
                    raise
        return False

    async def _release(self) -> None:
        """Release what this dispatcher holds, without waiting for any lease to expire: its
        in-flight rollouts are cancelled and become ``interrupted`` (``cancelled`` when their run
        was cancelled) with the steps they had taken; each interrupted key gets a new pending
        attempt with the same number (a killed rollout is not an attempt: DESIGN.md, "Failure
        rows"); what is held is written; runs left with nothing to do are completed. Bounded by
        ``GYMWEB_RELEASE_TIMEOUT_S``: a database that stays unreachable that long leaves the rows
        claimed, and their leases expiring requeues them (logged, without a traceback)."""
        deadline = time.monotonic() + self.release_timeout_s
        held = dict(self.run_of)
        await self._cancel(list(self.tasks))
        released = False
        try:
            while True:
                batch, self.batch = self.batch, Batch()
                try:
                    await asyncio.wait_for(
                        self._db(_release_held, batch, self.name, not self.exit_when_idle),
                        timeout=max(0.1, deadline - time.monotonic()),
                    )
                    released = True
                    break
                except (TimeoutError, OperationalError, InterfaceError) as exc:
                    self.batch = batch.absorb(self.batch)
                    why = f"{exc.__class__.__name__}: {exc}".rstrip(": ")
                except Exception as exc:  # a bug: its traceback belongs in the log, once
                    self.batch = batch.absorb(self.batch)
                    log.exception("dispatcher %s: releasing what it holds failed", self.name)
                    why = f"{exc.__class__.__name__}: {exc}"
                if time.monotonic() + 1.0 >= deadline:
                    log.error(
                        "dispatcher %s: could not release %d in-flight rollout(s) within %g s "
                        "(GYMWEB_RELEASE_TIMEOUT_S; last error: %s); "
                        "they run again once their lease expires (GYMWEB_LEASE_S = %g s)",
                        self.name,
                        len(held),
                        self.release_timeout_s,
                        why,
                        self.lease_s,
                    )
                    break
                log.warning("dispatcher %s: the database refused the release (%s); trying again in 1 s", self.name, why)
                await asyncio.sleep(1.0)
            if released and held:
                by_run = ", ".join(f"run {r}: {n}" for r, n in sorted(Counter(held.values()).items()))
                log.info(
                    "dispatcher %s stopped: released %d in-flight rollout(s) (%s); their keys are queued again",
                    self.name,
                    len(held),
                    by_run,
                )
        finally:
            await self.client.aclose()
            # Close the DB thread's own connection: left to the garbage collector it stays open, and
            # PostgreSQL then refuses to drop or migrate the database while "other users" are on it.
            try:
                await asyncio.wait_for(self._db(connections.close_all), timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                pass  # nothing left to release; the process is going away
            self.db.shutdown(timeout=max(0.1, deadline - time.monotonic()))
