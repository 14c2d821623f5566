"""Workers: claim pending rollouts atomically, run them concurrently with asyncio, persist every step.

One *dispatcher* per worker process (each ``qcluster`` worker process starts one when django-q2
spawns it; the CLI runs one in-process). A dispatcher is a thread with one event loop and one
shared HTTP client; it serves every running run, claiming rollouts while the run has room under its
``concurrency`` (counted over all workers, under a lock on the run row) and while its own fair
share (``concurrency`` / live dispatchers) is not used up, so several processes and machines share a
run. The database is touched only from one dedicated thread, in short batched transactions, so the
event loop never waits on it (issue 4; DESIGN.md, known pitfalls).

Rollouts do not run inside django-q2 tasks, so django-q2's cluster-wide ``timeout`` and ``retry``
never cut a long rollout short or deliver it twice (DESIGN.md, known pitfalls); django-q2 supervises
the processes (respawns a dead one) and runs the scheduled ``supervise`` job.

A claim carries a lease that the dispatcher renews. If its process dies (SIGKILL), the lease expires
and any dispatcher (or ``supervise``) marks the attempt ``interrupted`` — kill-shaped, not an
attempt — and queues its key again. SIGTERM (to the cluster's main process or to its whole process
group), Ctrl-C and any normal cluster stop release in-flight rollouts at once the same way, without
waiting for the lease: the dispatcher stops claiming, cancels its rollouts, writes what it holds and
the ``interrupted`` rows, and queues their keys again (``Dispatcher._release``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connections, models, transaction
from django.db.models import Count, Q
from django.utils import timezone

from rollouts import targets
from rollouts.collection import runs, wakeup
from rollouts.collection.profile_numbers import profile_json_for_verify
from rollouts.engine.contract import prepare_reply_validation
from rollouts.engine.loop import FailureKind, ItemRecord, LoopSettings, RolloutOutcome, StepRecord, run_rollout
from rollouts.lossless import dumps
from rollouts.models import AgentCall, RefusedReply, Rollout, Run, Task, TrajectoryItem, Worker
from rollouts.nemo import miswiring
from rollouts.operations import metrics
from rollouts.search import fill_missing

log = logging.getLogger("gymweb.dispatch")

__all__ = ["Dispatcher", "claim", "reap_expired", "run_in_process", "start_in_worker_process", "supervise"]


def worker_name() -> str:
    """A unique name for a dispatcher: host, pid and a random suffix (shown on running rollouts)."""
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
        lease_until=None,
        error="the worker running this attempt stopped (its lease expired); the key runs again",
    )
    if Run.objects.filter(pk=run_id, status=Run.Status.RUNNING).exists():
        Rollout.objects.bulk_create(
            [
                Rollout(run_id=run_id, task_id=t, task_index=ti, rollout_index=ri, attempt=a)
                for _, t, ti, ri, a in expired
            ]
        )
    log.warning("run %s: %d rollout(s) of a dead worker were queued again", run_id, len(expired))
    return len(expired)


def claim(run_id: int, worker: str, want: int, lease_s: float, reap: bool = True) -> list[tuple[int, str, int]]:
    """Atomically claim up to ``want`` pending rollouts of a running run, never letting the run's
    running attempts exceed its ``concurrency`` over all workers.

    Returns ``[(rollout_id, materialised task row JSON text, rollout_index)]``; empty when the run is
    not running or has no room. The run row is locked for the check-and-update
    (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's IMMEDIATE transactions serialise writers).
    Plain SQL with the values the ORM would send: a claim follows nearly every completion, and
    compiling its five queries was a quarter of the dispatcher's CPU (issue 14).
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
            f"SELECT id FROM {rollout_t} WHERE run_id = %s AND status = %s ORDER BY task_index, rollout_index, id LIMIT %s",
            [run_id, pending, room],
        )
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return []
        now = _now()
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
                f"UPDATE {rollout_t} SET status = %s, worker = %s, started = %s, lease_until = %s WHERE id IN ({marks}) AND status = %s",
                [running, worker, started, lease_until, *chunk, pending],
            )
            cursor.execute(
                f"SELECT r.id, t.row_json, r.rollout_index FROM {rollout_t} r JOIN {task_t} t ON t.id = r.task_id "
                f"WHERE r.id IN ({marks}) AND r.worker = %s AND r.status = %s",
                [*chunk, worker, running],
            )
            rows.extend(cursor.fetchall())
        return rows


