"""Background tasks: long work a page starts (a new run from an uploaded dataset, an import, an
agent check, a reverify, a health check) runs on a django-q2 worker while the page polls its
progress, so the web request returns at once.

``start`` makes a ``BackgroundTask`` row (refusing a user's task past
``GYMWEB_MAX_TASKS_PER_USER``, and handing back the queued or running task with the same content
hash instead of a second one), keeps its uploaded files under ``task_dir`` and queues ``run``.
``run`` claims the row atomically (one worker runs a task once) and calls the job named in
``JOBS``: ``job(task, progress) -> Done``; a ``TaskFailed`` it raises is the message the page shows.
With ``GYMWEB_TASKS_INLINE`` the task runs inside the request that started it.

A worker can die mid-task (SIGKILL, out of memory, power lost) and never say so. Its claim takes a
lease (``alive_until``, ``GYMWEB_WRITE_LEASE_S``) that a thread of the worker renews while the
process lives, from the claim on (so a worker killed while still reading the file is found as one
killed while writing). ``reap`` fails the tasks whose lease lapsed, with a reason the page shows:
the supervisor's sweep calls it, and so do the places that show or count a task (its page and the
API's, ``start``'s per-user limit and its same-content check), so a dead task is neither shown as
running, nor handed back to a re-submit, nor counted, even while no qcluster runs the sweep. What
its writer stored is shown nowhere and deleted by the sweep (``rollouts.collection.writing``).

The broker can lose a queued task's message too (a Redis restarted without persistence, a flushed
queue): no worker ever claims the task and it would wait as "queued" for ever. A queued task
carries the time after which it is sent again (``alive_until``, ``RESEND_AFTER_S`` after each
sending); the sweep's ``resend`` sends the ones no worker took by then. A second message for a task
still in the queue costs a worker one refused claim, never a second run.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import import_module
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.utils import timezone

from rollouts.collection import writing
from rollouts.models import BackgroundTask

log = logging.getLogger("gymweb.tasks")

__all__ = [
    "Done",
    "Progress",
    "TaskFailed",
    "TooManyTasks",
    "content_hash",
    "current",
    "reap",
    "resend",
    "run",
    "start",
    "task_dir",
]

# kind -> "module.function" of its job (a string: the pages' modules are imported only when run)
JOBS: dict[str, str] = {
    "upload": "rollouts.web.views.upload_job",
    "import": "rollouts.web.import_views.import_job",
    "check_agent": "rollouts.web.check_views.check_agent_job",
    "reverify": "rollouts.web.evaluation_views.reverify_job",
    "health_check": "rollouts.web.evaluation_views.health_check_job",
}

# django-q2 stops a task after this long (a large import takes minutes; the cluster's own timeout
# is for its short tasks); one redelivered meanwhile is not run twice (``run`` claims it).
TASK_TIMEOUT_S = 3600
# A running task whose worker has not finished it in this long was lost with its worker.
STALE_AFTER_S = TASK_TIMEOUT_S + 300.0
# A queued task no worker took in this long is sent to the workers again (``resend``): longer than a
# busy queue usually holds a task, so a task only waiting its turn gets one spare message at most
# every few minutes.
RESEND_AFTER_S = 300.0


class TooManyTasks(Exception):
    """The user already has ``GYMWEB_MAX_TASKS_PER_USER`` tasks queued or running."""

    def __init__(self, limit: int):
        super().__init__(
            f"You already have {limit} background task(s) queued or running (GYMWEB_MAX_TASKS_PER_USER): "
            "wait for one to finish, then try again."
        )


class TaskFailed(Exception):
    """A job's refusal: ``message`` is shown on the task page; ``result`` is kept with it."""

    def __init__(self, message: str, result: dict[str, Any] | None = None):
        super().__init__(message)
        self.result = result or {}


@dataclass
class Done:
    """What a job hands back: the page's ``message``, the result's ``url`` and any other ``result``."""

    message: str
    url: str = ""
    result: dict[str, Any] = field(default_factory=dict)


