"""``manage.py collect`` while ``qcluster`` workers share its database.

Workers claim part of the command's run. The command must not stop when nothing is pending in its
own process: it exits only once every attempt of its run has ended, wherever it ran, and writes its
files after that, whole. Runs on SQLite (a file shared with the worker) and on PostgreSQL (the
suite's second pass). The agent is a real HTTP server on 127.0.0.1 that holds each task's replies
until the test lets that task through, so the test decides which worker finishes last.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading

from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from gymweb.examples._serve import BackgroundServer
from rollouts.models import Rollout, Run, Worker

from . import agents
from .conftest import wait_for


class _Collect:
    """``manage.py collect`` in a thread of this process (its own dispatcher, pid = this pid)."""

    def __init__(self, *args: str):
        self.out = io.StringIO()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=args, name="collect", daemon=True)
        self.thread.start()

    def _main(self, *args: str) -> None:
        try:
            call_command("collect", *args, "--no-progress", "--no-health-check", stdout=self.out, stderr=io.StringIO())
        except BaseException as exc:  # re-raised by the test
            self.error = exc
        finally:
            connections.close_all()

    def join(self, timeout: float) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "collect did not finish"
        if self.error is not None:
            raise self.error
        return self.out.getvalue()


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ours(name: str) -> bool:
    return name.split(":")[1] == str(os.getpid())


def test_collect_waits_for_the_rollouts_a_worker_runs_and_writes_the_whole_run(
    tmp_path, workers, counter_env_url, settings
):
    # Leases long enough that a slow heartbeat on a busy machine never makes the worker look gone
    # (the command would then take the whole run: fair shares count live workers).
    settings.GYMWEB_LEASE_S = 30.0
    gate = agents.Gate()
    agent = BackgroundServer(agents.make_app(agents.Stats(), gate=gate)).start()
    out = tmp_path / "results" / "rollouts.jsonl"
    tasks = agents.counter_tasks(tmp_path / "tasks.jsonl", 6)
    try:
        workers.start(workers=1, GYMWEB_LEASE_S=30)
        wait_for(lambda: Worker.objects.exists(), 60, what="the worker's heartbeat")
        collect = _Collect(
            "--agent-url",
            agent.url,
            "--env-url",
            counter_env_url,
            "--input",
            str(tasks),
            "--output",
            str(out),
            "--concurrency",
            "6",
        )
        # Every rollout is claimed, by this command or by the worker, and waits on the agent.
        wait_for(lambda: sum(gate.held().values()) == 6, 60, what="6 rollouts in flight at the agent")
        run = Run.objects.get(source_file=str(out))
        running = list(Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).select_related("task"))
        assert len(running) == 6 and not Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).exists()
        ours = [r for r in running if _ours(r.worker)]
        theirs = [r for r in running if not _ours(r.worker)]
        assert theirs, "the worker claimed part of the run"

        # This command's own rollouts end; the worker's are still in flight.
        gate.let_through(agents.task_text(json.loads(r.task.row_json)) for r in ours)
        wait_for(
            lambda: (
                Rollout.objects.filter(pk__in=[r.pk for r in ours], status=Rollout.Status.SUCCEEDED).count()
                == len(ours)
            ),
            60,
            what="the command's own rollouts to succeed",
        )
        since = timezone.now()
        # The command's dispatcher has beaten since, holding nothing: it has looked at the run with
        # nothing pending and nothing of its own in flight (where it must not stop and write yet).
        wait_for(
            lambda: (
                not collect.thread.is_alive()
                or any(_ours(w.name) and w.inflight == 0 and w.last_seen > since for w in Worker.objects.all())
            ),
            60,
            what="the command to be idle",
        )
        assert collect.thread.is_alive(), "collect ended while a worker still ran rollouts of its run"
        assert Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).count() == len(theirs)
        assert not out.exists()

        gate.open()
        summary = collect.join(120)
    finally:
        gate.open()
        agent.stop()
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert not Rollout.objects.filter(run=run, status__in=Rollout.ACTIVE).exists()
    rows = _read(out)
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(6))
    assert all(r["reward"] == 1.0 for r in rows)
    assert _read(out.parent / "rollouts_failures.jsonl") == []
    assert len(_read(out.parent / "rollouts_materialized_inputs.jsonl")) == 6
    assert "6 succeeded" in summary and "every rollout succeeded" in summary
    # The worker's successes are in the file: it ran part of the run.
    workers_of_successes = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).values_list(
        "worker", flat=True
    )
    assert any(not _ours(w) for w in workers_of_successes)


def test_collect_runs_again_what_a_killed_worker_held_and_writes_the_whole_run(
    tmp_path, workers, counter_env_url, settings
):
    settings.GYMWEB_LEASE_S = 8.0  # the command waits this long for the killed worker's lease
    gate = agents.Gate()
    agent = BackgroundServer(agents.make_app(agents.Stats(), gate=gate)).start()
    out = tmp_path / "rollouts.jsonl"
    tasks = agents.counter_tasks(tmp_path / "tasks.jsonl", 6)
    try:
        worker = workers.start(workers=1, GYMWEB_LEASE_S=8)
        wait_for(lambda: Worker.objects.exists(), 60, what="the worker's heartbeat")
        collect = _Collect(
            "--agent-url",
            agent.url,
            "--env-url",
            counter_env_url,
            "--input",
            str(tasks),
            "--output",
            str(out),
            "--concurrency",
            "6",
        )
        wait_for(lambda: sum(gate.held().values()) == 6, 60, what="6 rollouts in flight at the agent")
        run = Run.objects.get(source_file=str(out))
        theirs = [r for r in Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING) if not _ours(r.worker)]
        assert theirs, "the worker claimed part of the run"
        workers.kill(worker, signal.SIGKILL)  # its rollouts stay `running` until their lease expires
        gate.open()
        summary = collect.join(120)
    finally:
        gate.open()
        agent.stop()
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    # The killed worker's attempts are interrupted (not attempts) and ran again in the command.
    interrupted = Rollout.objects.filter(run=run, status=Rollout.Status.INTERRUPTED)
    assert set(interrupted.values_list("id", flat=True)) == {r.pk for r in theirs}
    assert set(Rollout.objects.filter(run=run).values_list("attempt", flat=True)) == {1}
    rows = _read(out)
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(6))
    assert "6 succeeded" in summary
