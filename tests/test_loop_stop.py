"""When the loop stops calling the agent (contract rule 10), over real HTTP."""

from __future__ import annotations

import pytest

from tests.servers import (
    LOCAL,
    AgentService,
    EnvService,
    async_test,
    call,
    drive,
    message,
    reasoning,
    reply,
)

TOOLS = {"increment_counter": {"count": 1}}


def ask(n: int = 0) -> dict:
    return reply(call("increment_counter", {"count": 1}, call_id=f"c{n}"), id=f"resp_{n}")


def always_ask(rec, n):
    return ask(n)


@async_test
async def test_it_stops_on_an_assistant_message_without_asks():
    async with EnvService(TOOLS) as env, AgentService(reply(reasoning(), message("3"))) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 1
    assert len(env.at("/verify")) == 1


@async_test
async def test_a_message_beside_asks_does_not_stop_the_loop():
    script = [
        reply(message("let me count"), call("increment_counter", {"count": 1}, call_id="c1")),
        reply(message("1")),
    ]
    async with EnvService(TOOLS) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 2
    assert len(env.tool_requests) == 1


@async_test
async def test_a_message_beside_only_paired_calls_stops_the_loop():
    own = [call("own_tool", {}, call_id="own"), {"type": "function_call_output", "call_id": "own", "output": "x"}]
    async with EnvService(TOOLS) as env, AgentService(reply(*own, message("done"))) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 1
    assert env.tool_requests == []


@async_test
async def test_it_stops_on_incomplete_details():
    stopped = reply(reasoning(), incomplete_details={"reason": "max_output_tokens"}, status="incomplete")
    async with EnvService(TOOLS) as env, AgentService(stopped, reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 1
    assert env.verify_body["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@async_test
async def test_null_incomplete_details_does_not_stop_the_loop():
    async with (
        EnvService(TOOLS) as env,
        AgentService(reply(reasoning(), incomplete_details=None), reply(message())) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 2


@async_test
async def test_a_reasoning_only_reply_means_call_the_agent_again():
    script = [reply(reasoning("a")), reply(reasoning("b")), reply(message("done"))]
    async with EnvService(TOOLS) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 3
    assert [i["type"] for i in agent.calls[2].json["input"][1:]] == ["reasoning", "reasoning"]


@async_test
async def test_an_empty_output_means_call_the_agent_again():
    async with EnvService(TOOLS) as env, AgentService(reply(), reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 2


@pytest.mark.parametrize("max_steps", [1, 2, 3])
@async_test
async def test_max_steps_is_the_exact_number_of_agent_calls_and_the_last_asks_still_run(max_steps):
    async with EnvService(TOOLS) as env, AgentService(always_ask) as agent:
        outcome = await drive(agent, env, max_steps=max_steps)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == max_steps
    assert outcome.num_agent_calls == max_steps
    assert len(env.tool_requests) == max_steps, "the last reply's asks are executed too"
    output = env.verify_body["response"]["output"]
    # materialised as NeMo Gym's remote_agent sends it to /verify
    assert output[-1] == {
        "call_id": f"c{max_steps - 1}",
        "output": '{"count": 1}',
        "type": "function_call_output",
        "id": None,
        "status": None,
    }
    assert env.verify_body["response"]["id"] == f"resp_{max_steps - 1}"


@async_test
async def test_max_steps_counts_reasoning_only_replies_too():
    async with EnvService(TOOLS) as env, AgentService(reply(reasoning())) as agent:
        outcome = await drive(agent, env, max_steps=4)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 4


@async_test
async def test_the_loop_stops_before_max_steps_when_the_agent_finishes():
    async with EnvService(TOOLS) as env, AgentService(ask(0), reply(message())) as agent:
        outcome = await drive(agent, env, max_steps=8)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 2


@pytest.mark.parametrize("max_steps", [0, None])
@async_test
async def test_max_steps_zero_or_unset_is_unbounded(max_steps):
    finish_after = 12

    def agent_turn(rec, n):
        return ask(n) if n < finish_after else reply(message())

    async with EnvService(TOOLS) as env, AgentService(agent_turn) as agent:
        outcome = await drive(agent, env, max_steps=max_steps)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == finish_after + 1
    assert len(env.tool_requests) == finish_after


# -- cancellation and gymweb's own bugs -------------------------------------------------------------
@async_test
async def test_a_cancelled_rollout_raises_cancelled_error_instead_of_becoming_a_failure():
    import asyncio

    from rollouts.engine.http import make_client
    from rollouts.engine.loop import run_rollout
    from tests.servers import Reply, settings, task_row

    async with EnvService(TOOLS) as env, AgentService(Reply(json=reply(message()), delay=5.0)) as agent:
        client = make_client(2, policy=LOCAL)
        try:
            task = asyncio.create_task(run_rollout(client, task_row(), settings(agent.url, env.url)))
            while not agent.calls:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await client.aclose()
    assert env.at("/verify") == []


@async_test
async def test_a_crashing_observer_ends_the_rollout_as_data_not_as_an_exception():
    class Broken:
        def on_seeded(self, latency_ms):
            pass

        def on_step(self, step, items):
            raise RuntimeError("observer bug")

        def on_items(self, items):
            pass

    async with EnvService(TOOLS) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, observer=Broken())
    assert outcome.ok is False
    assert outcome.failure_kind == "internal_error"
    assert "observer bug" in outcome.error
