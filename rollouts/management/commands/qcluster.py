"""``python manage.py qcluster``: django-q2's cluster command, with a stop that cannot hang.

The same command, options and behaviour as django-q2's (``--run-once``, ``--name``); only how the
cluster's main process stops differs. django-q2 stops by setting a multiprocessing ``Event`` that
its sentinel process sleeps on, and ``Event.set`` waits for every sleeper to wake. When SIGTERM
reaches the whole process group (``kill -TERM -PGID``, systemd's default ``KillMode``), the sentinel,
which keeps SIGTERM's default action, dies in its sleep, and the main process then waits in
``Event.set`` for good. Here the event is set from a helper thread and the main process waits for
the sentinel to end either way.

What the worker processes do on a stop (release their in-flight rollouts at once) is in
``rollouts.collection.dispatch.start_in_worker_process``.
"""
from __future__ import annotations

import os
import threading

from django.conf import settings
from django.utils.translation import gettext as _
from django_q import cluster as q_cluster
from django_q.conf import logger
from django_q.management.commands.qcluster import Command as QClusterCommand


class Cluster(q_cluster.Cluster):
    """django-q2's ``Cluster`` whose ``stop`` returns once the sentinel has ended, also when the
    sentinel was killed while sleeping on the stop event."""

    def stop(self) -> bool:
        """Ask the sentinel to stop its processes in order and wait until it has ended. Returns
        False when it had ended already."""
        sentinel, stop_event = self.sentinel, self.stop_event  # type: ignore[has-type]
        if sentinel is None or stop_event is None or not sentinel.is_alive():
            return False
        logger.info(_("Q Cluster %(name)s stopping.") % {"name": self.name})
        # Event.set blocks until each process sleeping on the event has woken; a dead sentinel
        # never wakes, so a daemon thread does it and the main process only waits for the sentinel.
        threading.Thread(target=stop_event.set, name="qcluster-stop", daemon=True).start()
        sentinel.join()
        logger.info(_("Q Cluster %(name)s has stopped.") % {"name": self.name})
        self.start_event = None
        self.stop_event = None
        return True


class Command(QClusterCommand):
    help = QClusterCommand.help

    def handle(self, *args, **options):
        # As django-q2's command does: the cluster signs its tasks with SECRET_KEY.
        settings.SECRET_KEY
        cluster_name = options.get("cluster_name")
        if cluster_name:
            os.environ["Q_CLUSTER_NAME"] = cluster_name
        q = Cluster()
        q.start()
        if options.get("run_once", False):
            q.stop()
