"""The worker's bound on calls in flight to one env (``GYMWEB_ENV_MAX_IN_FLIGHT``, or a run's own
``env_max_in_flight``): never more than the bound out at once, the oldest rollout's call first, and
a place never lost to a cancelled call; over real HTTP, rollouts that share an env end in the order
they started."""

from __future__ import annotations

import asyncio

from rollouts.engine.env_gate import EnvGate
from rollouts.engine.http import make_client
from rollouts.engine.loop import run_rollout
from tests.servers import LOCAL, AgentService, EnvService, async_test, call, message, reply, settings, task_row


async def _hold(gate: EnvGate, url: str, priority: float, log: list, release: asyncio.Event, limit: int = 0) -> None:
    async with gate.turn(url, priority, limit):
        log.append(priority)
        await release.wait()


@async_test
async def test_calls_past_the_bound_wait_and_go_out_oldest_rollout_first():
    gate = EnvGate(2)
    log: list[float] = []
    release = asyncio.Event()
    holders = [asyncio.create_task(_hold(gate, "http://env", p, log, release)) for p in (10.0, 11.0)]
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(_hold(gate, "http://env", p, log, asyncio.Event())) for p in (5.0, 3.0, 4.0)]
    await asyncio.sleep(0.01)
    assert log == [10.0, 11.0], "the first two took the two places; the rest wait"
    assert gate.in_flight("http://env") == 2 and gate.waiting("http://env") == 3
    release.set()
    await asyncio.gather(*holders)
    await asyncio.sleep(0.01)
    assert log == [10.0, 11.0, 3.0, 4.0], "the two freed places went to the two oldest waiting"
    assert gate.in_flight("http://env") == 2
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert gate.in_flight("http://env") == 0 and gate.waiting("http://env") == 0


@async_test
async def test_each_env_has_its_own_places():
    gate = EnvGate(1)
    log: list[float] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(_hold(gate, url, 1.0, log, release)) for url in ("http://a", "http://b")]
    await asyncio.sleep(0.01)
    assert log == [1.0, 1.0] and gate.in_flight("http://a") == gate.in_flight("http://b") == 1
    release.set()
    await asyncio.gather(*tasks)


@async_test
async def test_a_call_cancelled_while_waiting_takes_no_place():
    gate = EnvGate(1)
    log: list[float] = []
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(gate, "http://env", 1.0, log, release))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(_hold(gate, "http://env", 2.0, log, asyncio.Event()))
    later = asyncio.create_task(_hold(gate, "http://env", 3.0, log, release))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    release.set()
    await asyncio.gather(holder, later)
    assert log == [1.0, 3.0]
    assert gate.in_flight("http://env") == 0


@async_test
async def test_a_place_handed_to_a_call_cancelled_before_it_ran_goes_on_to_the_next():
    gate = EnvGate(1)
    log: list[float] = []
    release = asyncio.Event()
    async with gate.turn("http://env", 1.0):
        first = asyncio.create_task(_hold(gate, "http://env", 2.0, log, asyncio.Event()))
        second = asyncio.create_task(_hold(gate, "http://env", 3.0, log, release))
        await asyncio.sleep(0.01)
        assert gate.waiting("http://env") == 2
    # Leaving the block handed the place to ``first``, which has not run since: cancelled now,
    # before it takes the place up, it must pass the place on.
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    release.set()
    await asyncio.wait_for(second, 5)
    assert log == [3.0]
    assert gate.in_flight("http://env") == 0


@async_test
async def test_no_bound_lets_every_call_out_at_once():
    gate = EnvGate(0)
    log: list[float] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(_hold(gate, "http://env", float(p), log, release)) for p in range(50)]
    await asyncio.sleep(0.01)
    assert len(log) == 50
    release.set()
    await asyncio.gather(*tasks)


# -- over real HTTP --------------------------------------------------------------------------------
def _agent_turn(rec, n):
    """Ask the tool three times, then answer: each rollout makes 1 seed, 3 tool calls, 1 verify."""
    outputs = sum(1 for i in rec.json["input"] if i.get("type") == "function_call_output")
    return reply(message()) if outputs >= 3 else reply(call("slow_tool", {}, call_id=f"c{n}"))