class Progress:
    """A job's progress reporter: ``progress(fraction, message)`` stores at most every half second."""

    def __init__(self, task: BackgroundTask):
        self.task = task
        self._last = 0.0

    def __call__(self, fraction: float | None, message: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        fraction = None if fraction is None else max(0.0, min(1.0, fraction))
        BackgroundTask.objects.filter(pk=self.task.pk).update(progress=fraction, message=message)


def task_dir(task_id: int) -> Path:
    """Where a task's uploaded files wait for its worker (removed when it ends)."""
    return Path(settings.DATA_DIR) / "tasks" / str(task_id)


def content_hash(parts: Iterable[Any]) -> str:
    """SHA-256 hex of ``parts``: strings, and uploaded files read in chunks (bounded memory)."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(b"s")
            digest.update(part.encode("utf-8", "surrogatepass"))
        else:
            digest.update(b"f")
            part.seek(0)
            for chunk in part.chunks():
                digest.update(chunk)
            part.seek(0)
        digest.update(b"\0")
    return digest.hexdigest()


def _dead_message(kind: str) -> str:
    label = BackgroundTask.Kind(kind).label if kind in BackgroundTask.Kind.values else "task"
    return (
        f"The worker running this {label} stopped (no sign of it for GYMWEB_WRITE_LEASE_S, "
        f"{float(settings.GYMWEB_WRITE_LEASE_S):g} s: it was killed, ran out of memory or its machine went down); "
        "nothing of it was kept; submit it again."
    )


def reap(**where: Any) -> int:
    """Fail the running tasks (those matching ``where``, e.g. ``pk=``) whose worker is gone: its
    lease (``alive_until``) lapsed, or, for a task run without one (inline), it ran past
    ``STALE_AFTER_S``. Each gets a message saying so. Returns how many were failed."""
    now = timezone.now()
    running = BackgroundTask.objects.filter(status=BackgroundTask.Status.RUNNING, **where)
    failed = 0
    for pk, kind in running.filter(alive_until__lt=now).values_list("pk", "kind"):
        failed += BackgroundTask.objects.filter(
            pk=pk, status=BackgroundTask.Status.RUNNING, alive_until__lt=now
        ).update(status=BackgroundTask.Status.FAILED, finished=now, progress=None, message=_dead_message(kind))
    failed += running.filter(alive_until__isnull=True, started__lt=now - timedelta(seconds=STALE_AFTER_S)).update(
        status=BackgroundTask.Status.FAILED,
        finished=now,
        message="The worker running this task stopped before it finished: start it again.",
    )
    return failed


def current(task: BackgroundTask) -> BackgroundTask:
    """``task`` as it stands: failed (``reap``) when it is running with a lapsed lease. A read
    only, unless it lapsed: a page polling a live task never waits for the database's write lock."""
    lapsed = task.alive_until is not None and task.alive_until < timezone.now()
    if lapsed and task.status == BackgroundTask.Status.RUNNING:
        reap(pk=task.pk)
        task.refresh_from_db()
    return task


def _keep_files(task: BackgroundTask, files: list[tuple[str, Any]]) -> list[dict[str, str]]:
    """Move (or write) each ``(slot, upload)`` into the task's folder; Django's spooled temporary
    file is moved, not copied."""
    folder = task_dir(task.pk)
    folder.mkdir(parents=True, exist_ok=True)
    kept = []
    for n, (slot, upload) in enumerate(files):
        path = folder / f"{n}-{slot}"
        temporary = getattr(upload, "temporary_file_path", None)
        if temporary is not None:
            upload.file.flush()
            shutil.move(temporary(), path)  # a rename on one file system
        else:
            upload.seek(0)
            with path.open("wb") as out:
                for chunk in upload.chunks():
                    out.write(chunk)
        kept.append({"slot": slot, "name": upload.name or "", "path": str(path)})
    return kept


def start(
    kind: str,
    user,
    params: dict[str, Any] | None = None,
    files: list[tuple[str, Any]] | None = None,
    dedupe_key: str = "",
) -> tuple[BackgroundTask, bool]:
    """Queue a ``kind`` job for ``user``: ``(task, created)``. ``created`` is False when a queued or
    running task of the user with the same ``dedupe_key`` exists: that one is handed back and
    nothing is queued. Raises ``TooManyTasks`` past the per-user limit (nothing queued)."""
    limit = int(settings.GYMWEB_MAX_TASKS_PER_USER)
    reap(user=user)  # a dead task is neither handed back nor counted
    with transaction.atomic():
        # One user's starts take turns (PostgreSQL: the user's row lock; SQLite: its write lock).
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        active = BackgroundTask.objects.filter(user=user, status__in=BackgroundTask.ACTIVE)
        if dedupe_key:
            same = active.filter(kind=kind, dedupe_key=dedupe_key).first()
            if same is not None:
                return same, False
        if active.count() >= limit:
            raise TooManyTasks(limit)
        try:
            with transaction.atomic():
                task = BackgroundTask.objects.create(kind=kind, user=user, params=params or {}, dedupe_key=dedupe_key)
        except IntegrityError:  # the same content started a moment ago
            return active.get(kind=kind, dedupe_key=dedupe_key), False
    if files:
        try:
            task.params = {**task.params, "files": _keep_files(task, files)}
        except OSError as exc:
            _finish(task, BackgroundTask.Status.FAILED, f"The upload could not be kept for the worker: {exc}")
            return task, True
        BackgroundTask.objects.filter(pk=task.pk).update(params=task.params)
    _enqueue(task)
    task.refresh_from_db()
    return task, True


def _enqueue(task: BackgroundTask) -> None:
    inline = bool(settings.GYMWEB_TASKS_INLINE)
    if inline:
        run(task.pk, lease=False)
        return
    BackgroundTask.objects.filter(pk=task.pk, status=BackgroundTask.Status.QUEUED).update(alive_until=_resend_at())
    transaction.on_commit(lambda: _send(task.pk, task.kind))


def _resend_at():
    return timezone.now() + timedelta(seconds=RESEND_AFTER_S)


def _send(task_id: int, kind: str) -> None:
    from django_q.tasks import async_task

    async_task("rollouts.background.run", task_id, task_name=f"task-{task_id}-{kind}", timeout=TASK_TIMEOUT_S)


def resend() -> int:
    """Send again each queued task that no worker claimed ``RESEND_AFTER_S`` after it was last
    sent (its broker message lost, or the queue that long), and move its next sending on by as
    much; one supervisor sends it when several sweep at once. Returns how many were sent."""
    now = timezone.now()
    sent = 0
    overdue = BackgroundTask.objects.filter(status=BackgroundTask.Status.QUEUED, alive_until__lt=now)
    for pk, kind in overdue.values_list("pk", "kind"):
        if BackgroundTask.objects.filter(pk=pk, status=BackgroundTask.Status.QUEUED, alive_until__lt=now).update(
            alive_until=_resend_at()
        ):
            log.warning(
                "background task %s (%s): no worker took it within %g s of its sending; sent again",
                pk,
                kind,
                RESEND_AFTER_S,
            )
            _send(pk, kind)
            sent += 1
    return sent


def _finish(task: BackgroundTask, status: str, message: str, url: str = "", result: dict | None = None) -> None:
    # a task already failed as dead (its worker stalled past its lease) stays failed
    BackgroundTask.objects.filter(pk=task.pk, status__in=BackgroundTask.ACTIVE).update(
        status=status,
        message=message,
        result_url=url,
        result=result or {},
        progress=1.0 if status == BackgroundTask.Status.DONE else None,
        finished=timezone.now(),
    )


class _Lease:
    """Renews task ``task_id``'s ``alive_until`` every quarter of ``GYMWEB_WRITE_LEASE_S`` from a
    daemon thread of the worker, until ``stop``: it stops with the process, whatever kills it. A
    lapsed lease is never renewed (the task was, or is about to be, failed as dead)."""

    def __init__(self, task_id: int):
        self.task_id = task_id
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._renew, name=f"gymweb-task-{task_id}", daemon=True)
        self.thread.start()

    def _renew(self) -> None:
        every = max(0.1, float(settings.GYMWEB_WRITE_LEASE_S) / 4)
        try:
            while not self.stopped.wait(every):
                try:
                    BackgroundTask.objects.filter(
                        pk=self.task_id, status=BackgroundTask.Status.RUNNING, alive_until__gte=timezone.now()
                    ).update(alive_until=writing.lease())
                except DatabaseError as exc:  # a short outage: the next beat tries again
                    log.warning("background task %s: its lease could not be renewed (%s)", self.task_id, exc)
        finally:
            connections.close_all()  # this thread's own connections

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


