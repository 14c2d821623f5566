"""Durable, scalable collection: several qcluster workers, SIGKILL, SIGTERM, faults, cancel.

Workers are real ``manage.py qcluster`` processes on this test's file-backed database; agent and env
are real HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import signal
from collections import Counter

from django.db.models import Count

from gymweb.examples._serve import BackgroundServer
from rollouts.apps import _ensure_supervisor
from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout, Run

from . import agents
from .conftest import wait_for


def _agent(stats, **kwargs):
    server = BackgroundServer(agents.make_app(stats, **kwargs)).start()
    return server


def _run(tmp_path, n, agent_url, env_url, **options):
    path = agents.counter_tasks(tmp_path / "tasks.jsonl", n)
    with path.open("rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(parsed, name="durability", agent_url=agent_url, env_url=env_url, **options)
    runs.launch(run)
    return run


def _status(run):
    return Run.objects.get(pk=run.pk).status


def _assert_each_key_settled_once(run):
    """Every key has exactly one success, or only failures; no attempt number is used twice."""
    per_attempt = (
        Rollout.objects.filter(run=run, status__in=[Rollout.Status.SUCCEEDED, Rollout.Status.FAILED])
        .values("task_index", "rollout_index", "attempt")
        .annotate(n=Count("id"))
    )
    assert all(row["n"] == 1 for row in per_attempt)
    successes = Counter(
        Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).values_list("task_index", "rollout_index")
    )
    assert all(n == 1 for n in successes.values())
    assert not Rollout.objects.filter(run=run, status__in=Rollout.ACTIVE).exists()


def test_in_flight_rollouts_never_exceed_the_runs_concurrency_over_two_workers(tmp_path, workers, counter_env_url):
    stats = agents.Stats()
    agent = _agent(stats, latency_s=0.15)
    try:
        run = _run(tmp_path, 40, agent.url, counter_env_url, concurrency=5)
        workers.start(workers=1)
        workers.start(workers=1)
        wait_for(lambda: _status(run) == Run.Status.COMPLETED, 120, what="the run to complete")
    finally:
        agent.stop()
    assert Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() == 40
    assert stats.max_inflight == 5
    # Both workers took part (each dispatcher names its host:pid in `worker`).
    pids = {w.split(":")[1] for w in Rollout.objects.filter(run=run).values_list("worker", flat=True)}
    assert len(pids) == 2
    _assert_each_key_settled_once(run)


def test_a_sigkilled_worker_loses_nothing_and_the_run_completes_on_restart(tmp_path, workers, counter_env_url):
    _ensure_supervisor(None)  # the schedule a migrate installs (flushed between transactional tests)
    stats = agents.Stats()
    agent = _agent(stats, latency_s=0.1)
    try:
        run = _run(tmp_path, 60, agent.url, counter_env_url, concurrency=8)
        first = workers.start(workers=1)
        wait_for(
            lambda: (
                Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() >= 10
                and Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).exists()
            ),
            60,
            what="the run to be under way",
        )
        workers.kill(first, signal.SIGKILL)
        in_flight_at_kill = Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).count()
        assert in_flight_at_kill > 0
        workers.start(workers=1)
        wait_for(lambda: _status(run) == Run.Status.COMPLETED, 120, what="the run to complete after the restart")
    finally:
        agent.stop()
    assert Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() == 60
    interrupted = Rollout.objects.filter(run=run, status=Rollout.Status.INTERRUPTED)
    assert interrupted.count() == in_flight_at_kill
    # Kill-shaped rows are not attempts: the re-run of a key keeps the same attempt number.
    assert set(Rollout.objects.filter(run=run).values_list("attempt", flat=True)) == {1}
    assert not Rollout.objects.filter(run=run, status=Rollout.Status.FAILED).exists()
    _assert_each_key_settled_once(run)


def test_sigterm_releases_in_flight_rollouts_without_spending_attempts(tmp_path, workers, counter_env_url):
    stats = agents.Stats()
    agent = _agent(stats, latency_s=0.3)
    try:
        run = _run(tmp_path, 20, agent.url, counter_env_url, concurrency=6)
        first = workers.start(workers=1)
        wait_for(
            lambda: Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).count() == 6, 60, what="6 in flight"
        )
        workers.kill(first, signal.SIGTERM)
        # Released at once (not left to a lease expiry): interrupted rows and fresh pending attempts.
        wait_for(
            lambda: not Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).exists(), 15, what="release"
        )
        assert Rollout.objects.filter(run=run, status=Rollout.Status.INTERRUPTED).count() >= 1
        workers.start(workers=1)
        wait_for(lambda: _status(run) == Run.Status.COMPLETED, 120, what="the run to complete")
    finally:
        agent.stop()
    assert Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() == 20
    assert set(Rollout.objects.filter(run=run).values_list("attempt", flat=True)) == {1}
    _assert_each_key_settled_once(run)


def test_cancel_ends_in_flight_rollouts_as_cancelled_and_the_run_can_be_resumed(tmp_path, workers, counter_env_url):
    stats = agents.Stats()
    agent = _agent(stats, latency_s=0.3)
    try:
        run = _run(tmp_path, 30, agent.url, counter_env_url, concurrency=5)
        workers.start(workers=1)
        wait_for(
            lambda: Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).count() == 5, 60, what="5 in flight"
        )
        assert runs.cancel(run)
        wait_for(lambda: not Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).exists(), 10, what="cancel")
        assert _status(run) == Run.Status.CANCELLED
        assert Rollout.objects.filter(run=run, status=Rollout.Status.CANCELLED).count() >= 25
        assert not Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).exists()
        added = runs.resume(Run.objects.get(pk=run.pk))
        assert added == 30 - Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count()
        wait_for(lambda: _status(run) == Run.Status.COMPLETED, 120, what="the resumed run to complete")
    finally:
        agent.stop()
    assert Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() == 30
    _assert_each_key_settled_once(run)


def test_faults_are_accounted_once_per_attempt_and_a_retry_raises_successes(tmp_path, workers, counter_env_url):
    stats = agents.Stats()
    # A wide gap between the injected slowness and the timeout: on a loaded machine an ordinary
    # call must never pass the timeout and count as a fault that was not injected.
    agent = _agent(stats, faulty=True, slow_s=8.0)
    try:
        run = _run(tmp_path, 500, agent.url, counter_env_url, concurrency=32, remote_responses_timeout_s=3.0)
        workers.start(workers=1)
        workers.start(workers=1)
        wait_for(lambda: _status(run) == Run.Status.COMPLETED, 240, what="the faulty run to complete")
        first = dict(Rollout.objects.filter(run=run).values_list("task__row_json", "failure_kind"))
        kinds = Counter(k for k in first.values())
        expected = {name: len(set(texts)) for name, texts in stats.faults.items()}  # a dropped call is tried 3 times
        assert kinds[""] == 500 - sum(expected.values())
        assert kinds["agent_http_error"] == expected["http_500"]
        assert kinds["agent_timeout"] == expected["slow"]
        assert kinds["agent_invalid_response"] == expected["invalid"]
        assert kinds["agent_unreachable"] == expected["drop"]
        assert Rollout.objects.filter(run=run, terminal=True).count() == expected["invalid"]
        assert Rollout.objects.filter(run=run).count() == 500
        _assert_each_key_settled_once(run)
        successes_before = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count()

        stats.round = 2  # the agent behaves from now on
        added = runs.resume(Run.objects.get(pk=run.pk))
        assert added == 500 - successes_before - expected["invalid"]  # terminal failures are never retried
        wait_for(lambda: _status(run) == Run.Status.COMPLETED, 240, what="the retry to complete")
    finally:
        agent.stop()
    successes_after = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count()
    assert successes_after == 500 - expected["invalid"] > successes_before
    assert not Rollout.objects.filter(run=run, terminal=True, attempt__gt=1).exists()
    assert Rollout.objects.filter(run=run).count() == 500 + added
    _assert_each_key_settled_once(run)