# -- persistence (batched, in the DB thread) -----------------------------------------------------
@dataclass
class _Batch:
    calls: list[AgentCall] = field(default_factory=list)
    items: list[TrajectoryItem] = field(default_factory=list)
    seeds: dict[int, float] = field(default_factory=dict)
    finished: list[tuple[int, RolloutOutcome]] = field(default_factory=list)
    killed: list[tuple[int, str]] = field(default_factory=list)
    unclaimed: list[int] = field(default_factory=list)  # claimed by a stopping dispatcher, never started
    run_ids: set[int] = field(default_factory=set)  # runs whose rollouts ended in this batch
    run_of: dict[int, int] = field(default_factory=dict)  # finished rollout id -> its run id

    def __bool__(self) -> bool:
        return bool(self.calls or self.items or self.seeds or self.finished or self.killed or self.unclaimed)

    def absorb(self, newer: _Batch) -> _Batch:
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
        started=datetime.fromtimestamp(step.started_at, tz=UTC),
        latency_ms=step.latency_ms,
        http_status=step.http_status,
        response_id=(step.response_id or "")[:300] if isinstance(step.response_id, str) else "",
        model=(step.model or "")[:300] if isinstance(step.model, str) else "",
        usage=step.usage,
        incomplete_details=step.incomplete_details,
        num_asks=step.num_asks,
        error=step.error or "",
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
# rollout's result is turned into a `storage_failed` failure when it is written (issue 9: never a
# success with holes). Also kept in `Rollout.storage_error`, which the rollout's page shows.
_missing: dict[int, list[str]] = {}


def write_batch(batch: _Batch, worker: str) -> None:
    """Persist one batch in one short transaction (the DB thread only).

    A database that is busy or unreachable (``OperationalError``, ``InterfaceError``) raises: the
    caller keeps the batch and writes it again later. Any other error means something in the batch
    cannot be stored; then the batch is written part by part. Each part that still cannot be stored
    is logged with its rollout (run, key, attempt) and recorded on the rollout
    (``Rollout.storage_error``), and that rollout ends as a ``storage_failed`` failure (retried like
    any failure) whose message says what is missing; nothing is dropped quietly and one bad part
    never stops a worker.
    """
    try:
        _write_batch(batch, worker)
    except (OperationalError, InterfaceError):
        raise
    except Exception as exc:
        log.warning("a batch could not be stored whole (%s: %s); storing it part by part", exc.__class__.__name__, exc)
        _write_piecewise(batch, worker)
    metrics.record_batch(batch)
    _log_failures(batch)


def _log_failures(batch: _Batch) -> None:
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
    return f"rollout {rollout_id} (run {r['run_id']}, task {r['task_index']}, rollout {r['rollout_index']}, attempt {r['attempt']})"


def _write_piecewise(batch: _Batch, worker: str) -> None:
    def attempt(fn: Callable[[], Any]) -> Exception | None:
        try:
            with transaction.atomic():
                fn()
            return None
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            return exc

    def lost(rollout_id: int, what: str, exc: Exception) -> None:
        text = f"{what}: {exc.__class__.__name__}: {exc}"
        log.error("%s: could not store %s", _describe_rollout(rollout_id), text)
        _missing.setdefault(rollout_id, []).append(text)
        touched.add(rollout_id)

    touched: set[int] = set()
    for call in batch.calls:
        error = attempt(partial(AgentCall.objects.bulk_create, [call], ignore_conflicts=True))
        if error is not None:
            lost(call.rollout_id, f"agent call {call.index + 1}", error)
    for item in batch.items:
        error = attempt(partial(TrajectoryItem.objects.bulk_create, [item], ignore_conflicts=True))
        if error is not None:
            lost(item.rollout_id, f"trajectory item #{item.seq} ({item.kind or 'no type'})", error)
    for rollout_id in touched:
        note = "\n".join(_missing[rollout_id])
        attempt(partial(Rollout.objects.filter(pk=rollout_id).update, storage_error=note))
    for rollout_id, out in batch.finished:
        one = _Batch(finished=[(rollout_id, out)], seeds={k: v for k, v in batch.seeds.items() if k == rollout_id})
        error = attempt(partial(_write_batch, one, worker))
        if error is not None:
            lost(rollout_id, "the rollout's result (status, reward, verify reply, counts)", error)
            failed = _storage_failure(out, _missing[rollout_id], keep_payloads=False)
            error = attempt(partial(_write_batch, _Batch(finished=[(rollout_id, failed)]), worker))
            if error is not None:
                log.error(
                    "%s: could not store its failure either (%s: %s)",
                    _describe_rollout(rollout_id),
                    error.__class__.__name__,
                    error,
                )
            _missing.pop(rollout_id, None)
    for rollout_id, status in batch.killed:
        if attempt(partial(_write_batch, _Batch(killed=[(rollout_id, status)]), worker)) is None:
            _missing.pop(rollout_id, None)
    for rollout_id, seed_ms in batch.seeds.items():
        if rollout_id not in {r for r, _ in batch.finished}:
            attempt(partial(Rollout.objects.filter(pk=rollout_id).update, seed_ms=seed_ms))


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


