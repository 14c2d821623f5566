"""Stopping ``qcluster``: SIGTERM or Ctrl-C releases in-flight rollouts at
once (interrupted, keys queued again with the same attempt number), logs no traceback, and a new worker
finishes the run.

Workers are real ``manage.py qcluster`` processes on this test's database. Their lease is 600 s here, so a
rollout found released after the stop was released by the stopping worker, never by a lease expiring.
The agent is a real HTTP server on 127.0.0.1 that holds its replies until the test opens its gate, so
the rollouts are in flight (waiting on the agent) when the signal arrives.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections import Counter

import pytest
from django.db import OperationalError

from gymweb.examples._serve import BackgroundServer
from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout, Run, Worker
from rollouts.workers import dispatcher as dispatcher_module

from . import agents
from .conftest import wait_for

LONG_LEASE = {"GYMWEB_LEASE_S": 600}


def _run(tmp_path, n, agent_url, env_url, **options):
    path = agents.counter_tasks(tmp_path / "tasks.jsonl", n)
    with path.open("rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(parsed, name="stop", agent_url=agent_url, env_url=env_url, **options)
    runs.launch(run)
    return run


def _stop(workers, proc, how: str) -> None:
    """Stop a cluster as an operator would and wait for its main process to end."""
    if how == "SIGTERM to the main process":  # kill PID, docker stop
        os.kill(proc.pid, signal.SIGTERM)
    elif how == "SIGTERM to the process group":  # kill -TERM -PGID, systemd's default
        os.killpg(proc.pid, signal.SIGTERM)
    elif how == "Ctrl-C":  # the terminal sends SIGINT to the whole group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        raise AssertionError(how)
    proc.wait(timeout=120)


def _assert_clean(log: str) -> None:
    assert "Traceback" not in log, log[-3000:]
    assert "could not write" not in log and "cannot schedule new futures" not in log, log[-3000:]


HOW = ["SIGTERM to the main process", "SIGTERM to the process group", "Ctrl-C"]


@pytest.mark.parametrize("how", HOW)
def test_stopping_an_idle_cluster_logs_no_traceback_and_retires_its_workers(workers, how):
    proc = workers.start(workers=2)
    wait_for(lambda: Worker.objects.count() == 2, 60, what="both dispatchers' heartbeats")
    _stop(workers, proc, how)
    # Each dispatcher removes its Worker row as the last step of its release.
    wait_for(lambda: not Worker.objects.exists(), 60, what="the dispatchers to retire")
    _assert_clean(workers.logs())


@pytest.mark.parametrize("how", HOW)
def test_stopping_a_cluster_releases_its_in_flight_rollouts_at_once_and_a_new_worker_finishes_them(
    tmp_path, workers, counter_env_url, how
):
    gate = agents.Gate()
    agent = BackgroundServer(agents.make_app(agents.Stats(), gate=gate)).start()
    try:
        run = _run(tmp_path, 6, agent.url, counter_env_url, concurrency=6)
        proc = workers.start(workers=1, **LONG_LEASE)
        # Every rollout is claimed and its first agent call is waiting on the agent.
        wait_for(lambda: sum(gate.held().values()) == 6, 60, what="6 rollouts in flight at the agent")
        claimed = set(Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).values_list("id", flat=True))
        assert len(claimed) == 6
        keys = set(Rollout.objects.filter(id__in=claimed).values_list("task_index", "rollout_index"))

        _stop(workers, proc, how)
        # Released by the stopping worker (the lease is 600 s): no attempt is left running, each
        # in-flight attempt is `interrupted` with what it had done, and its key has a new pending
        # attempt with the same number (a killed rollout is not an attempt).
        wait_for(
            lambda: (
                not Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).exists()
                and Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).count() == 6
            ),
            60,
            what="the stopping worker to release its rollouts",
        )
        interrupted = Rollout.objects.filter(run=run, status=Rollout.Status.INTERRUPTED)
        assert set(interrupted.values_list("id", flat=True)) == claimed
        for row in interrupted:
            assert row.error == "its worker stopped; the key runs again"
            assert row.lease_until is None and row.finished is not None
            assert row.agent_calls.count() == 0  # the agent had not answered yet: nothing invented
        pending = Rollout.objects.filter(run=run, status=Rollout.Status.PENDING)
        assert set(pending.values_list("task_index", "rollout_index")) == keys
        assert set(pending.values_list("attempt", flat=True)) == {1}
        assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
        assert not Worker.objects.exists()
        _assert_clean(workers.logs())

        gate.open()
        workers.start(workers=1)
        wait_for(
            lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED,
            120,
            what="a new worker to finish the run",
        )
    finally:
        gate.open()
        agent.stop()
    rows = Rollout.objects.filter(run=run)
    assert rows.filter(status=Rollout.Status.SUCCEEDED).count() == 6
    assert rows.count() == 12  # 6 interrupted + 6 succeeded: nothing else
    assert Counter(rows.values_list("status", flat=True)) == {"succeeded": 6, "interrupted": 6}
    assert set(rows.values_list("attempt", flat=True)) == {1}
    successes = rows.filter(status=Rollout.Status.SUCCEEDED)
    assert all(r.reward == 1.0 for r in successes)


def test_a_release_the_database_refuses_is_logged_in_plain_lines_and_bounded(transactional_db, monkeypatch, caplog):
    def refuse(*args):
        raise OperationalError("the database went away")

    monkeypatch.setattr(dispatcher_module, "_release_held", refuse)
    dispatcher = dispatcher_module.Dispatcher()
    dispatcher.release_timeout_s = 2.5
    beat = threading.Event()
    real_heartbeat = dispatcher_module.heartbeat

    def heartbeat(*args):
        beat.set()
        return real_heartbeat(*args)

    monkeypatch.setattr(dispatcher_module, "heartbeat", heartbeat)
    thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()))
    with caplog.at_level(logging.INFO, logger="gymweb.dispatch"):
        thread.start()
        assert beat.wait(30)
        dispatcher.stop()
        thread.join(60)
    assert not thread.is_alive()
    records = [r for r in caplog.records if r.name == "gymweb.dispatch"]
    assert any(
        "the database refused the release (OperationalError: the database went away)" in r.getMessage() for r in records
    )
    assert any("could not release" in r.getMessage() and "GYMWEB_RELEASE_TIMEOUT_S" in r.getMessage() for r in records)
    assert not any(r.exc_info for r in records)


def test_sigterm_to_the_main_process_after_a_worker_was_killed_exits_and_releases_in_flight_rollouts(
    tmp_path, workers, counter_env_url
):
    # A worker SIGKILLed while it waited for a task dies holding django-q2's task-queue lock, so its
    # replacement waits on that lock for good and never reads the sentinel's STOP. The stop must
    # still end: the sentinel signals its workers directly (each releases its rollouts), then kills.
    gate = agents.Gate()
    agent = BackgroundServer(agents.make_app(agents.Stats(), gate=gate)).start()
    try:
        proc = workers.start(workers=1, GYMWEB_RELEASE_TIMEOUT_S=5, **LONG_LEASE)
        first = wait_for(lambda: Worker.objects.first(), 60, what="the first worker's heartbeat")
        os.kill(first.pid, signal.SIGKILL)
        # The sentinel starts a new worker in its place.
        replacement = wait_for(
            lambda: Worker.objects.exclude(pid=first.pid).first(), 60, what="the replacement worker's heartbeat"
        )
        # The killed worker's heartbeat row stays until it goes stale, so the replacement's fair share
        # is half the run's concurrency: 6 lets it take all 3 rollouts.
        run = _run(tmp_path, 3, agent.url, counter_env_url, concurrency=6)
        wait_for(lambda: sum(gate.held().values()) == 3, 60, what="3 rollouts in flight at the agent")
        claimed = set(
            Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING, worker=replacement.name).values_list(
                "id", flat=True
            )
        )
        assert len(claimed) == 3

        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=45)  # the release timeout (5 s) and the stop's grace, with room for a loaded machine
        interrupted = Rollout.objects.filter(run=run, status=Rollout.Status.INTERRUPTED)
        assert set(interrupted.values_list("id", flat=True)) == claimed
        assert Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).count() == 3
        assert not Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).exists()
    finally:
        gate.open()
        agent.stop()


def test_after_its_workers_were_killed_a_cluster_runs_queued_tasks_again_within_seconds(workers):
    # A worker killed while it waited for a task dies holding django-q2's task-queue lock: without a
    # new queue its replacements wait on that lock for good and queued tasks wait for the broker's
    # retry (11 minutes). Both workers are killed, so the lock's holder is surely among them.
    from django_q.tasks import async_task, result

    workers.start(workers=2, **LONG_LEASE)
    killed = wait_for(
        lambda: (pids := list(Worker.objects.values_list("pid", flat=True))) and len(pids) == 2 and pids,
        90,
        what="two workers' heartbeats",
    )
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: Worker.objects.exclude(pid__in=killed).count() == 2, 90, what="two new workers' heartbeats")
    task_id = async_task("math.floor", 2.5)
    assert wait_for(lambda: result(task_id) == 2, 90, what="the task queued after the kill ran")
    assert "starting the workers and the pusher again on a new queue" in workers.logs()
