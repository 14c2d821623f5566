"""A stored run's ``<stem>_aggregate_metrics.json`` (NeMo Gym's file; DESIGN.md, "Aggregates").

When a run completes (the worker's completion task, or ``collect`` at its end),
``fetch_aggregate_metrics`` sends the run's success rows, stripped as NeMo Gym strips them, to the
env's ``/aggregate_metrics`` (one request per environment server: ``aggregate_metrics``) and keeps
the file's entries in ``Run.aggregate_metrics`` (lossless JSON text, so their key order, which
orders ``gym eval compare``'s rows, survives PostgreSQL): the one entry itself for a run of one
environment server (``{"agent_ref", "_ng_environment_server", "agent_metrics", "key_metrics",
"group_level_metrics", "repeat_level_metrics"}``: the env's reply, labelled), the list of entries
for several. When the env does not serve the route, fails, or the run is too big to send
(``GYMWEB_AGGREGATE_MAX_ROWS``), nothing is stored but the reason (``Run.aggregate_metrics_error``),
and the file is computed locally whenever it is asked for (``run_aggregate_entries``): NeMo Gym's
default computation over the same rows. Imported runs, which have no env, are always computed
locally. A reply stored by an older gymweb (the bare reply) still reads as its run's entry. A run
launched without the env's aggregates (``NOT_ASKED``: a training loop's batch, as NeMo Gym's
``run_examples`` never calls the route) is never sent: its file is computed locally.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from rollouts import targets
from rollouts.collection.export import CHUNK, agent_ordered, agent_ref_of, iter_successes, stamps_rows, success_row
from rollouts.collection.run_settings import NOT_ASKED
from rollouts.collection.stamps import ENVIRONMENT_SERVER_KEY, environment_server_name
from rollouts.evaluation.aggregate_metrics import (
    LOCAL_NOTE,
    REPLY_FIELDS,
    aggregate_metrics_path,
    build_aggregate_metrics,
    strip_row,
    write_aggregate_metrics,
)
from rollouts.evaluation.outputs import check_outputs
from rollouts.models import Rollout, Run

__all__ = [
    "NOT_ASKED",
    "fetch_aggregate_metrics",
    "stored_entries",
    "run_aggregate_entries",
    "run_aggregate_rows",
    "write_run_aggregate_metrics",
]

log = logging.getLogger("gymweb.aggregate")


def run_aggregate_rows(run: Run) -> Iterator[dict[str, Any]]:
    """The run's success rows as ``/aggregate_metrics`` gets them: each ``rollouts.jsonl`` row
    (``export.success_row``: stamps included) stripped (``aggregate_metrics.strip_row``), in key
    order. One parse per row; the responses are dropped at once."""
    if run.is_archived:  # its rows are in the archive's rollouts.jsonl
        for line in iter_successes(run):
            yield strip_row(json.loads(line))
        return
    stamp, ordered = stamps_rows(run), agent_ordered(run)
    last_task, ref = None, None
    fetch = (
        Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED)
        .order_by("task_index", "rollout_index", "id")
        .values_list("task_index", "rollout_index", "verify_json", "task__row_json")
    )
    for task_index, rollout_index, verify_json, task_json in fetch.iterator(chunk_size=CHUNK):
        if task_index != last_task:
            last_task, ref = task_index, agent_ref_of(json.loads(task_json), run)
        yield strip_row(success_row(verify_json, task_index, rollout_index, ref, stamp, ordered))


def fetch_aggregate_metrics(run_id: int) -> str:
    """Ask the run's env for its aggregate metrics and store the outcome (see the module docstring).

    Bounded: at most ``GYMWEB_AGGREGATE_MAX_ROWS`` rows are sent, each request within
    ``GYMWEB_AGGREGATE_TIMEOUT_S`` seconds. Returns a one-line summary. Never raises for the env's
    faults (they are kept in ``run.aggregate_metrics_error``, and the file is then computed locally).
    """
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not run.env_url:
        return "no such run"
    if run.aggregate_metrics_error == NOT_ASKED:
        return NOT_ASKED
    limit = settings.GYMWEB_AGGREGATE_MAX_ROWS
    if Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() > limit:
        return _store(
            run, None, f"not called: more than {limit} successful rows (GYMWEB_AGGREGATE_MAX_ROWS); {LOCAL_NOTE}"
        )
    rows = list(run_aggregate_rows(run))
    if not rows:
        return _store(run, None, "not called: the run has no successful rows")
    # No local fallback here: a file the env did not answer is computed when it is asked for.
    outcome = build_aggregate_metrics(
        rows,
        env_url=run.env_url,
        timeout_s=settings.GYMWEB_AGGREGATE_TIMEOUT_S,
        default_agent=run.agent_name,
        local_fallback=False,
        policy=targets.policy(),
        max_reply_bytes=targets.max_reply_bytes(),
    )
    # Stored only when the env answered for every server (one env serves a run).
    if not outcome.all_from_env:
        return _store(run, None, "; ".join(outcome.notes))
    entries = outcome.entries
    return _store(run, entries[0] if len(entries) == 1 else entries, "")


def _store(run: Run, data: Any, error: str) -> str:
    Run.objects.filter(pk=run.pk).update(aggregate_metrics=data, aggregate_metrics_error=error)
    run.aggregate_metrics, run.aggregate_metrics_error = data, error
    return error or f"stored aggregate metrics of run {run.pk}"


def stored_entries(run: Run) -> list[dict[str, Any]] | None:
    """The aggregate-metrics entries stored on the run from its env's reply (see the module
    docstring), or None when none is stored (or it is not an aggregate reply). A bare reply stored
    by an older gymweb becomes the entry NeMo Gym would write for it (the run's agent and its
    environment server)."""
    data = run.aggregate_metrics
    if isinstance(data, dict) and "agent_ref" in data:
        data = [data]
    elif isinstance(data, dict) and any(k in data for k in REPLY_FIELDS):
        entry: dict[str, Any] = {
            "agent_ref": {"name": run.agent_name},
            ENVIRONMENT_SERVER_KEY: environment_server_name(run.agent_name),
        }
        for k in ("agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics"):  # NeMo Gym's order
            entry[k] = data.get(k, REPLY_FIELDS[k]())
        if data.get("perf_summary") is not None:
            entry["perf_summary"] = data["perf_summary"]
        data = [entry]
    if isinstance(data, list) and data and all(isinstance(e, dict) and "agent_ref" in e for e in data):
        return data
    return None


def run_aggregate_entries(run: Run) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's ``<stem>_aggregate_metrics.json`` entries and notes on where they come from.

    The env's reply stored on the run (``stored_entries``); else computed now, locally, over the
    run's success rows (notes say so, with the reason kept on the run). ``([], [...])`` when the run
    has no successful rows: NeMo Gym writes no file then."""
    stored = stored_entries(run)
    if stored is not None:
        return stored, []
    rows = list(run_aggregate_rows(run))
    if not rows:
        return [], [
            "the run has no successful rollouts, so there are no aggregate metrics (NeMo Gym writes no file then)"
        ]
    outcome = build_aggregate_metrics(rows, default_agent=run.agent_name)
    reason = run.aggregate_metrics_error or (
        "an imported run has no environment to ask"
        if run.status == Run.Status.IMPORTED
        else "the environment was not asked"
    )
    return outcome.entries, [f"{reason}; {LOCAL_NOTE}"]


def write_run_aggregate_metrics(
    run: Run, output: str | Path, *, overwrite: bool = False
) -> tuple[Path | None, list[str]]:
    """Write ``run_aggregate_entries(run)`` to ``aggregate_metrics.aggregate_metrics_path(output)``
    (``results/rollouts.jsonl`` → ``results/rollouts_aggregate_metrics.json``), never over an existing
    file unless ``overwrite`` (``outputs.OutputExists``, raised before any work).

    Returns ``(path, notes)``; ``path`` is None when the run has no successful rows (no file, as in
    NeMo Gym: with ``overwrite`` a file left there by an earlier run is removed, so it cannot be
    read as this run's)."""
    (path,) = check_outputs([aggregate_metrics_path(output)], overwrite)
    entries, notes = run_aggregate_entries(run)
    if not entries:
        if path.exists():
            path.unlink()
            notes.append(f"removed {path}, left by an earlier run")
        return None, notes
    return write_aggregate_metrics(entries, path, overwrite=True), notes