_insert_sql: dict[tuple[str, type], tuple[str, list]] = {}
_update_sql: dict[tuple[str, tuple[str, ...]], tuple[str, list]] = {}


_PROBES = {int: 7, float: 1.5, bool: True, str: "x"}


def _plain_types(field: Any, connection: Any) -> frozenset:
    """The value types whose ``field.get_db_prep_save(value, connection)`` is the value itself,
    so the writer can pass them through without Django's per-value conversion. Only Django's own
    integer, float, boolean, text and foreign-key fields are candidates (lossless and JSON fields
    always convert), and each candidate type is kept only if this backend sends a probe value of
    it unchanged (PostgreSQL's psycopg wraps integers in ``Int4`` and the like: they convert
    there). ``tests/test_dispatch_insert.py`` checks the result against ``get_db_prep_save``."""
    exact = type(field)
    if exact in (
        models.ForeignKey,
        models.IntegerField,
        models.PositiveIntegerField,
        models.PositiveSmallIntegerField,
        models.SmallIntegerField,
        models.BigIntegerField,
    ):
        candidates: tuple[type, ...] = (int,)  # a foreign key to a non-integer key fails the probe below
    elif exact is models.FloatField:
        candidates = (float,)
    elif exact is models.BooleanField:
        candidates = (bool,)
    elif exact in (models.CharField, models.TextField):
        candidates = (str,)
    else:
        return frozenset()
    plain = set()
    for kind in candidates:
        try:
            sent = field.get_db_prep_save(_PROBES[kind], connection)
        except (TypeError, ValueError):
            continue
        if type(sent) is kind and sent == _PROBES[kind]:
            plain.add(kind)
    if plain and field.get_db_prep_save(None, connection) is None:
        plain.add(type(None))
    return frozenset(plain)


