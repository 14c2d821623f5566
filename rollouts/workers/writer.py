"""Batched writes of a dispatcher (its database thread only): a ``Batch`` of agent calls,
trajectory items, seed latencies, results, killed and unclaimed attempts, written in one short
transaction; a batch the database cannot store whole is written part by part, and a rollout with a
part that could not be stored ends as a ``storage_failed`` failure."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from rollouts.bulk import insert_ignoring_conflicts
from rollouts.collection.notify import notify_results
from rollouts.collection.profile_numbers import profile_json_for_verify
from rollouts.engine.failures import FailureKind
from rollouts.engine.loop import ItemRecord, RolloutOutcome, StepRecord
from rollouts.engine.nemo_request import agent_result
from rollouts.lossless import dumps
from rollouts.models import AgentCall, RefusedReply, Rollout, Run, TrajectoryItem
from rollouts.operations import prometheus
from rollouts.search import fill_missing
from rollouts.workers.sql import finish_rollout, finish_rollouts

log = logging.getLogger("gymweb.dispatch")

__all__ = ["TOKENS_MAX", "Batch", "CallRow", "ItemRow", "call_row", "item_row", "write_batch"]


SEED_BATCH = 1000  # rollouts' seed_ms per UPDATE statement


@dataclass(slots=True)
class CallRow:
    """An ``AgentCall`` row to insert, by attribute name: built for every step of every rollout in
    the event loop, where a model instance's ``__init__`` costs ten times as much."""

    rollout_id: int
    index: int
    started: datetime
    latency_ms: float
    http_status: int | None
    response_id: str
    model: str
    usage: Any
    incomplete_details: Any
    num_asks: int
    error: str


@dataclass(slots=True)
class ItemRow:
    """A ``TrajectoryItem`` row to insert, by attribute name (see ``CallRow``); ``search_text`` is
    filled by the writer (``fill_missing``)."""

    rollout_id: int
    seq: int
    step: int
    kind: str
    role: str
    call_id: str
    name: str
    origin: str
    asked: bool
    paired: bool
    refused: bool
    latency_ms: float | None
    tool_status: int | None
    payload: Any
    search_text: str = ""


def _as_model(model: type, row: Any) -> Any:
    """``row`` (a ``CallRow``/``ItemRow`` or already a model instance) as an unsaved ``model``."""
    if isinstance(row, model):
        return row
    return model(**{name: getattr(row, name) for name in row.__slots__})


@dataclass
class Batch:
    """What a dispatcher hands its database thread in one trip. ``calls`` and ``items``:
    ``CallRow``/``ItemRow`` (or model instances of ``AgentCall``/``TrajectoryItem``)."""

    calls: list[Any] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)
    seeds: dict[int, float] = field(default_factory=dict)
    finished: list[tuple[int, RolloutOutcome]] = field(default_factory=list)
    killed: list[tuple[int, str]] = field(default_factory=list)
    unclaimed: list[int] = field(default_factory=list)  # claimed by a stopping dispatcher, never started
    run_ids: set[int] = field(default_factory=set)  # runs whose rollouts ended in this batch
    run_of: dict[int, int] = field(default_factory=dict)  # finished rollout id -> its run id

    def __bool__(self) -> bool:
        return bool(self.calls or self.items or self.seeds or self.finished or self.killed or self.unclaimed)

    def absorb(self, newer: Batch) -> Batch:
        """This (older, unwritten) batch followed by ``newer``: nothing is lost or reordered."""
        self.calls += newer.calls
        self.items += newer.items
        self.seeds.update(newer.seeds)
        self.finished += newer.finished
        self.killed += newer.killed
        self.unclaimed += newer.unclaimed
        self.run_ids |= newer.run_ids
        self.run_of.update(newer.run_of)
        return self


