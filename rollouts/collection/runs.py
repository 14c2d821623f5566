"""A run's lifecycle in the database: create (materialise), resume (retry failed), cancel, finish.

Views, the CLI and the workers all go through these functions, so there is one obvious place for
each rule. Every function that writes does so in one short transaction: a bad input stores nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from rollouts.collection.datasets import ParsedDataset
from rollouts.collection.notify import notify_launch
from rollouts.collection.run_rows import BULK, create_run_from_rows
from rollouts.lossless import dumps
from rollouts.models import Dataset, DatasetRow, Rollout, Run
from rollouts.teams import team_for_new

log = logging.getLogger("gymweb.runs")


def _dumps(obj: Any) -> str:
    return dumps(obj)  # rollouts.lossless: the one JSON text writer for storage and files


def store_dataset(parsed: ParsedDataset, name: str, user=None, team=None) -> Dataset:
    """Keep a validated dataset for reuse by later runs, in ``team`` (default: the user's first
    team, ``rollouts.teams.team_for_new``). Returns the new ``Dataset``."""
    with transaction.atomic():
        dataset = Dataset.objects.create(
            name=name[:200],
            source_name=name[:200],
            created_by=user,
            num_rows=len(parsed.rows),
            sha256=parsed.sha256,
            team_id=team_for_new(user, team),
        )
        DatasetRow.objects.bulk_create(
            (
                DatasetRow(dataset=dataset, line=line, data_json=_dumps(row))
                for line, row in zip(parsed.lines, parsed.rows)
            ),
            batch_size=BULK,
        )
    return dataset


def earlier_upload(sha256: str, name: str, num_rows: int, user, team_id: int) -> Dataset | None:
    """The newest dataset ``user`` uploaded with the same bytes (``sha256``), name, row count and
    team, or None (also for no user); never one still being written."""
    if not sha256 or user is None or not getattr(user, "pk", None):
        return None
    return (
        Dataset.objects.filter(
            created_by=user,
            sha256=sha256,
            source_name=name[:200],
            num_rows=num_rows,
            team_id=team_id,
            writing_until__isnull=True,
        )
        .order_by("-id")
        .first()
    )


def load_dataset(dataset: Dataset) -> ParsedDataset:
    """A stored dataset back as a ``ParsedDataset`` (rows in file order)."""
    parsed = ParsedDataset(sha256=dataset.sha256)
    for line, text in dataset.rows.order_by("line").values_list("line", "data_json").iterator(chunk_size=BULK):
        parsed.rows.append(json.loads(text))
        parsed.lines.append(line)
        parsed.texts.append(text)
    return parsed


def create_run(
    parsed: ParsedDataset, *, name: str, user=None, dataset: Dataset | None = None, team=None, **options: Any
) -> Run:
    """Materialise ``parsed`` into a new run with one pending rollout per (task, rollout) key.

    ``options`` are ``Run`` fields: agent_url, env_url, agent_name, concurrency, max_steps,
    num_repeats, limit, max_attempts, remote_responses_timeout_s, run_timeout_s, overrides,
    source_file. Written as every run is, ``BULK`` rows per short transaction, the run shown
    nowhere until its last batch is in (``run_rows.create_run_from_rows``): a big dataset
    never holds SQLite's write lock for long. It is not started: call ``launch``. Raises
    ``RunTooLarge`` over ``GYMWEB_MAX_KEYS_PER_RUN`` keys (nothing stored); on any other failure
    deletes what it stored and re-raises. The run's team: ``team``, else the dataset's, else the
    user's first (``rollouts.teams.team_for_new``).
    """
    return create_run_from_rows(parsed, name=name, user=user, dataset=dataset, team=team, **options)


def launch(run: Run) -> None:
    """Mark the run running: idle dispatchers are woken at once (``rollouts.collection.notify``),
    busy ones pick it up at their next poll (``GYMWEB_POLL_S``), and claim rollouts atomically
    (``rollouts.workers.claims``)."""
    changed = Run.objects.filter(
        pk=run.pk,
        status__in=[Run.Status.QUEUED, Run.Status.COMPLETED, Run.Status.CANCELLED],
        writing_until__isnull=True,  # not while its upload is being written (collection.writing)
    ).update(status=Run.Status.RUNNING, started=timezone.now(), finished=None)
    if changed:
        notify_launch(run.pk)
    run.refresh_from_db()
    log.info("run %s launched: %s (concurrency %s)", run.pk, run.status, run.concurrency, extra={"run": run.pk})


def without_superseded(qs: QuerySet) -> QuerySet:
    """``qs`` (rollouts) without the kill-shaped rows (cancelled, interrupted) that a later attempt of
    the same key replaced: such a row is not an attempt and no file holds it; it stays reachable
    under its key, among the key's attempts on the rollout page."""
    later = Rollout.objects.filter(
        run=OuterRef("run"),
        task_index=OuterRef("task_index"),
        rollout_index=OuterRef("rollout_index"),
        id__gt=OuterRef("id"),
    )
    return qs.exclude(Q(status__in=Rollout.KILL_SHAPED) & Exists(later))