def run(task_id: int, lease: bool = True) -> str:
    """The worker's entry point: claim task ``task_id`` (a task already claimed is left alone) with
    a lease its worker renews while it lives (``lease``; False: run inside the request that
    started it), run its job, store how it ended, remove its files. Returns the status it ended in."""
    claimed = BackgroundTask.objects.filter(pk=task_id, status=BackgroundTask.Status.QUEUED).update(
        status=BackgroundTask.Status.RUNNING,
        started=timezone.now(),
        progress=0.0,
        alive_until=writing.lease() if lease else None,
    )
    if not claimed:
        return "not claimed"
    task = BackgroundTask.objects.get(pk=task_id)
    renewal = _Lease(task_id) if lease else None
    try:
        module, _, name = JOBS[task.kind].rpartition(".")
        job = getattr(import_module(module), name)
        done: Done = job(task, Progress(task))
    except TaskFailed as exc:
        _finish(task, BackgroundTask.Status.FAILED, str(exc), result=exc.result)
    except writing.LeaseLost as exc:
        _finish(task, BackgroundTask.Status.FAILED, f"The worker stalled: {exc}; submit it again.")
    except Exception as exc:
        log.exception("background task %s (%s) failed", task.pk, task.kind)
        _finish(
            task,
            BackgroundTask.Status.FAILED,
            f"The task failed unexpectedly ({type(exc).__name__}); the server's log has the details.",
        )
    else:
        _finish(task, BackgroundTask.Status.DONE, done.message, done.url, done.result)
    finally:
        if renewal is not None:
            renewal.stop()
        shutil.rmtree(task_dir(task.pk), ignore_errors=True)
    return BackgroundTask.objects.filter(pk=task_id).values_list("status", flat=True).get()
