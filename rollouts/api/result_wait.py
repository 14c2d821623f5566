"""How an open results stream (``GET /api/v1/runs/{id}/results``) waits for new results without
querying the run over and over: it looks again as soon as the database may hold new rows.

- SQLite: every commit of another connection changes ``PRAGMA data_version``; the stream reads it
  on its own connection every ``GYMWEB_WAKE_POLL_S`` (a few microseconds each) and looks when it
  moved.
- PostgreSQL: the dispatcher's write of finished results sends ``NOTIFY gymweb_results``
  (``rollouts.collection.notify.notify_results``); the stream's connection ``LISTEN``\\s.
- Other backends, or ``GYMWEB_WAKE_POLL_S`` = 0: a look every ``GYMWEB_STREAM_POLL_S``.

A missed signal (a write of another kind: a run cancelled, a result stored part by part) costs at
most ``FALLBACK_S``: the stream then looks anyway.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import connection

from rollouts.collection.notify import RESULTS_CHANNEL

log = logging.getLogger("gymweb.api")

FALLBACK_S = 1.0

__all__ = ["FALLBACK_S", "ResultWait"]


class ResultWait:
    """``wait()`` returns once the database may have changed since the previous ``wait()`` (or
    since this object was made), or after ``FALLBACK_S`` at most. Make it before the first look,
    so a write between that look and the first ``wait()`` is not missed; ``close()`` it (a
    context manager) in the thread that made it."""

    def __init__(self) -> None:
        self.check_s = float(settings.GYMWEB_WAKE_POLL_S)
        self.poll_s = float(settings.GYMWEB_STREAM_POLL_S)
        self.mode = connection.vendor if self.check_s > 0 else ""
        self.version = None
        try:
            if self.mode == "sqlite":
                self.version = self._data_version()
            elif self.mode == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(f"LISTEN {RESULTS_CHANNEL}")
            else:
                self.mode = ""
        except Exception as exc:  # polling still works
            log.info("results stream: waiting by polling (%s: %s)", exc.__class__.__name__, exc)
            self.mode = ""

    def __enter__(self) -> ResultWait:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _data_version(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA data_version")
            return cursor.fetchone()[0]

    def wait(self) -> None:
        """Block until the next look is worth making (see the class)."""
        if self.mode == "sqlite":
            deadline = time.monotonic() + FALLBACK_S
            while True:
                version = self._data_version()
                if version != self.version:
                    self.version = version
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                time.sleep(min(self.check_s, left))
        elif self.mode == "postgresql":
            raw = connection.connection
            for _note in raw.notifies(timeout=FALLBACK_S, stop_after=1):
                pass
            # Several writes may have notified meanwhile: one look reads them all.
            for _note in raw.notifies(timeout=0):
                pass
        else:
            time.sleep(self.poll_s)

    def close(self) -> None:
        """Stop listening (PostgreSQL: the connection may serve later requests)."""
        if self.mode == "postgresql" and connection.connection is not None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"UNLISTEN {RESULTS_CHANNEL}")
            except Exception:  # the connection went away: nothing listens any more
                pass
        self.mode = ""