def item_row(rollout_id: int, rec: ItemRecord) -> ItemRow:
    """The ``TrajectoryItem`` row of one item the loop recorded."""
    item = rec.item
    return ItemRow(
        rollout_id,
        rec.seq,
        rec.step,
        str(item.get("type") or "")[:40],
        str(item.get("role") or "")[:20],
        str(item.get("call_id") or "")[:300],
        str(item.get("name") or "")[:300],
        rec.origin,
        rec.asked,
        rec.paired,
        rec.refused,
        rec.latency_ms,
        rec.tool_status,
        item,
    )


def call_row(rollout_id: int, step: StepRecord) -> CallRow:
    """The ``AgentCall`` row of one agent call the loop recorded."""
    return CallRow(
        rollout_id,
        step.index,
        datetime.fromtimestamp(step.started_at, tz=UTC),
        step.latency_ms,
        step.http_status,
        (step.response_id or "")[:300] if isinstance(step.response_id, str) else "",
        (step.model or "")[:300] if isinstance(step.model, str) else "",
        step.usage,
        step.incomplete_details,
        step.num_asks,
        step.error or "",
    )


TOKENS_MAX = 2**63 - 1  # the token columns are 64-bit


def _usage_fields(usage: dict[str, Any] | None) -> dict[str, Any]:
    if not usage:
        return {"usage_reported": False}
    counts = {
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
    }
    if any(isinstance(v, int) and not 0 <= v <= TOKENS_MAX for v in counts.values()):
        # Negative counts (NeMo Gym accepts them) or sums past 64 bits: the per-call usage stays
        # in the agent calls' JSON.
        return {"usage_reported": False}
    return {"usage_reported": True, **counts}


# Parts of a running rollout that could not be stored, by rollout id (DB thread only): the
# rollout's result is turned into a `storage_failed` failure when it is written (never a success
# with holes). Also kept in `Rollout.storage_error`, which the rollout's page shows.
_missing: dict[int, list[str]] = {}


def write_batch(batch: Batch, worker: str) -> None:
    """Persist one batch in one short transaction (the DB thread only).

    A database that is busy or unreachable (``OperationalError``, ``InterfaceError``) raises: the
    caller keeps the batch and writes it again later. Any other error means something in the batch
    cannot be stored; then the batch is written part by part. Each part that still cannot be stored
    is logged with its rollout (run, key, attempt) and recorded on the rollout
    (``Rollout.storage_error``), and that rollout ends as a ``storage_failed`` failure (retried like
    any failure) whose message says what is missing; nothing is dropped quietly and one bad part
    never stops a worker.
    """
    timing = _WriteTiming() if _TIMING_LOG else None
    try:
        if timing is not None:
            from django.db import connection

            with connection.execute_wrapper(timing.wrap):
                _write_batch(batch, worker)
        else:
            _write_batch(batch, worker)
    except (OperationalError, InterfaceError):
        raise
    except Exception as exc:
        log.warning("a batch could not be stored whole (%s: %s); storing it part by part", exc.__class__.__name__, exc)
        _write_piecewise(batch, worker)
    prometheus.record_batch(batch)
    _log_failures(batch)
    if timing is not None:
        timing.done(batch)


# A benchmark's file to which each batch write appends one line of timings (``_WriteTiming``).
_TIMING_LOG = os.environ.get("GW_BENCH_WRITE_LOG", "")


