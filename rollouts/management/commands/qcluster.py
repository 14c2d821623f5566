"""``python manage.py qcluster``: django-q2's cluster command, with a stop that cannot hang.

The same command, options and behaviour as django-q2's (``--run-once``, ``--name``); only how the
cluster's main process stops differs. django-q2 stops by setting a multiprocessing ``Event`` that
its sentinel process sleeps on, and ``Event.set`` waits for every sleeper to wake. When SIGTERM
reaches the whole process group (``kill -TERM -PGID``, systemd's default ``KillMode``), the sentinel,
which keeps SIGTERM's default action, dies in its sleep, and the main process then waits in
``Event.set`` for good. Here the event is set from a helper thread and the main process waits for
the sentinel to end either way.

A worker SIGKILLed while it waited for a task dies holding the task queue's lock, and every later
worker then waits on that lock for good, so none reads the sentinel's STOP and django-q2's stop
never ends. Here the sentinel's stop is bounded: workers still alive after a short grace get SIGTERM
(each releases its in-flight rollouts and exits), and whatever is left after the release timeout is
killed.

A worker that dies on its own (SIGKILL, the kernel's out-of-memory killer) may likewise hold that
lock: django-q2 starts a replacement on the same queue, which then waits for good while the pusher
keeps moving tasks from the broker into the queue, where nothing reads them (with the ORM broker
they are re-delivered only after ``retry``, 11 minutes). Here the sentinel then starts the
pipeline again on a new task queue: the pusher and the other workers are stopped (each releases its
in-flight rollouts) and new ones start, so background tasks and the supervisor run again within
seconds.

What the worker processes do on a stop (release their in-flight rollouts at once) is in
``rollouts.workers.process.start_in_worker_process``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

from django import db
from django.conf import settings
from django.utils.translation import gettext as _
from django_q import cluster as q_cluster
from django_q.conf import Conf, logger
from django_q.management.commands.qcluster import Command as QClusterCommand
from django_q.queues import Queue
from django_q.status import Stat

# How long workers get to take their STOP from the task queue before they are signalled directly.
STOP_GRACE_S = 2.0
# Exit codes of a worker that died without running any handler: it may have held a queue's lock.
HARD_DEATHS = frozenset(-sig for sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT))
# How long the pusher and the monitor get to end on their own.
HELPER_STOP_S = 10.0


def _wait_until_dead(processes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))


class Sentinel(q_cluster.Sentinel):
    """django-q2's sentinel whose stop ends in bounded time, also when a worker waits on a lock
    that a killed worker held (bound: ``STOP_GRACE_S`` + ``GYMWEB_RELEASE_TIMEOUT_S`` + about 35 s),
    and which starts its workers and pusher on a new task queue when a worker died on its own."""

    def reincarnate(self, process) -> None:
        """django-q2's, except for a worker killed by a signal it cannot handle (SIGKILL, the
        out-of-memory killer) or crashed, which may have held the task queue's lock: then
        ``renew_task_queue``. A worker that ended on SIGTERM or SIGINT let go of the lock itself."""
        if (
            process in self.pool
            and not process.is_alive()
            and process.exitcode in HARD_DEATHS
            and not self.stop_event.is_set()
        ):
            self.renew_task_queue(process)
            return
        if process in self.pool or process in (self.monitor, self.pusher):
            super().reincarnate(process)

    def renew_task_queue(self, dead) -> None:
        """Stop the pusher and the live workers (SIGTERM: each releases its in-flight rollouts;
        killed after ``GYMWEB_RELEASE_TIMEOUT_S``), then start them again on a new task queue.
        Tasks the pusher had moved into the old queue are re-delivered by the broker (``retry``)."""
        name = q_cluster.current_process().name
        logger.critical(
            _(
                "%(name)s: worker %(pid)s died (exit code %(code)s) and may have held the task queue's "
                "lock; starting the workers and the pusher again on a new queue"
            )
            % {"name": name, "pid": dead.pid, "code": dead.exitcode}
        )
        others = [p for p in self.pool if p is not dead and p.is_alive()]
        pusher = self.pusher  # type: ignore[has-type]
        helpers = [pusher] if pusher is not None and pusher.is_alive() else []
        for p in helpers + others:
            p.terminate()
        _wait_until_dead(helpers + others, settings.GYMWEB_RELEASE_TIMEOUT_S + 10.0)
        for p in helpers + others:
            if p.is_alive():
                p.kill()
                p.join(5.0)
        self.pool.clear()
        self.task_queue = Queue(maxsize=Conf.QUEUE_LIMIT) if Conf.QUEUE_LIMIT else Queue()
        if not Conf.SYNC:
            db.connections.close_all()
        for __ in range(self.pool_size):
            self.spawn_worker()
        self.pusher = self.spawn_pusher()
        self.reincarnations += 1

    def stop(self) -> None:
        name = q_cluster.current_process().name
        Stat(self).save()
        logger.info(_("%(name)s stopping cluster processes") % {"name": name})
        self.event_out.set()
        _wait_until_dead([self.pusher], HELPER_STOP_S)
        if self.pusher.is_alive():
            self.pusher.terminate()
        for __ in range(len(self.pool)):
            self.task_queue.put("STOP")
        self.task_queue.close()
        self.task_queue.join_thread()
        _wait_until_dead(self.pool, STOP_GRACE_S)
        stuck = [p for p in self.pool if p.is_alive()]
        if stuck:
            # SIGTERM runs the worker's own handler (rollouts.workers.process.start_in_worker_process):
            # it releases the in-flight rollouts, then ends the process.
            logger.info(_("%(name)s signalling %(n)d worker(s) directly") % {"name": name, "n": len(stuck)})
            for p in stuck:
                p.terminate()
            _wait_until_dead(stuck, settings.GYMWEB_RELEASE_TIMEOUT_S + 10.0)
            for p in stuck:
                if p.is_alive():
                    logger.warning(
                        _("%(name)s killing worker %(pid)s, which did not end") % {"name": name, "pid": p.pid}
                    )
                    p.kill()
                    p.join(5.0)
        self.pool.clear()
        self.result_queue.put("STOP")
        self.result_queue.close()
        self.result_queue.join_thread()
        logger.info(_("%(name)s waiting for the monitor.") % {"name": name})
        _wait_until_dead([self.monitor], HELPER_STOP_S)
        if self.monitor.is_alive():
            self.monitor.terminate()
            self.monitor.join(5.0)
        count = 0
        while self.status() == Conf.STOPPING and count < (self.timeout or 30) * 10:
            time.sleep(0.1)
            count += 1
        Stat(self).save()


class Cluster(q_cluster.Cluster):
    """django-q2's ``Cluster`` whose ``stop`` returns once the sentinel has ended, also when the
    sentinel was killed while sleeping on the stop event, and whose sentinel stops in bounded time."""

    def start(self) -> int:
        """Start the sentinel (gymweb's ``Sentinel``) and wait until it runs or has ended.
        Raises RuntimeError when the sentinel fails to start."""
        self.stop_event = q_cluster.Event()
        self.start_event = q_cluster.Event()
        self.sentinel = q_cluster.get_mp_context().Process(
            target=Sentinel,
            name=f"Process-{uuid.uuid4().hex}",
            args=(self.stop_event, self.start_event, self.cluster_id, self.broker, self.timeout),
        )
        self.sentinel.start()
        logger.info(_("Q Cluster %(name)s starting.") % {"name": self.name})
        # Polled, not waited on: a signal during wait() would deadlock with the sentinel's set().
        while self.start_event and not self.start_event.is_set():
            if not self.sentinel.is_alive():
                if self.sentinel.exitcode == 0:
                    break
                raise RuntimeError(
                    f"Q Cluster {self.name} failed to start: sentinel exited with code {self.sentinel.exitcode}"
                )
            time.sleep(0.1)
        return self.pid

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
        sentinel.join(STOP_GRACE_S + settings.GYMWEB_RELEASE_TIMEOUT_S + 4 * HELPER_STOP_S + (self.timeout or 30))
        if sentinel.is_alive():
            logger.warning(_("Q Cluster %(name)s: the sentinel did not end; killing it") % {"name": self.name})
            sentinel.kill()
            sentinel.join(5.0)
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
