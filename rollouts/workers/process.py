"""Process entry points of the dispatcher: the thread each django-q2 worker process starts (with
its SIGTERM handler), and one run served to its end in the calling process (the CLI)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from django.conf import settings

from rollouts.collection import runs
from rollouts.models import Rollout, Run
from rollouts.workers.dispatcher import Dispatcher

log = logging.getLogger("gymweb.dispatch")

__all__ = ["run_in_process", "start_in_worker_process"]

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
            if dispatcher.stop_requested or not threading.main_thread().is_alive():
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