def _insert_ignoring_conflicts(model: type[models.Model], objs: list) -> None:
    """``model.objects.bulk_create(objs, ignore_conflicts=True)`` as one ``executemany`` of a
    statement built once per backend: the same SQL Django writes (``INSERT OR IGNORE`` on SQLite,
    ``ON CONFLICT DO NOTHING`` on PostgreSQL) and the same values (each field's
    ``get_db_prep_save``, so lossless encoding applies), without compiling the insert for every
    batch (issue 14: the compiler was most of the writer's CPU). Raises what the database raises."""
    from django.db import connection
    from django.db.models.constants import OnConflict

    key = (connection.vendor, model)
    if key not in _insert_sql:
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        ops, qn = connection.ops, connection.ops.quote_name
        sql = "%s %s (%s) VALUES (%s) %s" % (
            ops.insert_statement(on_conflict=OnConflict.IGNORE),
            qn(model._meta.db_table),
            ", ".join(qn(f.column) for f in fields),
            ", ".join(["%s"] * len(fields)),
            ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, None, None),
        )
        _insert_sql[key] = (sql.rstrip(), [(f, f.attname, _plain_types(f, connection)) for f in fields])
    sql, fields = _insert_sql[key]
    params = [
        [
            v if type(v) in plain else f.get_db_prep_save(v, connection)
            for f, attname, plain in fields
            for v in (getattr(obj, attname),)
        ]
        for obj in objs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _finish_rollout(rollout_id: int, worker: str, fields: dict[str, Any]) -> int:
    """``Rollout.objects.filter(pk=rollout_id, status=RUNNING, worker=worker).update(**fields)``
    with the statement built once per set of field names. Returns the rows updated (0: the lease
    was taken over)."""
    from django.db import connection

    key = (connection.vendor, tuple(fields))
    if key not in _update_sql:
        meta, qn = Rollout._meta, connection.ops.quote_name
        model_fields = [meta.get_field(name) for name in fields]
        sql = "UPDATE %s SET %s WHERE %s = %%s AND %s = %%s AND %s = %%s" % (
            qn(meta.db_table),
            ", ".join(f"{qn(f.column)} = %s" for f in model_fields),
            qn(meta.pk.column),
            qn(meta.get_field("status").column),
            qn(meta.get_field("worker").column),
        )
        _update_sql[key] = (sql, model_fields)
    sql, model_fields = _update_sql[key]
    params = [f.get_db_prep_save(v, connection) for f, v in zip(model_fields, fields.values())]
    params += [rollout_id, Rollout.Status.RUNNING, worker]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _reserve_result_seqs(batch: _Batch) -> dict[int, int]:
    """Each finished rollout's place in its run's finishing order: ``{rollout_id: result_seq}``,
    numbered on from the run's highest. Locks the runs' rows (in id order, first in the write's
    transaction, as a claim does) until the transaction ends, so numbers commit in order and a
    reader that has seen number n has seen every number below it (the results stream's cursor)."""
    from django.db import connection

    ids = [rollout_id for rollout_id, _ in batch.finished]
    run_of = {r: batch.run_of[r] for r in ids if r in batch.run_of}
    missing = [r for r in ids if r not in run_of]
    if missing:
        run_of.update(Rollout.objects.filter(id__in=missing).values_list("id", "run_id"))
    qn = connection.ops.quote_name
    run_t, rollout_t = qn(Run._meta.db_table), qn(Rollout._meta.db_table)
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    top: dict[int, int] = {}
    with connection.cursor() as cursor:
        for run_id in sorted(set(run_of.values())):
            cursor.execute(f"SELECT id FROM {run_t} WHERE id = %s{lock}", [run_id])
            cursor.execute(
                f"SELECT result_seq FROM {rollout_t} WHERE run_id = %s AND result_seq IS NOT NULL ORDER BY result_seq DESC LIMIT 1",
                [run_id],
            )
            row = cursor.fetchone()
            top[run_id] = row[0] if row else 0
    seqs = {}
    for rollout_id in ids:
        run_id = run_of.get(rollout_id)
        if run_id is not None:
            top[run_id] += 1
            seqs[rollout_id] = top[run_id]
    return seqs


def _write_batch(batch: _Batch, worker: str) -> None:
    now = _now()
    with transaction.atomic():
        seqs = _reserve_result_seqs(batch) if batch.finished else {}
        if batch.calls:
            _insert_ignoring_conflicts(AgentCall, batch.calls)
        if batch.items:
            # the raw insert skips TrajectoryItemManager.bulk_create, which fills the content-search
            # text (issue 11): fill it here, or collected runs would be unsearchable
            fill_missing(batch.items)
            _insert_ignoring_conflicts(TrajectoryItem, batch.items)
        ending = {rollout_id for rollout_id, _ in batch.finished}
        for rollout_id, seed_ms in batch.seeds.items():
            if rollout_id not in ending:  # else written with the result, in one UPDATE
                Rollout.objects.filter(pk=rollout_id).update(seed_ms=seed_ms)
        for rollout_id, out in batch.finished:
            if rollout_id in _missing:
                out = _storage_failure(out, _missing[rollout_id])
            usage = _usage_fields(out.usage)
            warnings = list(out.warnings)
            if out.usage and not usage["usage_reported"]:
                warnings.append(
                    "the summed token counts are negative or do not fit in 64 bits: token metrics are empty (each call's usage is kept)"
                )
            fields = dict(
                status=Rollout.Status.SUCCEEDED if out.ok else Rollout.Status.FAILED,
                finished=now,
                lease_until=None,
                reward=out.reward if out.ok else 0.0,
                failure_kind=out.failure_kind or "",
                error=out.error or "",
                terminal=out.terminal,
                verify_json=dumps(out.verify_response) if out.ok else "",
                # The numbers the run's profile reads, so it never parses verify_json (run_profile).
                profile_json=profile_json_for_verify(out.verify_response) if out.ok else "",
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
            if rollout_id in batch.seeds:
                fields["seed_ms"] = batch.seeds[rollout_id]
            if rollout_id in seqs:
                fields["result_seq"] = seqs[rollout_id]
            if not _finish_rollout(rollout_id, worker, fields):
                # Our lease expired and the key was queued again: the newer attempt owns the key.
                log.warning("rollout %s finished after its lease was taken over; result dropped", rollout_id)
            elif out.refused_reply is not None:  # in the same transaction as the attempt's result
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
        for rollout_id, status in batch.killed:
            Rollout.objects.filter(pk=rollout_id, status=Rollout.Status.RUNNING, worker=worker).update(
                status=status,
                finished=now,
                lease_until=None,
                error="cancelled with its run"
                if status == Rollout.Status.CANCELLED
                else "its worker stopped; the key runs again",
            )
            if status == Rollout.Status.INTERRUPTED:
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
        if batch.unclaimed:  # never started: the claim is undone, no attempt happened
            Rollout.objects.filter(id__in=batch.unclaimed, status=Rollout.Status.RUNNING, worker=worker).update(
                status=Rollout.Status.PENDING, worker="", started=None, lease_until=None
            )
    for rollout_id, _ in batch.finished:
        _missing.pop(rollout_id, None)
    for rollout_id, _ in batch.killed:
        _missing.pop(rollout_id, None)


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
        batch.calls.append(_call_row(self.rollout_id, step))
        batch.items.extend(_item_row(self.rollout_id, rec) for rec in items)
        self._keep_tools(items)

    def on_items(self, items: list[ItemRecord]) -> None:
        self.dispatcher.batch.items.extend(_item_row(self.rollout_id, rec) for rec in items)
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


class _DbThread:
    """The one thread that runs a dispatcher's database work, in submission order.

    Not a ``ThreadPoolExecutor``: the interpreter stops those executors' threads when the process's
    main thread ends (``concurrent.futures.thread._python_exit``), and a django-q2 worker process
    ends its main thread first on a cluster stop, which is exactly when the dispatcher still has
    to write what it holds and release its rollouts ("cannot schedule new futures after shutdown").
    This thread runs until ``shutdown``. It is a daemon so that a database call that hangs for
    good cannot keep a stopping process alive; the dispatcher's own thread is not a daemon and
    waits for the release (bounded by ``GYMWEB_RELEASE_TIMEOUT_S``).
    """

    def __init__(self, name: str = "gymweb-db"):
        self._queue: queue.SimpleQueue[tuple[Future, Callable, tuple] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, fn: Callable, *args: Any) -> Future:
        """Queue ``fn(*args)``; returns its ``concurrent.futures.Future``. Raises ``RuntimeError``
        after ``shutdown``."""
        if self._closed:
            raise RuntimeError("the dispatcher's database thread was shut down")
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def shutdown(self, timeout: float | None = None) -> None:
        """Run what is queued, then end the thread; waits up to ``timeout`` seconds for it."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _serve(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            future, fn, args = work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine, which decides
                future.set_exception(exc)
            else:
                future.set_result(result)


def _db_call(fn: Callable, *args: Any) -> Any:
    # Long-lived threads must drop connections Django considers stale (CONN_MAX_AGE, errors).
    close_old_connections()
    return fn(*args)


def _running_runs(only: set[int] | None) -> list[dict[str, Any]]:
    qs = Run.objects.filter(status=Run.Status.RUNNING)
    if only is not None:
        qs = qs.filter(pk__in=only)
    fields = ("id", "concurrency", "agent_url", "env_url", "max_steps", "remote_responses_timeout_s", "run_timeout_s")
    out = list(qs.values(*fields))
    pending = set(
        Rollout.objects.filter(run_id__in=[r["id"] for r in out], status=Rollout.Status.PENDING)
        .values_list("run_id", flat=True)
        .distinct()
    )
    expired = set(
        Rollout.objects.filter(run_id__in=[r["id"] for r in out], status=Rollout.Status.RUNNING, lease_until__lt=_now())
        .values_list("run_id", flat=True)
        .distinct()
    )
    for r in out:
        r["pending"] = r["id"] in pending or r["id"] in expired
    return out


def _heartbeat(name: str, inflight: dict[int, int], capacity: int, lease_s: float) -> tuple[int, dict[int, str]]:
    """Renew this dispatcher's leases and its Worker row. Returns (live dispatchers, status of each
    run it holds work of) — a cancel is noticed here."""
    now = _now()
    run_ids = set(inflight.values())
    if run_ids:
        # By run, status and worker, not by the ids in flight: the same rows (a running attempt
        # whose worker is this dispatcher is one it holds, or one whose result it has yet to
        # write), read through the (run, status) index, without an IN list of every id in flight
        # that Django compiles parameter by parameter (8 % of the CPU at 5,000 in flight, issue 14).
        Rollout.objects.filter(run_id__in=run_ids, status=Rollout.Status.RUNNING, worker=name).update(
            lease_until=now + timedelta(seconds=lease_s)
        )
    Worker.objects.update_or_create(
        name=name,
        defaults={
            "host": name.split(":")[0],
            "pid": os.getpid(),
            "last_seen": now,
            "inflight": len(inflight),
            "capacity": capacity,
        },
    )
    Worker.objects.filter(last_seen__lt=now - timedelta(seconds=max(60.0, 10 * lease_s))).delete()
    metrics.add("gymweb_worker_heartbeats")
    _flush_metrics()
    live = Worker.objects.filter(last_seen__gte=now - timedelta(seconds=lease_s)).count()
    statuses = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "status"))
    return max(1, live), statuses


def _flush_metrics() -> None:
    """Add this process's metric counts to the fleet's totals; a failure keeps them for next time."""
    try:
        metrics.flush()
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        log.exception("the metric totals could not be written; they are kept for the next heartbeat")


def _retire(name: str) -> None:
    _flush_metrics()
    Worker.objects.filter(name=name).delete()


def _runs_left(run_ids: set[int]) -> dict[int, int]:
    """Attempts of each of ``run_ids`` that some worker still has to end, over every worker
    sharing the database: ``{run_id: n}``. Pending and running attempts count. A running attempt
    whose lease expired belonged to a dead worker: while its run is running it counts (it is
    reaped and runs again); once the run was cancelled or completed it is not waited for."""
    now = _now()
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


def _release_held(batch: _Batch, worker: str, after_finish: bool) -> None:
    """A stopping dispatcher's last write: its batch (partial trajectories, finished results and
    the ``interrupted`` rows of the rollouts it cancelled, whose keys get a pending attempt with
    the same number), runs left with nothing to do completed, and its ``Worker`` row removed."""
    if batch:
        write_batch(batch, worker)
    _finish_idle(sorted(batch.run_ids), after_finish)
    _retire(worker)


def _flush_and_claim(
    batch: _Batch, worker: str, wants: list[tuple[int, int]], lease_s: float, reap: bool = False
) -> list[tuple[int, int, str, int]]:
    if batch:
        write_batch(batch, worker)
    claimed: list[tuple[int, int, str, int]] = []
    for run_id, want in wants:
        claimed.extend((run_id, *row) for row in claim(run_id, worker, want, lease_s, reap=reap))
    metrics.record_claimed(len(claimed))
    return claimed


_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] = (700, 10, 10)


@contextmanager
def collector_tuned(threshold0: int) -> Iterator[None]:
    """Python's cyclic garbage collector set for a dispatcher, for the duration of the block.

    With thousands of rollouts in flight the heap holds millions of live objects (every
    conversation, parsed), and the collector's default first threshold (700 allocations) makes it
    walk them again and again: at 10,000 in flight it took 45 % of the process's CPU (71 of 158 s,
    issue 14, benchmarks/README.md). Inside the block the objects that exist at its start (Django,
    the libraries) are frozen out of every collection (``gc.freeze``) and the first threshold is
    ``threshold0`` allocations (``GYMWEB_GC_THRESHOLD``; 0 leaves the collector as it is).
    Reference counting still frees everything that is not in a cycle at once; cycles are still
    collected, less often. The settings are the process's: nested or concurrent blocks share them
    and the last one out restores the previous thresholds and unfreezes."""
    global _gc_users, _gc_saved
    if threshold0 <= 0:
        yield
        return
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.freeze()  # no collect first: garbage frozen now is collectable again after unfreeze
            gc.set_threshold(threshold0, _gc_saved[1], _gc_saved[2])
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)
                gc.unfreeze()


def raise_fd_limit(needed: int) -> int:
    """Raise the process's soft open-file limit (RLIMIT_NOFILE) towards its hard limit when it is
    below ``needed`` (each rollout in flight may hold an agent and an env connection). Returns the
    soft limit now in force; logs a warning when even the hard limit is below ``needed`` (then
    connections past it fail as "could not reach", which are retried as failures)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        target = hard if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open-file limit is %d, below the %d this dispatcher may need for its capacity; "
            "raise `ulimit -n` or lower GYMWEB_PROCESS_CAPACITY",
            soft,
            needed,
        )
    return soft


