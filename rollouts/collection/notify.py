"""The sending side of the launch wake-up: ``notify_launch`` tells idle dispatchers a run was
launched. On PostgreSQL it is ``NOTIFY`` on ``CHANNEL`` in the current transaction (delivered on
commit); on SQLite the commit itself is the signal. The listening side is
``rollouts.workers.wakeup``."""

from __future__ import annotations

import logging

from django.db import connection

log = logging.getLogger("gymweb.dispatch")

CHANNEL = "gymweb_runs"

__all__ = ["CHANNEL", "notify_launch"]


def notify_launch(run_id: int) -> None:
    """Tell every dispatcher that ``run_id`` was launched (on PostgreSQL, at the commit of the
    current transaction; on SQLite the commit itself is the signal). Never raises: a lost
    notification only delays the start to the next poll."""
    if connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(run_id)])
    except Exception as exc:  # the run is launched either way
        log.warning("could not notify the workers of run %s (%s); they start it at their next poll", run_id, exc)