class _WriteTiming:
    """Where one batch write's time went, for the benchmarks (``GW_BENCH_WRITE_LOG``): appends
    ``now wall cpu db_wall db_cpu age calls items finished`` (seconds; ``age``: how long ago the
    oldest agent call in the batch ended, when the write began). Wall time off this thread's CPU
    outside the database calls is time spent waiting for the GIL or a core."""

    def __init__(self) -> None:
        self.t0, self.c0 = time.time(), time.thread_time()
        self.db_wall = self.db_cpu = 0.0

    def wrap(self, execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return execute(sql, params, many, context)
        finally:
            self.db_wall += time.perf_counter() - t
            self.db_cpu += time.thread_time() - c

    def done(self, batch: Batch) -> None:
        now = time.time()
        ends = [c.started.timestamp() + (c.latency_ms or 0) / 1000 for c in batch.calls]
        age = self.t0 - min(ends) if ends else 0.0
        line = (
            f"{now:.3f} {now - self.t0:.4f} {time.thread_time() - self.c0:.4f} {self.db_wall:.4f} "
            f"{self.db_cpu:.4f} {age:.3f} {len(batch.calls)} {len(batch.items)} {len(batch.finished)}\n"
        )
        with open(_TIMING_LOG, "a") as f:
            f.write(line)


def _log_failures(batch: Batch) -> None:
    """One WARNING line per failed attempt: run, key, attempt and failure kind (never the agent's
    or env's payloads, nor the error text, which may quote them)."""
    failed = {rollout_id: out.failure_kind for rollout_id, out in batch.finished if not out.ok}
    if not failed:
        return
    for rollout_id, run_id, task_index, rollout_index, attempt in Rollout.objects.filter(
        pk__in=list(failed)
    ).values_list("id", "run_id", "task_index", "rollout_index", "attempt"):
        log.warning(
            "run %s: task %s rollout %s attempt %s failed: %s",
            run_id,
            task_index,
            rollout_index,
            attempt,
            failed[rollout_id] or "unknown",
            extra={
                "run": run_id,
                "task_index": task_index,
                "rollout_index": rollout_index,
                "attempt": attempt,
                "failure_kind": str(failed[rollout_id] or "unknown"),
            },
        )


def _describe_rollout(rollout_id: int) -> str:
    r = Rollout.objects.filter(pk=rollout_id).values("run_id", "task_index", "rollout_index", "attempt").first()
    if r is None:
        return f"rollout {rollout_id}"
    return (
        f"rollout {rollout_id} (run {r['run_id']}, task {r['task_index']}, "
        f"rollout {r['rollout_index']}, attempt {r['attempt']})"
    )


def _attempt(fn: Callable[[], Any]) -> Exception | None:
    """Run ``fn`` in its own transaction; the error it raised, or None. A busy or unreachable
    database raises (the caller keeps the batch)."""
    try:
        with transaction.atomic():
            fn()
        return None
    except (OperationalError, InterfaceError):
        raise
    except Exception as exc:
        return exc


def _lost(rollout_id: int, what: str, exc: Exception) -> None:
    """Log a part of a rollout that could not be stored and remember it in ``_missing``."""
    text = f"{what}: {exc.__class__.__name__}: {exc}"
    log.error("%s: could not store %s", _describe_rollout(rollout_id), text)
    _missing.setdefault(rollout_id, []).append(text)


def _write_piecewise(batch: Batch, worker: str) -> None:
    touched = _write_rows_piecewise(batch)
    for rollout_id in touched:
        note = "\n".join(_missing[rollout_id])
        _attempt(partial(Rollout.objects.filter(pk=rollout_id).update, storage_error=note))
    for rollout_id, out in batch.finished:
        _write_result_piecewise(batch, worker, rollout_id, out)
    for rollout_id, status in batch.killed:
        if _attempt(partial(_write_batch, Batch(killed=[(rollout_id, status)]), worker)) is None:
            _missing.pop(rollout_id, None)
    for rollout_id, seed_ms in batch.seeds.items():
        if rollout_id not in {r for r, _ in batch.finished}:
            _attempt(partial(Rollout.objects.filter(pk=rollout_id).update, seed_ms=seed_ms))


def _write_rows_piecewise(batch: Batch) -> set[int]:
    """The batch's agent calls and trajectory items one by one; returns the rollouts that lost one."""
    touched: set[int] = set()
    for call in batch.calls:
        error = _attempt(partial(AgentCall.objects.bulk_create, [_as_model(AgentCall, call)], ignore_conflicts=True))
        if error is not None:
            _lost(call.rollout_id, f"agent call {call.index + 1}", error)
            touched.add(call.rollout_id)
    for item in batch.items:
        error = _attempt(
            partial(TrajectoryItem.objects.bulk_create, [_as_model(TrajectoryItem, item)], ignore_conflicts=True)
        )
        if error is not None:
            _lost(item.rollout_id, f"trajectory item #{item.seq} ({item.kind or 'no type'})", error)
            touched.add(item.rollout_id)
    return touched


def _write_result_piecewise(batch: Batch, worker: str, rollout_id: int, out: RolloutOutcome) -> None:
    """One finished rollout's result alone; when even that cannot be stored, its failure."""
    one = Batch(finished=[(rollout_id, out)], seeds={k: v for k, v in batch.seeds.items() if k == rollout_id})
    error = _attempt(partial(_write_batch, one, worker))
    if error is None:
        return
    _lost(rollout_id, "the rollout's result (status, reward, verify reply, counts)", error)
    failed = _storage_failure(out, _missing[rollout_id], keep_payloads=False)
    error = _attempt(partial(_write_batch, Batch(finished=[(rollout_id, failed)]), worker))
    if error is not None:
        log.error(
            "%s: could not store its failure either (%s: %s)",
            _describe_rollout(rollout_id),
            error.__class__.__name__,
            error,
        )
    _missing.pop(rollout_id, None)


def _storage_failure(out: RolloutOutcome, missing: list[str], keep_payloads: bool = True) -> RolloutOutcome:
    """The outcome of a rollout of which ``missing`` parts could not be stored: a non-terminal
    ``storage_failed`` failure whose message names the parts and what the rollout itself did. With
    ``keep_payloads`` the merged response is kept for inspection (``partial_response_json``)."""
    if out.ok:
        ended = f"success with reward {out.reward!r}"
    else:
        ended = f"{out.failure_kind or 'failure'}" + (f": {out.error}" if out.error else "")
    return RolloutOutcome(
        ok=False,
        failure_kind=FailureKind.STORAGE_FAILED,
        error=(
            "gymweb could not store all of this rollout, so it is not a success with holes. Missing: "
            + "; ".join(missing)
            + f". The rollout itself ended as: {ended}"
        ),
        response=out.response if keep_payloads else None,
        usage=out.usage if keep_payloads else None,
        num_agent_calls=out.num_agent_calls,
        num_tool_calls=out.num_tool_calls,
        verify_ms=out.verify_ms,
        total_ms=out.total_ms,
        warnings=list(out.warnings) if keep_payloads else [],
        agent_url=out.agent_url,
        env_url=out.env_url,
    )


def _number_results(ended: list[int], run_of: dict[int, int]) -> None:
    """Give each rollout of ``ended`` (results written in this transaction, in finishing order) its
    place in its run's finishing order (``result_seq``), numbered on from the run's highest.

    Locks the runs' rows (in id order) until the transaction ends, so numbers commit in order and a
    reader that has seen number n has seen every number below it (the results stream's cursor).
    Called last in the write's transaction: the run row is also what claims lock, so every other
    process's claims and writes wait for it only while the numbers are given and committed, never
    while this process inserts its rows."""
    from django.db import connection

    if not ended:
        return
    missing = [r for r in ended if r not in run_of]
    if missing:
        run_of = {**run_of, **dict(Rollout.objects.filter(id__in=missing).values_list("id", "run_id"))}
    qn = connection.ops.quote_name
    run_t, rollout_t, pk = qn(Run._meta.db_table), qn(Rollout._meta.db_table), qn(Rollout._meta.pk.column)
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    by_run: dict[int, list[int]] = {}
    for rollout_id in ended:
        if rollout_id in run_of:
            by_run.setdefault(run_of[rollout_id], []).append(rollout_id)
    with connection.cursor() as cursor:
        for run_id in sorted(by_run):
            cursor.execute(f"SELECT id FROM {run_t} WHERE id = %s{lock}", [run_id])
            cursor.execute(
                f"SELECT result_seq FROM {rollout_t} WHERE run_id = %s AND result_seq IS NOT NULL "
                "ORDER BY result_seq DESC LIMIT 1",
                [run_id],
            )
            row = cursor.fetchone()
            top = row[0] if row else 0
            ids = by_run[run_id]
            for i in range(0, len(ids), 400):  # SQLite's bound-parameter limit
                chunk = ids[i : i + 400]
                cases = " ".join(["WHEN %s THEN %s"] * len(chunk))
                numbers = [v for k, rollout_id in enumerate(chunk, start=top + i + 1) for v in (rollout_id, k)]
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"UPDATE {rollout_t} SET result_seq = CASE {pk} {cases} END WHERE {pk} IN ({marks})",
                    [*numbers, *chunk],
                )