def retryable_keys(run: Run) -> dict[tuple[int, int], tuple[int, int, bool]]:
    """Keys that may get a new attempt: ``{(task, rollout): (task_id, next_attempt, kill_shaped)}``.

    A key qualifies when it has no succeeded and no pending/running attempt and either its latest
    row is kill-shaped (cancelled/interrupted: not an attempt, runs again with the same number) or
    it failed non-terminally fewer than ``max_attempts`` times (DESIGN.md, "Retry"; terminal
    failures are never retried).
    """
    rows = (
        Rollout.objects.filter(run=run)
        .values("task_index", "rollout_index", "task_id")
        .annotate(
            live=Count(
                "id", filter=Q(status__in=[Rollout.Status.PENDING, Rollout.Status.RUNNING, Rollout.Status.SUCCEEDED])
            ),
            failed=Count("id", filter=Q(status=Rollout.Status.FAILED)),
            terminal=Count("id", filter=Q(status=Rollout.Status.FAILED, terminal=True)),
            last_attempt=Max("attempt"),
        )
        .filter(live=0, terminal=0)
    )
    out = {}
    for r in rows:
        failed = r["failed"]
        if failed < r["last_attempt"]:  # the latest attempt number was not spent: kill-shaped
            out[(r["task_index"], r["rollout_index"])] = (r["task_id"], r["last_attempt"], True)
        elif failed < run.max_attempts:
            out[(r["task_index"], r["rollout_index"])] = (r["task_id"], failed + 1, False)
    return out


def keys_left(run: Run) -> dict[str, int]:
    """Keys without a success, by why: ``{"retryable": n, "terminal": n, "exhausted": n, "active": n}``.

    ``retryable``: ``resume`` gives them a new attempt (``retryable_keys``); ``terminal``: a
    terminal failure, never retried; ``exhausted``: failed ``max_attempts`` times (a higher cap
    retries them); ``active``: an attempt is pending or running. One SQL aggregate.
    """
    rows = (
        Rollout.objects.filter(run=run)
        .values("task_index", "rollout_index")
        .annotate(
            succeeded=Count("id", filter=Q(status=Rollout.Status.SUCCEEDED)),
            active=Count("id", filter=Q(status__in=[Rollout.Status.PENDING, Rollout.Status.RUNNING])),
            failed=Count("id", filter=Q(status=Rollout.Status.FAILED)),
            terminal=Count("id", filter=Q(status=Rollout.Status.FAILED, terminal=True)),
            last_attempt=Max("attempt"),
        )
        .filter(succeeded=0)
        .values_list("active", "failed", "terminal", "last_attempt")
    )
    out = {"retryable": 0, "terminal": 0, "exhausted": 0, "active": 0}
    for active, failed, terminal, last_attempt in rows:
        if active:
            out["active"] += 1
        elif terminal:
            out["terminal"] += 1
        elif failed < last_attempt or failed < run.max_attempts:  # kill-shaped latest row, or attempts left
            out["retryable"] += 1
        else:
            out["exhausted"] += 1
    return out


def resume(run: Run, max_attempts: int | None = None) -> int:
    """Retry failed keys and re-run kill-shaped ones (the spec's resume); successes are kept.

    ``max_attempts`` (optional) updates the run's attempt cap first. Returns how many new pending
    attempts were created; launches the run when there are any (or when it has pending work).
    """
    with transaction.atomic():
        if max_attempts is not None and max_attempts != run.max_attempts:
            run.max_attempts = max_attempts
            run.save(update_fields=["max_attempts"])
        keys = retryable_keys(run)
        Rollout.objects.bulk_create(
            (
                Rollout(run=run, task_id=task_id, task_index=t, rollout_index=r, attempt=attempt)
                for (t, r), (task_id, attempt, _) in keys.items()
            ),
            batch_size=BULK,
        )
        pending = Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).exists()
        if pending:
            launch(run)
    return len(keys)


class URLChangeRefused(ValueError):
    """A resume names other agent or env URLs than the run's, without allowing the change."""


def change_urls(run: Run, agent_url: str, env_url: str, *, allow: bool) -> dict[str, list[str]]:
    """Point a run about to be resumed at ``agent_url``/``env_url`` (validated base URLs).

    Same URLs: nothing happens. Other URLs: with ``allow`` the run's URLs are replaced and the
    change is appended to ``Run.url_changes`` (``{"at", "agent_url": [old, new], "env_url": [old,
    new]}``, a key only for a URL that changed), which the run page shows; without it,
    ``URLChangeRefused`` naming both URLs. Returns the changes (empty when none). Each attempt keeps
    the URLs it ran against (``Rollout.agent_url``/``env_url``).
    """
    changes = {
        name: [old, new]
        for name, old, new in (("agent_url", run.agent_url, agent_url), ("env_url", run.env_url, env_url))
        if old != new
    }
    if not changes:
        return changes
    if not allow:
        flags = {"agent_url": "--agent-url", "env_url": "--env-url"}
        said = "; ".join(
            f"{flags[name]} {new} but the run was collected with {old}" for name, (old, new) in changes.items()
        )
        raise URLChangeRefused(
            f"run #{run.pk} cannot be resumed against other services without saying so: {said}. "
            "Resume with the run's URLs, or add --allow-url-change to switch (the run keeps each attempt's "
            "URLs and its page shows the change)."
        )
    run.agent_url, run.env_url = agent_url, env_url
    run.url_changes = [*(run.url_changes or []), {"at": timezone.now().isoformat(), **changes}]
    run.save(update_fields=["agent_url", "env_url", "url_changes"])
    return changes


