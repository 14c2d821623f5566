"""The sending side of two wake-ups through the database: ``notify_launch`` tells idle
dispatchers a run was launched (the listening side: ``rollouts.workers.wakeup``);
``notify_results`` tells open results streams that runs have new results (the listening side:
``rollouts.api.result_wait``). On PostgreSQL each is a ``NOTIFY`` in the current transaction
(delivered on commit); on SQLite the commit itself is the signal."""

from __future__ import annotations

import logging

from django.db import connection

log = logging.getLogger("gymweb.dispatch")

CHANNEL = "gymweb_runs"
RESULTS_CHANNEL = "gymweb_results"

__all__ = ["CHANNEL", "RESULTS_CHANNEL", "notify_launch", "notify_results"]


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


def notify_results(run_ids) -> None:
    """Tell open results streams that ``run_ids`` have new results (on PostgreSQL, at the commit
    of the current transaction; on SQLite the commit itself is the signal). Never raises: a lost
    notification only delays the rows to the stream's next look."""
    if connection.vendor != "postgresql" or not run_ids:
        return
    try:
        with connection.cursor() as cursor:
            for run_id in sorted(run_ids):
                cursor.execute("SELECT pg_notify(%s, %s)", [RESULTS_CHANNEL, str(run_id)])
    except Exception as exc:  # the results are stored either way
        log.warning("could not notify the results streams of runs %s (%s)", sorted(run_ids), exc)
