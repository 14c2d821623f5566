"""How the loop executes the agent's asks against the env (contract rules 4, 5, 6 and the tool part
of 15), over real HTTP."""

from __future__ import annotations

import json

import pytest

from rollouts.engine.failures import FailureKind
from tests.servers import (
    AgentService,
    EnvService,
    RawServer,
    RecordingObserver,
    Reply,
    async_test,
    call,
    call_output,
    drive,
    message,
    reasoning,
    reply,
)


def outputs_in(input_items: list) -> dict:
    """``{call_id: output}`` of the function_call_outputs in an agent request's input."""
    return {i["call_id"]: i["output"] for i in input_items if i.get("type") == "function_call_output"}


# -- the basic ask ----------------------------------------------------------------------------------
@async_test
async def test_an_ask_is_posted_to_the_env_route_of_its_name_with_the_decoded_arguments_as_json():
    script = [reply(call("increment_counter", {"count": 2}, call_id="c1")), reply(message())]
    async with EnvService({"increment_counter": {"count": 2}}) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    (rec,) = env.at("/increment_counter")
    assert rec.method == "POST"
    assert rec.json == {"count": 2}
    assert rec.headers["content-type"].startswith("application/json")
    assert outputs_in(agent.calls[1].json["input"]) == {"c1": json.dumps({"count": 2})}
    assert outcome.num_tool_calls == 1


@async_test
async def test_several_asks_in_one_reply_run_in_order():
    asks = [
        call("a_tool", {"n": 1}, call_id="c1"),
        call("b_tool", {"n": 2}, call_id="c2"),
        call("a_tool", {"n": 3}, call_id="c3"),
    ]
    async with (
        EnvService({"a_tool": {"ok": "a"}, "b_tool": {"ok": "b"}}) as env,
        AgentService(reply(*asks), reply(message())) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [(r.path, r.json) for r in env.tool_requests] == [
        ("/a_tool", {"n": 1}),
        ("/b_tool", {"n": 2}),
        ("/a_tool", {"n": 3}),
    ]
    assert list(outputs_in(agent.calls[1].json["input"])) == ["c1", "c2", "c3"]


# -- rule 4: pairing --------------------------------------------------------------------------------
@async_test
async def test_paired_calls_pass_through_untouched_and_are_not_sent_to_the_env():
    own_call = call("increment_counter", {"count": 5}, call_id="own_1", id="fc_own", status="completed", vendor="x")
    own_output = {**call_output("own_1", "agent ran this itself"), "extra": [1]}
    ask = call("get_counter_value", {}, call_id="ask_1")
    async with (
        EnvService({"get_counter_value": {"count": 0}, "increment_counter": {"count": 99}}) as env,
        AgentService(reply(own_call, own_output, ask), reply(message())) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.path for r in env.tool_requests] == ["/get_counter_value"], "only the unpaired call is executed"
    output = outcome.response["output"]
    assert output[0] == own_call and output[1] == own_output, "the agent's own records are kept verbatim"
    assert output[2] == ask
    assert output[3] == {"type": "function_call_output", "call_id": "ask_1", "output": json.dumps({"count": 0})}
    assert outputs_in(agent.calls[1].json["input"]) == {
        "own_1": "agent ran this itself",
        "ask_1": json.dumps({"count": 0}),
    }


@async_test
async def test_a_call_id_answered_in_an_earlier_turn_does_not_pair():
    script = [
        reply(call("increment_counter", {"count": 1}, call_id="same")),
        reply(call("increment_counter", {"count": 2}, call_id="same")),  # same id, new reply: an ask again
        reply(message()),
    ]
    async with EnvService({"increment_counter": {"count": 0}}) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.json for r in env.at("/increment_counter")] == [{"count": 1}, {"count": 2}]
    assert len(agent.calls) == 3


@async_test
async def test_an_agent_output_from_an_earlier_turn_does_not_pair_a_later_call():
    script = [
        reply(call("own", call_id="c7"), call_output("c7", "mine"), reasoning()),
        reply(call("increment_counter", {"count": 1}, call_id="c7")),
        reply(message()),
    ]
    async with EnvService({"increment_counter": {"count": 1}}) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.path for r in env.tool_requests] == ["/increment_counter"]


@async_test
async def test_a_repeated_call_id_among_asks_runs_once_and_the_last_wins():
    first = call("increment_counter", {"count": 1}, call_id="dup")
    last = call("increment_counter", {"count": 2}, call_id="dup")
    async with (
        EnvService({"increment_counter": lambda rec: rec.json}) as env,
        AgentService(reply(first, last), reply(message())) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.json for r in env.at("/increment_counter")] == [{"count": 2}]
    outs = [i for i in agent.calls[1].json["input"] if i.get("type") == "function_call_output"]
    assert outs == [{"type": "function_call_output", "call_id": "dup", "output": json.dumps({"count": 2})}]
    assert outcome.num_tool_calls == 1


# -- rule 5: undeclared and unsafe tool names -------------------------------------------------------
@async_test
async def test_an_undeclared_tool_is_still_sent_and_the_envs_404_text_becomes_its_output():
    script = [reply(call("not_declared_anywhere", {"x": 1}, call_id="c1")), reply(message())]
    obs = RecordingObserver()
    async with EnvService() as env, AgentService(*script) as agent:
        outcome = await drive(agent, env, observer=obs)
    assert outcome.ok, outcome.error
    assert [r.path for r in env.tool_requests] == ["/not_declared_anywhere"]
    assert outputs_in(agent.calls[1].json["input"]) == {"c1": "404: Not Found"}
    gym = [i for i in obs.items if i.origin == "gym"]
    assert gym[0].tool_status == 404 and not gym[0].refused


