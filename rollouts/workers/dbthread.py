"""The one thread that runs a dispatcher's database work, in submission order, so its event loop
never waits on the database."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from django.db import close_old_connections

__all__ = ["DbThread", "db_call"]


class DbThread:
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


def db_call(fn: Callable, *args: Any) -> Any:
    # Long-lived threads must drop connections Django considers stale (CONN_MAX_AGE, errors).
    close_old_connections()
    return fn(*args)
