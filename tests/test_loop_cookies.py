"""Cookies (DESIGN.md, "Cookies" and the known pitfall about shared jars): one jar per party per
rollout, env cookies only to the env, agent cookies only to the agent, always the latest value.

Agent and env both listen on 127.0.0.1, which is exactly where a shared client jar (not scoped by
port) would leak one party's cookies to the other."""

from __future__ import annotations

import asyncio

from rollouts.engine.http import make_client
from rollouts.engine.loop import run_rollout
from tests.servers import (
    LOCAL,
    AgentService,
    EnvService,
    Reply,
    async_test,
    call,
    drive,
    message,
    reply,
    settings,
    task_row,
)


def set_cookie(*values: str) -> list[tuple[str, str]]:
    return [("Set-Cookie", v) for v in values]


ASK_THEN_FINISH = [
    reply(call("increment_counter", {"count": 1}, call_id="c1")),
    reply(call("increment_counter", {"count": 2}, call_id="c2")),
    reply(message()),
]


@async_test
async def test_env_cookies_from_seed_go_on_every_tool_call_and_verify_and_never_to_the_agent():
    seed = Reply(json={}, headers=set_cookie("env_session=ENVSECRET; Path=/; HttpOnly", "env_other=2"))
    async with (
        EnvService({"increment_counter": {"count": 1}}, seed=seed) as env,
        AgentService(*ASK_THEN_FINISH) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert env.at("/seed_session")[0].cookie_header is None, "a rollout starts with an empty jar"
    assert len(env.tool_requests) == 2 and len(env.at("/verify")) == 1
    for rec in env.tool_requests + env.at("/verify"):
        assert rec.cookies == {"env_session": "ENVSECRET", "env_other": "2"}, rec.path
    assert len(agent.calls) == 3
    for rec in agent.calls:
        assert rec.cookie_header is None
        assert "ENVSECRET" not in rec.body.decode()


@async_test
async def test_an_env_cookie_reset_on_a_tool_reply_is_used_for_the_next_tool_call_and_verify():
    counter = {"n": 0}

    def tool(rec):
        counter["n"] += 1
        return Reply(json={"count": counter["n"]}, headers=set_cookie(f"env_session=v{counter['n'] + 1}; Path=/"))

    seed = Reply(json={}, headers=set_cookie("env_session=v1; Path=/"))
    async with EnvService({"increment_counter": tool}, seed=seed) as env, AgentService(*ASK_THEN_FINISH) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.cookies.get("env_session") for r in env.tool_requests] == ["v1", "v2"]
    assert env.at("/verify")[0].cookies == {"env_session": "v3"}


@async_test
async def test_an_env_cookie_set_on_a_failing_tool_reply_is_kept_too():
    seed = Reply(json={}, headers=set_cookie("s=1"))
    tool = Reply(500, text="err", headers=set_cookie("s=2"))
    async with EnvService({"increment_counter": tool}, seed=seed) as env, AgentService(*ASK_THEN_FINISH) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.cookies for r in env.tool_requests] == [{"s": "1"}, {"s": "2"}]
    assert env.at("/verify")[0].cookies == {"s": "2"}


@async_test
async def test_a_cookie_deleted_with_max_age_zero_is_no_longer_sent():
    seed = Reply(json={}, headers=set_cookie("keep=1; Path=/", "gone=1; Path=/"))
    tool = Reply(json={}, headers=set_cookie("gone=; Max-Age=0; Path=/"))
    async with EnvService({"increment_counter": tool}, seed=seed) as env, AgentService(*ASK_THEN_FINISH) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert env.tool_requests[0].cookies == {"keep": "1", "gone": "1"}
    assert env.tool_requests[1].cookies == {"keep": "1"}
    assert env.at("/verify")[0].cookies == {"keep": "1"}


@async_test
async def test_a_cookie_deleted_with_an_expiry_in_the_past_is_no_longer_sent():
    seed = Reply(json={}, headers=set_cookie("keep=1", "gone=1"))
    tool = Reply(json={}, headers=set_cookie('gone=""; expires=Thu, 01 Jan 1970 00:00:00 GMT; Path=/'))
    async with EnvService({"increment_counter": tool}, seed=seed) as env, AgentService(*ASK_THEN_FINISH) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert env.at("/verify")[0].cookies == {"keep": "1"}