def _slow_env_call(state: dict, seconds: float):
    """An env handler that takes ``seconds`` and counts the calls it holds at once in ``state``."""

    async def slow(_rec):
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(seconds)
        state["now"] -= 1
        return {"ok": True}

    return slow


@async_test
async def test_rollouts_sharing_a_bounded_env_keep_within_the_bound_and_end_in_start_order():
    state = {"now": 0, "peak": 0}
    slow = _slow_env_call(state, 0.02)

    ended: list[int] = []
    async with EnvService({"slow_tool": slow}, seed=slow) as env, AgentService(_agent_turn) as agent:
        client = make_client(64, policy=LOCAL)
        gate = EnvGate(2)

        async def one(i: int):
            outcome = await run_rollout(client, task_row(), settings(agent.url, env.url), None, gate)
            ended.append(i)
            return outcome

        try:
            tasks = []
            for i in range(12):
                tasks.append(asyncio.create_task(one(i)))
                await asyncio.sleep(0.002)  # distinct start times: the gate's priority
            outcomes = await asyncio.gather(*tasks)
        finally:
            await client.aclose()
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert state["peak"] <= 2, f"the env held {state['peak']} calls at once with a bound of 2"
    assert len(env.at("/seed_session")) == 12 and len(env.tool_requests) == 36
    # Every rollout started before the env could answer them all; with the oldest first, the
    # first ones to start end first.
    assert set(ended[:4]) <= set(range(6)) and set(ended[-4:]) <= set(range(6, 12)), ended


async def _twelve_rollouts(seconds: float, gate: EnvGate | None = None, **loop_settings) -> tuple[list, int]:
    """12 rollouts at once against an env whose calls take ``seconds``: their outcomes, and the
    most calls the env held at once."""
    state = {"now": 0, "peak": 0}
    slow = _slow_env_call(state, seconds)
    async with EnvService({"slow_tool": slow}, seed=slow) as env, AgentService(_agent_turn) as agent:
        client = make_client(64, policy=LOCAL)
        run_settings = settings(agent.url, env.url, **loop_settings)
        try:
            outcomes = await asyncio.gather(
                *(run_rollout(client, task_row(), run_settings, None, gate) for _ in range(12))
            )
        finally:
            await client.aclose()
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    return outcomes, state["peak"]


@async_test
async def test_without_a_bound_the_env_gets_every_rollouts_call_at_once():
    _, peak = await _twelve_rollouts(0.05)
    assert peak > 2, "NeMo Gym's behaviour: no bound unless one is set"


# -- a run's own bound (the run setting env_max_in_flight) ------------------------------------------
@async_test
async def test_a_calls_own_bound_replaces_the_gates_default():
    gate = EnvGate(0)  # the server sets no bound; the run asks for 2
    log: list[float] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(_hold(gate, "http://env", float(p), log, release, limit=2)) for p in range(5)]
    unbounded = asyncio.create_task(_hold(gate, "http://env", 9.0, log, release))
    await asyncio.sleep(0.01)
    assert sorted(log) == [0.0, 1.0, 9.0], "two of the bounded run's calls out, the unbounded call not held back"
    assert gate.waiting("http://env") == 3
    release.set()
    await asyncio.gather(*tasks, unbounded)
    assert len(log) == 6 and gate.in_flight("http://env") == 0


@async_test
async def test_calls_with_different_bounds_to_one_env_do_not_share_places():
    gate = EnvGate(1)
    log: list[float] = []
    release = asyncio.Event()
    server_bound = [asyncio.create_task(_hold(gate, "http://env", 1.0, log, release)) for _ in range(2)]
    run_bound = [asyncio.create_task(_hold(gate, "http://env", 2.0, log, release, limit=3)) for _ in range(4)]
    await asyncio.sleep(0.01)
    assert sorted(log) == [1.0, 2.0, 2.0, 2.0], "1 place for the server's bound, 3 for the run's"
    assert gate.in_flight("http://env") == 4 and gate.waiting("http://env") == 2
    release.set()
    await asyncio.gather(*server_bound, *run_bound)
    assert gate.in_flight("http://env") == 0


@async_test
async def test_a_rollout_keeps_its_runs_bound_over_real_http():
    # No server bound (EnvGate(0)): the run's own is the only one.
    _, peak = await _twelve_rollouts(0.02, EnvGate(0), env_max_in_flight=3)
    assert peak == 3, f"the env held {peak} calls at once with the run's bound of 3"