UNSAFE_NAMES = [
    "a/b",
    "..",
    ".",
    "x?y",
    "x#y",
    "%2e",
    "%2e%2e",
    "a b",
    "",
    "../verify",
    "seed_session/x",
    "seed_session",
    "verify",
    "aggregate_metrics",
    "close_session",
]


@pytest.mark.parametrize("name", UNSAFE_NAMES)
@async_test
async def test_an_unsafe_or_reserved_tool_name_is_never_sent_and_gets_an_error_output(name):
    script = [reply(call(name, {"x": 1}, call_id="bad")), reply(message())]
    obs = RecordingObserver()
    async with (
        EnvService({"b": {"hit": True}, "y": {"hit": True}, "x": {"hit": True}}) as env,
        AgentService(*script) as agent,
    ):
        outcome = await drive(agent, env, observer=obs)
    assert outcome.ok, outcome.error
    assert env.tool_requests == [], f"env must not see {name!r}"
    assert len(env.at("/seed_session")) == 1 and len(env.at("/verify")) == 1
    output = outputs_in(agent.calls[1].json["input"])["bad"]
    assert output.startswith("Error")
    assert len(agent.calls) == 2, "the rollout goes on"
    gym = [i for i in obs.items if i.origin == "gym"]
    assert gym[0].refused and gym[0].tool_status is None
    assert outcome.num_tool_calls == 0


# -- rule 6: arguments that are not JSON ------------------------------------------------------------
@pytest.mark.parametrize("arguments", ["{count: 1}", "", '{"count": 1', "not json"])
@async_test
async def test_arguments_that_are_not_json_are_not_sent_and_the_output_names_the_parse_error(arguments):
    script = [reply(call("increment_counter", arguments, call_id="c1")), reply(message())]
    async with EnvService({"increment_counter": {"count": 1}}) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert env.tool_requests == []
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(arguments)
    output = outputs_in(agent.calls[1].json["input"])["c1"]
    # NeMo Gym's remote_agent text, byte for byte (rule 6): agents are trained on it.
    assert output == json.dumps({"error": f"Invalid tool call arguments: {info.value!r}"})
    assert len(agent.calls) == 2


@async_test
async def test_a_bad_call_does_not_stop_the_good_ones_in_the_same_reply():
    asks = [call("increment_counter", "{oops", call_id="c1"), call("increment_counter", {"count": 2}, call_id="c2")]
    async with (
        EnvService({"increment_counter": {"count": 2}}) as env,
        AgentService(reply(*asks), reply(message())) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert [r.json for r in env.tool_requests] == [{"count": 2}]
    outs = outputs_in(agent.calls[1].json["input"])
    assert outs["c1"].startswith('{"error": "Invalid tool call arguments: JSONDecodeError(')
    assert outs["c2"] == json.dumps({"count": 2})


# -- rule 15 (tools): a tool's HTTP status is data, a dead env is a failure -------------------------
@pytest.mark.parametrize("status", [400, 422, 500, 503])
@async_test
async def test_a_tools_non_2xx_reply_is_that_calls_output_and_the_rollout_goes_on(status):
    script = [reply(call("increment_counter", {"count": 1}, call_id="c1")), reply(message())]
    async with (
        EnvService({"increment_counter": Reply(status, text=f"boom {status}")}) as env,
        AgentService(*script) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outputs_in(agent.calls[1].json["input"]) == {"c1": f"boom {status}"}
    assert outcome.reward == 1.0


@async_test
async def test_an_env_that_drops_tool_connections_is_a_tool_transport_failure_after_three_attempts():
    def respond(path, body):
        return (200, {}) if path == "/seed_session" else None  # every tool call is dropped

    obs = RecordingObserver()
    ask = call("increment_counter", {"count": 1}, call_id="c1")
    async with (
        RawServer("drop", fail_first=0, respond=respond) as env,
        AgentService(reply(ask), reply(message())) as agent,
    ):
        outcome = await drive(agent, env, observer=obs)
    assert outcome.failure_kind == FailureKind.TOOL_TRANSPORT_FAILED
    assert env.paths == ["/seed_session"] + ["/increment_counter"] * 3
    assert "increment_counter" in outcome.error and env.url in outcome.error
    assert outcome.terminal is False
    # the partial trajectory is kept
    assert outcome.response["output"] == [ask]
    assert [s.index for s in obs.steps] == [0]
    assert len(agent.calls) == 1


@async_test
async def test_an_env_that_recovers_after_dropped_tool_connections_keeps_the_rollout_going():
    tool_attempts = []

    def respond(path, body):
        if path == "/increment_counter":
            tool_attempts.append(body)
            if len(tool_attempts) < 3:
                return None
            return 200, {"count": 1}
        if path == "/verify":
            return 200, {**json.loads(body), "reward": 1.0}
        return 200, {}

    script = [reply(call("increment_counter", {"count": 1}, call_id="c1")), reply(message())]
    async with RawServer("reset", fail_first=0, respond=respond) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(tool_attempts) == 3
    assert outputs_in(agent.calls[1].json["input"]) == {"c1": json.dumps({"count": 1})}
