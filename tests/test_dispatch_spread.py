"""One run served by two dispatchers on one database: each takes a share, the run's concurrency
holds over both, and a dispatcher's leases are renewed even while its event loop is busy (a busy
loop must not let its in-flight rollouts be reaped as a dead worker's)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from gymweb.examples._serve import BackgroundServer
from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout
from rollouts.workers import claims
from rollouts.workers.dispatcher import Dispatcher

from . import agents
from .conftest import wait_for


def _run(tmp_path, n, agent_url, env_url, **options):
    path = agents.counter_tasks(tmp_path / "tasks.jsonl", n)
    with path.open("rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(parsed, name="spread", agent_url=agent_url, env_url=env_url, **options)
    runs.launch(run)
    return run


def _serve(dispatcher: Dispatcher) -> threading.Thread:
    thread = threading.Thread(target=lambda: asyncio.run(dispatcher.run()), daemon=True)
    thread.start()
    return thread


def test_two_dispatchers_share_one_run_and_its_concurrency_holds_over_both(
    transactional_db, tmp_path, counter_env_url, settings
):
    settings.GYMWEB_HEARTBEAT_S = 0.1
    agent = BackgroundServer(agents.make_app(agents.Stats(), latency_s=0.05)).start()
    try:
        run = _run(tmp_path, 60, agent.url, counter_env_url, concurrency=6)
        first, second = (Dispatcher(only={run.pk}, exit_when_idle=True) for _ in range(2))
        threads = [_serve(first), _serve(second)]
        most = 0
        while any(t.is_alive() for t in threads):
            most = max(most, Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).count())
            time.sleep(0.01)
    finally:
        agent.stop()
    rows = Rollout.objects.filter(run=run)
    assert rows.filter(status=Rollout.Status.SUCCEEDED).count() == 60
    assert most <= 6  # the run's concurrency, over both dispatchers
    by_worker = Counter(rows.values_list("worker", flat=True))
    assert set(by_worker) == {first.name, second.name}
    assert min(by_worker.values()) >= 10  # each served a share, not a token few


def test_leases_are_renewed_while_the_event_loop_is_busy(transactional_db, tmp_path, counter_env_url, settings):
    settings.GYMWEB_LEASE_S = 1.0
    settings.GYMWEB_HEARTBEAT_S = 0.2
    gate = agents.Gate()
    agent = BackgroundServer(agents.make_app(agents.Stats(), gate=gate)).start()
    dispatcher = Dispatcher()
    try:
        run = _run(tmp_path, 4, agent.url, counter_env_url, concurrency=4)
        thread = _serve(dispatcher)
        wait_for(lambda: sum(gate.held().values()) == 4, 60, what="4 rollouts in flight at the agent")
        # The loop works through something for three leases without a turn (a wave of replies on
        # a machine short of CPU): its heartbeat must not wait for it.
        dispatcher._loop.call_soon_threadsafe(time.sleep, 3.0)
        time.sleep(3.0)
        # Another worker looking for expired leases now finds none: nothing was reaped.
        assert claims.supervise() == "requeued 0 interrupted rollout(s)"
        gate.open()
        wait_for(
            lambda: Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count() == 4,
            60,
            what="the 4 rollouts to succeed",
        )
    finally:
        gate.open()
        dispatcher.stop()
        agent.stop()
    thread.join(30)
    assert not Rollout.objects.filter(run=run, status=Rollout.Status.INTERRUPTED).exists()


def test_a_dispatcher_at_its_share_reaps_a_dead_workers_expired_leases_at_its_next_poll(
    transactional_db, tmp_path, counter_env_url
):
    from datetime import timedelta

    from django.utils import timezone

    from rollouts.models import Worker

    gate = agents.Gate()
    agent = BackgroundServer(agents.make_app(agents.Stats(), gate=gate)).start()
    dispatcher = Dispatcher()
    try:
        run = _run(tmp_path, 8, agent.url, counter_env_url, concurrency=4)
        # Another machine's worker holds 2 of the run's 4 slots; its heartbeat says it is live, so
        # the share here is ceil(4 / 2) = 2.
        Worker.objects.create(name="dead:1:x", host="dead", pid=1, last_seen=timezone.now() + timedelta(hours=1))
        held = [rid for rid, _, _ in claims.claim(run.pk, "dead:1:x", 2, lease_s=600)]
        thread = _serve(dispatcher)
        wait_for(lambda: sum(gate.held().values()) == 2, 60, what="this dispatcher's share in flight")
        # The other machine dies: its leases run out. Nothing here claims (it is at its share).
        Rollout.objects.filter(pk__in=held).update(lease_until=timezone.now() - timedelta(seconds=1))
        wait_for(
            lambda: Rollout.objects.filter(pk__in=held, status=Rollout.Status.INTERRUPTED).count() == 2,
            30,
            what="the dead worker's rollouts reaped",
        )
        assert Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).count() == 6  # 4 never run + 2 again
    finally:
        gate.open()
        dispatcher.stop()
        agent.stop()
    thread.join(30)


def test_a_heartbeat_renews_only_the_leases_that_end_within_the_given_time(transactional_db, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    run = _run(tmp_path, 4, "http://127.0.0.1:9", "http://127.0.0.1:9")
    ids = [rid for rid, _, _ in claims.claim(run.pk, "me:1:x", 4, lease_s=30)]
    now = timezone.now()
    Rollout.objects.filter(pk__in=ids[:2]).update(lease_until=now + timedelta(seconds=5))  # ending soon
    Rollout.objects.filter(pk__in=ids[2:]).update(lease_until=now + timedelta(seconds=25))  # renewed lately
    claims.heartbeat("me:1:x", frozenset({run.pk}), 4, 10, 30.0, 20.0)
    leases = dict(Rollout.objects.filter(pk__in=ids).values_list("id", "lease_until"))
    assert all(leases[i] > now + timedelta(seconds=29) for i in ids[:2])
    assert all(leases[i] < now + timedelta(seconds=26) for i in ids[2:])
    claims.heartbeat("me:1:x", frozenset({run.pk}), 4, 10, 30.0)  # None: every lease
    assert all(
        lease > now + timedelta(seconds=29)
        for lease in Rollout.objects.filter(pk__in=ids).values_list("lease_until", flat=True)
    )