def _finish_idle(run_ids: list[int], after_finish: bool = True) -> None:
    """Complete runs that have nothing left; a worker then queues the /aggregate_metrics call."""
    from django_q.tasks import async_task

    for run_id in run_ids:
        if runs.finish_if_done(run_id) and after_finish:
            async_task(
                "rollouts.evaluation.run_aggregate_metrics.fetch_aggregate_metrics",
                run_id,
                task_name=f"run-{run_id}-aggregate",
            )


class Dispatcher:
    """Runs rollouts of every running run (or of ``only`` runs) in this process.

    ``capacity``: most rollouts in flight in this process over all runs (memory bound; default
    ``GYMWEB_PROCESS_CAPACITY``). ``exit_when_idle`` (the CLI, with ``only``): return once every
    attempt of those runs has ended, on any worker sharing the database (``_runs_left``); otherwise
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
        self.batch = _Batch()
        self.tasks: dict[int, asyncio.Task] = {}  # rollout id -> task
        self.run_of: dict[int, int] = {}  # rollout id -> run id
        self.inflight: dict[int, int] = {}  # run id -> rollouts of it in flight here
        # Ended tasks, pushed by their done callbacks: a turn costs O(what ended), not O(in flight)
        # (asyncio.wait over 10,000 tasks adds and removes 10,000 callbacks per call; issue 14).
        self._ended: list[int] = []
        self._next_sync = 0.0
        self._freed = 0  # slots freed by ended rollouts since the last trip to the DB thread
        self.cancelling: set[int] = set()  # runs whose in-flight rollouts end as `cancelled`
        self.runs: dict[int, _RunInfo] = {}
        self.live_workers = 1
        self.left: int | None = None  # attempts of the `only` runs not yet ended, over all workers
        self._reap_due = True
        self.db: _DbThread | None = None  # started by run()
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
        return await asyncio.wrap_future(self.db.submit(_db_call, fn, *args))

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
    # dispatcher's share is free, when nothing is in flight, or when the flush is due.
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
        batch, self.batch = self.batch, _Batch()
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
            row["_ng_rollout_index"] = rollout_index
            self.run_of[rollout_id] = run_id
            self.inflight[run_id] = self.inflight.get(run_id, 0) + 1
            task = self.tasks[rollout_id] = asyncio.create_task(self._run_one(rollout_id, run_id, row))
            task.add_done_callback(lambda _t, r=rollout_id: self._task_ended(r))  # type: ignore[misc]

    def _task_ended(self, rollout_id: int) -> None:
        self._ended.append(rollout_id)
        if self._wake is not None:
            self._wake.set()

    async def _run_one(self, rollout_id: int, run_id: int, row: dict[str, Any]) -> None:
        info = self.runs[run_id]
        recorder = _Recorder(rollout_id, self)
        try:
            outcome = await run_rollout(self.client, row, info.settings, recorder)
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
        rows = await self._db(_running_runs, self.only)
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
            # a retry may have moved the env (a NeMo Gym resources server resolved again by name)
            same = known and (known.settings.agent_base_url, known.settings.env_base_url) == (
                r["agent_url"],
                r["env_url"],
            )
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
                    refused_reply_max_bytes=settings.GYMWEB_FAILED_REPLY_MAX_BYTES,
                )
            )
            fresh[r["id"]] = _RunInfo(r["id"], r["concurrency"], loop_settings, r["pending"])
        # Runs we still hold rollouts of stay known until those end.
        for run_id in set(self.run_of.values()) - set(fresh):
            fresh[run_id] = self.runs[run_id]
            fresh[run_id].pending = False
        self.runs = fresh
        self._reap_due = True
        held = set(self.run_of.values())
        idle = [run_id for run_id, info in fresh.items() if not info.pending and run_id not in held]
        if idle:
            # Completes each run whose attempts have all ended, on every worker (finish_if_done).
            await self._db(_finish_idle, idle, not self.exit_when_idle)
        if self.only and (self.exit_when_idle or self.on_progress):
            self.left = sum((await self._db(_runs_left, self.only)).values())
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
            n += 1
        self._freed += n
        return n

    async def _beat(self) -> None:
        self.live_workers, statuses = await self._db(
            _heartbeat, self.name, dict(self.run_of), self.capacity, self.lease_s
        )
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
        self.db = _DbThread()
        # The DB thread's ORM work holds the GIL in 5 ms slices by default, which adds up to that
        # much latency to every HTTP step of every in-flight rollout; hand the GIL over sooner.
        sys.setswitchinterval(0.0005)
        # The instance's target policy and reply cap apply to every request of every rollout
        # (rollouts.targets): a refused host or an oversized reply is a failure row of its own kind.
        raise_fd_limit(2 * self.capacity + 64)
        self.client = targets.async_client(max(self.capacity, 32))
        self._next_poll = self._next_beat = self._next_flush = 0.0
        # A launched run wakes a dispatcher that serves every run (rollouts.collection.wakeup).
        watcher = wakeup.Watcher(self.poke).start() if self.only is None else None
        try:
            with collector_tuned(settings.GYMWEB_GC_THRESHOLD):
                await self._serve()
        finally:
            if watcher is not None:
                watcher.stop()

    async def _serve(self) -> None:
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
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            await self._beat()
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
        deadline = min(self._next_poll, self._next_flush, self._next_beat)
        if self._freed and self._wants():
            deadline = min(deadline, self._next_sync)  # slots were freed: claim them soon
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
            batch, self.batch = self.batch, _Batch()
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
                batch, self.batch = self.batch, _Batch()
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
                        "dispatcher %s: could not release %d in-flight rollout(s) within %g s (GYMWEB_RELEASE_TIMEOUT_S; "
                        "last error: %s); they run again once their lease expires (GYMWEB_LEASE_S = %g s)",
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


# -- entry points ------------------------------------------------------------------------------
_process_dispatcher: Dispatcher | None = None


def start_in_worker_process() -> threading.Thread | None:
    """Start this process's dispatcher thread (called when django-q2 spawns a worker process).

    How a worker process is stopped, and what its dispatcher does then (each releases the
    in-flight rollouts at once, without a traceback, and the process exits):

    - SIGTERM or SIGINT to the cluster's main process (``kill PID``, ``docker stop``, Ctrl-C):
      django-q2 stops its workers in order and each worker process's main thread returns. The
      dispatcher thread is not a daemon, so the process waits for it; it notices its main thread
      is gone within one poll (``GYMWEB_POLL_S``), stops claiming and releases.
    - SIGTERM to every process of the cluster (``kill -TERM -PGID``, systemd's default): this
      handler stops the dispatcher, waits for its release (at most ``GYMWEB_RELEASE_TIMEOUT_S``
      and a little), then ends the process as SIGTERM would.
    """
    global _process_dispatcher
    if _process_dispatcher is not None or not settings.GYMWEB_DISPATCH_IN_WORKERS:
        return None
    dispatcher = _process_dispatcher = Dispatcher()

    def serve() -> None:
        # Dispatcher.run already survives failing steps; this also survives a failing start or
        # release, so the worker process never keeps running without its dispatcher.
        nonlocal dispatcher
        global _process_dispatcher
        while True:
            try:
                asyncio.run(dispatcher.run())
            except Exception:
                log.exception("the dispatcher stopped with an error; starting a new one")
            if dispatcher._stop.is_set() or not threading.main_thread().is_alive():
                return
            time.sleep(1.0)
            dispatcher = _process_dispatcher = Dispatcher()

    thread = threading.Thread(target=serve, name="gymweb-dispatcher", daemon=False)
    thread.start()

    def on_sigterm(signum, frame):
        (_process_dispatcher or dispatcher).stop()
        thread.join(timeout=settings.GYMWEB_RELEASE_TIMEOUT_S + 5.0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    return thread


def run_in_process(run_id: int, on_progress: Callable[[int], None] | None = None) -> None:
    """Run one run to its end in this process (the CLI's path: no separate worker needed).

    Workers sharing the database (``qcluster``) may claim part of the run; this returns only when
    every attempt of the run has ended, wherever it ran (none pending, none running under a live
    lease), so the caller's files hold the whole run. ``on_progress(left)`` is called after each
    poll with the run's attempts still pending or running over all workers. A run with
    ``auto_retry`` is waited for until its failed keys' automatic attempts are due, and they run here
    too. Ctrl-C (KeyboardInterrupt) releases this process's in-flight rollouts as ``interrupted``
    before it propagates."""
    while True:
        dispatcher = Dispatcher(only={run_id}, exit_when_idle=True, on_progress=on_progress)
        asyncio.run(dispatcher.run())
        if runs.finish_if_done(run_id):
            return
        run = Run.objects.filter(pk=run_id).first()
        wait = runs.auto_retry_wait(run) if run is not None and run.status == Run.Status.RUNNING else None
        if wait is None and not Rollout.objects.filter(run_id=run_id, status=Rollout.Status.PENDING).exists():
            return  # ended elsewhere (cancelled, or finished by another worker)
        time.sleep(min(wait or 0.0, 60.0))  # the failed keys' automatic retry is due then


def supervise() -> str:
    """django-q2 scheduled job (and on every worker spawn): reap expired leases of every running run
    (their keys are queued again) and finish runs with nothing left to do."""
    reaped = 0
    for run_id in Run.objects.filter(status=Run.Status.RUNNING).values_list("id", flat=True):
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run_id).first()
            reaped += reap_expired(run_id)
        runs.finish_if_done(run_id)
    return f"requeued {reaped} interrupted rollout(s)"