@async_test
async def test_the_agents_cookies_are_echoed_on_its_later_calls_and_never_sent_to_the_env():
    def agent_turn(rec, n):
        headers = set_cookie(f"agent_state=turn{n}; Path=/") if n < 2 else []
        return Reply(json=ASK_THEN_FINISH[n], headers=headers)

    async with EnvService({"increment_counter": {"count": 1}}) as env, AgentService(agent_turn) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.cookie_header for r in agent.calls] == [None, "agent_state=turn0", "agent_state=turn1"]
    assert env.requests
    for rec in env.requests:
        assert rec.cookie_header is None, rec.path


@async_test
async def test_same_named_cookies_of_the_two_parties_stay_apart():
    seed = Reply(json={}, headers=set_cookie("sid=ENV"))

    def agent_turn(rec, n):
        return Reply(json=ASK_THEN_FINISH[n], headers=set_cookie("sid=AGENT") if n == 0 else [])

    async with EnvService({"increment_counter": {"count": 1}}, seed=seed) as env, AgentService(agent_turn) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.cookie_header for r in agent.calls] == [None, "sid=AGENT", "sid=AGENT"]
    assert {r.cookie_header for r in env.tool_requests + env.at("/verify")} == {"sid=ENV"}


def _task(name: str) -> dict:
    return task_row(input=f"task {name}", task=name)


def _name_of(rec) -> str:
    text = rec.json["input"][0]["content"]
    return text.split()[-1]


@async_test
async def test_two_concurrent_rollouts_through_one_shared_client_never_see_each_others_cookies():
    async def seed(rec):
        return Reply(json={}, headers=set_cookie(f"env_sid=ENV-{rec.json['task']}"))

    async def tool(rec):
        await asyncio.sleep(0.02)  # interleave the two rollouts
        return Reply(json={"task": rec.json["task"]}, headers=set_cookie(f"env_sid=ENV-{rec.json['task']}-2"))

    async def agent_turn(rec, n):
        name = _name_of(rec)
        await asyncio.sleep(0.02)
        turns = sum(1 for i in rec.json["input"] if i.get("type") == "function_call_output")
        if turns < 2:
            body = reply(call("probe", {"task": name}, call_id=f"c{turns}"))
        else:
            body = reply(message(name))
        return Reply(json=body, headers=set_cookie(f"agent_sid=AGENT-{name}-{turns}"))

    async def verify(rec):
        return {**rec.json, "reward": 1.0}

    env = EnvService({"probe": tool}, seed=seed, verify=verify)
    agent = AgentService(agent_turn)
    async with env, agent:
        client = make_client(4, policy=LOCAL)
        try:
            cfg = settings(agent.url, env.url)
            outcomes = await asyncio.gather(*(run_rollout(client, _task(n), cfg) for n in ("A", "B", "C")))
        finally:
            await client.aclose()
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert len(env.tool_requests) == 6 and len(agent.calls) == 9
    for rec in env.tool_requests:
        name = rec.json["task"]
        assert rec.cookies in ({"env_sid": f"ENV-{name}"}, {"env_sid": f"ENV-{name}-2"}), (name, rec.cookie_header)
    assert len(env.at("/verify")) == 3 and len(env.at("/seed_session")) == 3
    for rec in env.at("/verify"):
        assert rec.cookies == {"env_sid": f"ENV-{rec.json['task']}-2"}
    for rec in env.at("/seed_session"):
        assert rec.cookie_header is None
    for rec in agent.calls:
        name = _name_of(rec)
        turns = sum(1 for i in rec.json["input"] if i.get("type") == "function_call_output")
        expected = None if turns == 0 else f"agent_sid=AGENT-{name}-{turns - 1}"
        assert rec.cookie_header == expected, (name, turns, rec.cookie_header)


@async_test
async def test_a_second_rollout_of_the_same_task_on_the_same_client_starts_clean():
    seed = Reply(json={}, headers=set_cookie("env_sid=E"))

    def agent_turn(rec, n):
        return Reply(json=reply(message()), headers=set_cookie("agent_sid=A"))

    async with EnvService(seed=seed) as env, AgentService(agent_turn) as agent:
        client = make_client(2, policy=LOCAL)
        try:
            cfg = settings(agent.url, env.url)
            first = await run_rollout(client, task_row(), cfg)
            second = await run_rollout(client, task_row(), cfg)
        finally:
            await client.aclose()
    assert first.ok and second.ok
    assert [r.cookie_header for r in agent.calls] == [None, None]
    assert [r.cookie_header for r in env.at("/seed_session")] == [None, None]
    assert [r.cookie_header for r in env.at("/verify")] == ["env_sid=E", "env_sid=E"]
