"""Waking idle dispatchers when a run is launched, through the database, so a new batch starts
within tens of milliseconds instead of at the next poll (``GYMWEB_POLL_S``).

- PostgreSQL: ``runs.launch`` sends ``NOTIFY gymweb_runs`` in its transaction (delivered on
  commit; ``rollouts.collection.notify``); each dispatcher's watcher thread holds its own
  connection that ``LISTEN``\\s.
- SQLite: every commit of another connection changes ``PRAGMA data_version``; the watcher reads it
  every ``GYMWEB_WAKE_POLL_S`` on its own read-only connection and, when it changed, looks at the
  running runs (their ids and start times, a few rows) for one it has not seen.

Either way a wake-up only makes the dispatcher refresh its runs at once; a missed one costs at most
one poll. Works with either django-q2 broker (ORM or Redis): the broker is not involved.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import connections

from rollouts.collection.notify import CHANNEL

log = logging.getLogger("gymweb.dispatch")

__all__ = ["Watcher"]


class Watcher:
    """A daemon thread that calls ``wake()`` when a run may have been launched. ``stop()`` ends it
    (within a second). Does nothing on backends other than PostgreSQL and SQLite."""

    def __init__(self, wake: Callable[[], None], poll_s: float | None = None):
        self.wake = wake
        self.poll_s = settings.GYMWEB_WAKE_POLL_S if poll_s is None else poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watcher:
        vendor = connections["default"].vendor
        target = {"postgresql": self._listen, "sqlite": self._watch_sqlite}.get(vendor)
        if target is not None and self.poll_s > 0:
            self._thread = threading.Thread(target=self._guard, args=(target,), name="gymweb-wakeup", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _guard(self, target: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                target()
            except Exception as exc:  # the database went away: polls still start runs
                log.info("the run watcher stopped (%s: %s); trying again in 5 s", exc.__class__.__name__, exc)
                self._stop.wait(5.0)

    def _listen(self) -> None:
        wrapper = connections.create_connection("default")
        conn = wrapper.get_new_connection(wrapper.get_connection_params())
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {CHANNEL}")
            while not self._stop.is_set():
                for _note in conn.notifies(timeout=1.0):
                    self.wake()
        finally:
            conn.close()

    def _watch_sqlite(self) -> None:
        name = str(connections["default"].settings_dict["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            self._stop.wait()
            return
        from rollouts.models import Run

        query = f"SELECT id, started FROM {Run._meta.db_table} WHERE status = ?"
        conn = sqlite3.connect(f"file:{name}?mode=ro", uri=True, timeout=1.0, check_same_thread=False)
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            seen = set(conn.execute(query, [Run.Status.RUNNING]).fetchall())
            while not self._stop.wait(self.poll_s):
                now = conn.execute("PRAGMA data_version").fetchone()[0]
                if now == version:
                    continue
                version = now
                running = set(conn.execute(query, [Run.Status.RUNNING]).fetchall())
                if running - seen:
                    self.wake()
                seen = running
        finally:
            conn.close()