def _write_batch(batch: Batch, worker: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        if batch.calls:
            insert_ignoring_conflicts(AgentCall, batch.calls)
        if batch.items:
            # the raw insert skips TrajectoryItemManager.bulk_create, which fills the content-search
            # text: fill it here, or collected runs would be unsearchable
            fill_missing(batch.items)
            insert_ignoring_conflicts(TrajectoryItem, batch.items)
        ending = {rollout_id for rollout_id, _ in batch.finished}
        _write_seeds({k: v for k, v in batch.seeds.items() if k not in ending})  # else with the result
        ended = _write_results(batch, worker, now)
        for rollout_id, status in batch.killed:
            _write_killed(worker, now, rollout_id, status)
        if batch.unclaimed:  # never started: the claim is undone, no attempt happened
            Rollout.objects.filter(id__in=batch.unclaimed, status=Rollout.Status.RUNNING, worker=worker).update(
                status=Rollout.Status.PENDING, worker="", started=None, lease_until=None
            )
        _number_results(ended, batch.run_of)  # last: it takes the runs' locks
        if batch.finished:
            notify_results(set(batch.run_of.values()) | batch.run_ids)
    for rollout_id, _ in batch.finished:
        _missing.pop(rollout_id, None)
    for rollout_id, _ in batch.killed:
        _missing.pop(rollout_id, None)


def _write_seeds(seeds: dict[int, float]) -> None:
    """Each rollout's ``seed_ms`` (rollout id -> ms) in one UPDATE per ``SEED_BATCH`` rollouts. A
    wave's batch holds thousands of seeds: a statement each would keep the batch transaction, and
    its row locks, open for thousands of round trips, while the lease keeper skips locked rows (their
    leases lapse) and a reap waits for them holding the run row that every claim needs."""
    if seeds:
        rows = [Rollout(pk=rollout_id, seed_ms=seed_ms) for rollout_id, seed_ms in sorted(seeds.items())]
        Rollout.objects.bulk_update(rows, ["seed_ms"], batch_size=SEED_BATCH)


def _result_fields(out: RolloutOutcome, now: datetime) -> dict[str, Any]:
    """The columns a finished attempt's outcome sets on its rollout row."""
    usage = _usage_fields(out.usage)
    warnings = list(out.warnings)
    if out.usage and not usage["usage_reported"]:
        warnings.append(
            "the summed token counts are negative or do not fit in 64 bits: "
            "token metrics are empty (each call's usage is kept)"
        )
    fields = dict(
        status=Rollout.Status.SUCCEEDED if out.ok else Rollout.Status.FAILED,
        finished=now,
        lease_until=None,
        reward=out.reward if out.ok else 0.0,
        failure_kind=out.failure_kind or "",
        error=out.error or "",
        nemo_error=out.nemo_error or "",
        terminal=out.terminal,
        verify_json=dumps(out.verify_response) if out.ok else "",
        # The numbers the run's profile reads, so it never parses verify_json (run_profile).
        # (of the row as rollouts.jsonl carries it: the reply as NeMo Gym's agent returns it).
        profile_json=profile_json_for_verify(agent_result(out.verify_response, out.verify_accepted)) if out.ok else "",
        partial_response_json="" if out.ok or out.response is None else dumps(out.response),
        warnings=warnings,
        num_agent_calls=out.num_agent_calls,
        num_tool_calls=out.num_tool_calls,
        verify_ms=out.verify_ms,
        duration_ms=out.total_ms,
        agent_url=out.agent_url or "",
        env_url=out.env_url or "",
        **usage,
    )
    if out.response is not None:
        fields["num_items"] = len(out.response.get("output") or [])
    return fields


def _write_results(batch: Batch, worker: str, now: datetime) -> list[int]:
    """The batch's finished attempts' results (``_write_result``), those with the same columns
    in one ``finish_rollouts`` trip when no lease among them was taken over. Returns the rollouts
    written, in finishing order."""
    ends = []
    for rollout_id, out in batch.finished:
        if rollout_id in _missing:
            out = _storage_failure(out, _missing[rollout_id])
        fields = _result_fields(out, now)
        if rollout_id in batch.seeds:
            fields["seed_ms"] = batch.seeds[rollout_id]
        ends.append((rollout_id, out, fields))
    groups: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
    for rollout_id, _out, fields in ends:
        groups.setdefault(tuple(fields), []).append((rollout_id, fields))
    done: set[int] = set()
    for group in groups.values():
        if len(group) > 1 and finish_rollouts(worker, group):
            done.update(rollout_id for rollout_id, _ in group)
    return [rollout_id for rollout_id, out, fields in ends if _write_result(worker, rollout_id, out, fields, done)]


def _write_result(worker: str, rollout_id: int, out: RolloutOutcome, fields: dict[str, Any], done: set[int]) -> bool:
    """One finished attempt's result ``fields`` (unless in ``done``: already written) and its
    refused reply, if any, unless its lease was taken over. Returns whether it was written (its
    place in the finishing order is given after)."""
    if rollout_id not in done and not finish_rollout(rollout_id, worker, fields):
        # Our lease expired and the key was queued again: the newer attempt owns the key.
        log.warning("rollout %s finished after its lease was taken over; result dropped", rollout_id)
        return False
    if out.refused_reply is not None:  # in the same transaction as the attempt's result
        kept = out.refused_reply
        RefusedReply.objects.bulk_create(
            [
                RefusedReply(
                    rollout_id=rollout_id,
                    http_status=kept.status,
                    content_type=kept.content_type,
                    body=kept.body,
                    size=kept.size,
                    truncated=kept.truncated,
                    errors=kept.errors,
                )
            ],
            ignore_conflicts=True,
        )
    return True


def _write_killed(worker: str, now: datetime, rollout_id: int, status: str) -> None:
    """An attempt cancelled with its run, or interrupted by its worker stopping (its key then gets
    a new pending attempt with the same number while the run is running)."""
    Rollout.objects.filter(pk=rollout_id, status=Rollout.Status.RUNNING, worker=worker).update(
        status=status,
        finished=now,
        lease_until=None,
        error="cancelled with its run"
        if status == Rollout.Status.CANCELLED
        else "its worker stopped; the key runs again",
    )
    if status != Rollout.Status.INTERRUPTED:
        return
    r = (
        Rollout.objects.filter(pk=rollout_id)
        .values("task_id", "task_index", "rollout_index", "attempt", "run_id")
        .first()
    )
    if r and Run.objects.filter(pk=r["run_id"], status=Run.Status.RUNNING).exists():
        Rollout.objects.create(
            run_id=r["run_id"],
            task_id=r["task_id"],
            task_index=r["task_index"],
            rollout_index=r["rollout_index"],
            attempt=r["attempt"],
        )