def cancel(run: Run) -> bool:
    """Stop a run: no new claims from now on; pending attempts become ``cancelled`` at once and
    in-flight ones end as ``cancelled`` within a few seconds (their workers poll the run status).
    Returns False when the run was already final."""
    with transaction.atomic():
        changed = Run.objects.filter(pk=run.pk, status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).update(
            status=Run.Status.CANCELLED, finished=timezone.now()
        )
        if changed:
            Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).update(
                status=Rollout.Status.CANCELLED, finished=timezone.now()
            )
    run.refresh_from_db()
    return bool(changed)


def _failed_keys_left(run: Run) -> dict[tuple[int, int], tuple[int, int, bool]]:
    """``retryable_keys`` without the kill-shaped ones: failed keys with attempts left."""
    return {k: v for k, v in retryable_keys(run).items() if not v[2]}


def auto_retry_wait(run: Run, now=None, keys: dict | None = None) -> float | None:
    """Seconds until ``run``'s failed keys get their automatic new attempt (0: due now), or None when
    the run retries nothing by itself: ``auto_retry`` off, or no failed key with attempts left
    (terminal failures and keys at ``max_attempts`` never are; cancelled or interrupted keys are run
    by Retry or by the worker that reaps them, not here). ``keys``: ``_failed_keys_left(run)`` when
    the caller has it already.

    The wait before the wave of attempt ``n`` is ``GYMWEB_AUTO_RETRY_DELAY_S`` × 2^(n-2), counted
    from the run's last failure: an env restarted within seconds is back by then."""
    if not run.auto_retry:
        return None
    keys = _failed_keys_left(run) if keys is None else keys
    if not keys:
        return None
    delay = float(settings.GYMWEB_AUTO_RETRY_DELAY_S) * 2 ** max(
        0, min(attempt for _t, attempt, _k in keys.values()) - 2
    )
    last = Rollout.objects.filter(run=run, status=Rollout.Status.FAILED).aggregate(last=Max("finished"))["last"]
    if last is None:
        return 0.0
    elapsed = ((now or timezone.now()) - last).total_seconds()
    return max(0.0, delay - elapsed)


def _retry_failed(run: Run, keys: dict[tuple[int, int], tuple[int, int, bool]]) -> int:
    """New pending attempts for ``keys`` (``_failed_keys_left``)."""
    Rollout.objects.bulk_create(
        (
            Rollout(run=run, task_id=task_id, task_index=t, rollout_index=r, attempt=attempt)
            for (t, r), (task_id, attempt, _) in keys.items()
        ),
        batch_size=BULK,
    )
    if keys:
        log.info("run %s: %d failed rollout(s) retried automatically", run.pk, len(keys))
    return len(keys)


def finish_if_done(run_id: int) -> bool:
    """Mark a running run completed when no attempt is pending or running and none is due for an
    automatic retry (``auto_retry_wait``; when one is due now its new attempts are queued here).
    Returns True when this call finished it (exactly one caller wins: the run's row is locked first)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, status=Run.Status.RUNNING).first()
        if run is None:
            return False
        busy = Rollout.objects.filter(
            run_id=run_id, status__in=[Rollout.Status.PENDING, Rollout.Status.RUNNING]
        ).exists()
        if busy:
            return False
        keys = _failed_keys_left(run) if run.auto_retry else {}
        wait = auto_retry_wait(run, keys=keys)
        if wait is not None:
            if wait <= 0:
                _retry_failed(run, keys)  # the keys just read, under the run's lock: read once
            return False
        done = bool(
            Run.objects.filter(pk=run_id, status=Run.Status.RUNNING).update(
                status=Run.Status.COMPLETED, finished=timezone.now()
            )
        )
    if done:
        by_status = {k: v for k, v in counts(Run(pk=run_id)).items() if v}
        log.info(
            "run %s completed: %s",
            run_id,
            ", ".join(f"{n} {status}" for status, n in by_status.items()) or "no rollouts",
            extra={"run": run_id, "counts": by_status},
        )
    return done


def counts(run: Run) -> dict[str, int]:
    """Rollout rows by status, in one SQL aggregate: ``{"pending": n, "running": n, ...}``."""
    result = {s: 0 for s in Rollout.Status.values}
    for row in Rollout.objects.filter(run=run).values("status").annotate(n=Count("id")):
        result[row["status"]] = row["n"]
    return result
