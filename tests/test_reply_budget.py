"""The bytes of replies being read at once in a worker are bounded (``GYMWEB_REPLY_BUDGET_BYTES``):
a reply that would pass the budget fails its rollout as ``reply_over_budget`` (not terminal: it can run
again once others are read), the budget is given back whatever happens, and after a large spike the
freed memory is handed back to the system."""

from __future__ import annotations

from rollouts.engine import budget as budget_module
from rollouts.engine.budget import ReplyBudget
from rollouts.engine.failures import FailureKind
from rollouts.engine.http import make_client
from rollouts.engine.loop import run_rollout
from tests.servers import LOCAL, EnvService, async_test, drive, settings, task_row
from tests.test_reply_cap import ENDLESS, Streamer

BUDGET = 96 * 1024


@async_test
async def test_an_agent_reply_past_the_budget_fails_as_reply_over_budget_and_can_run_again():
    async with EnvService() as env, Streamer("/v1/responses") as agent:
        outcome = await drive(agent.url, env, reply_budget_bytes=BUDGET)
    assert outcome.failure_kind == FailureKind.REPLY_OVER_BUDGET, (outcome.failure_kind, outcome.error)
    assert "GYMWEB_REPLY_BUDGET_BYTES" in outcome.error and f"{BUDGET:,} bytes" in outcome.error
    assert not outcome.terminal
    assert agent.written < ENDLESS // 4  # reading stopped at the budget


@async_test
async def test_the_budget_is_given_back_after_a_refused_reply():
    async with EnvService() as env, Streamer("/v1/responses") as agent:
        client = make_client(4, policy=LOCAL, reply_budget_bytes=BUDGET)
        try:
            await run_rollout(client, task_row(), settings(agent.url, env.url))
            assert client.budget.used == 0 and client.budget.limit == BUDGET
        finally:
            await client.aclose()


def test_take_refuses_past_the_limit_and_give_returns_bytes():
    b = ReplyBudget(100)
    assert b.take(60) and not b.take(41) and b.used == 60
    assert b.take(40) and b.used == 100
    b.give(100)
    assert b.used == 0
    assert ReplyBudget(None).take(10**12)


def test_memory_is_handed_back_once_idle_after_a_large_spike(monkeypatch):
    trims = []
    monkeypatch.setattr(budget_module, "_malloc_trim", lambda: trims.append(1))
    b = ReplyBudget(None)
    b.take(budget_module.TRIM_AFTER_BYTES)
    b.take(10)
    b.give(10)
    assert trims == []  # still reading the large reply
    b.give(budget_module.TRIM_AFTER_BYTES)
    assert trims == [1]
    b.take(10)
    b.give(10)
    assert trims == [1]  # a small reply afterwards does not trim again


@async_test
async def test_a_refused_reply_held_by_its_failure_keeps_none_of_its_bytes():
    """A refusal lives on (its traceback, the failure wrapping it) until its rollout's row is
    written; the bytes read before the cap must not live on with it, or the budget would count them
    given back while they are still held."""
    import tracemalloc

    from rollouts.engine.targets import ReplyTooLarge

    cap = 4 * 1024 * 1024
    async with Streamer("/v1/responses") as agent:
        client = make_client(4, policy=LOCAL, max_reply_bytes=cap, reply_budget_bytes=16 * cap)
        tracemalloc.start()
        try:
            held = []
            try:
                await client.post_bytes(agent.url + "/v1/responses", b"{}", {"content-type": "application/json"})
            except ReplyTooLarge as exc:
                held.append(exc)  # as a rollout's failure keeps it
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await client.aclose()
    assert held and peak > cap // 2  # the reply was read up to the cap...
    assert current < cap // 4, f"{current:,} bytes still held"  # ...and none of it is held by the refusal
    assert client.budget.used == 0
