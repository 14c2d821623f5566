"""Seed, verify and the merged response (contract rules 8, 9, 15), plus what the observer sees and
what a failed rollout keeps (DESIGN.md, "Failure rows")."""

from __future__ import annotations

import json

import pytest

from rollouts.engine.failures import FailureKind
from rollouts.engine.loop import ItemRecord, StepRecord
from rollouts.engine.nemo_request import (
    agent_result,
    materialize_item,
    materialize_response,
    run_record,
    verify_refusal,
)
from tests.servers import (
    AgentService,
    EnvService,
    RecordingObserver,
    Reply,
    async_test,
    call,
    call_output,
    drive,
    echo_verify,
    message,
    reasoning,
    reply,
    task_row,
    usage,
)

TOOLS = {"increment_counter": lambda rec: {"count": rec.json["count"]}, "get_counter_value": {"count": 3}}


def three_turns() -> list:
    return [
        reply(
            reasoning("plan", id="rs_0"),
            call("increment_counter", {"count": 1}, call_id="c1"),
            id="resp_a",
            model="model-a",
            use=usage(10, 5, cached=1, reasoning_tokens=2),
        ),
        reply(
            call("own", {}, call_id="own1"),
            call_output("own1", "agent's own"),
            call("increment_counter", {"count": 2}, call_id="c2"),
            call("get_counter_value", {}, call_id="c3"),
            id="resp_b",
            model="model-b",
            use=usage(20, 7, cached=2, reasoning_tokens=3),
        ),
        reply(
            message("3", id="msg_final"),
            id="resp_c",
            model="model-c",
            use=usage(30, 9, cached=4, reasoning_tokens=5),
            extra_from_last="yes",
        ),
    ]


def expected_output(turns: list) -> list:
    return [
        *turns[0]["output"],
        {"type": "function_call_output", "call_id": "c1", "output": json.dumps({"count": 1})},
        *turns[1]["output"],
        {"type": "function_call_output", "call_id": "c2", "output": json.dumps({"count": 2})},
        {"type": "function_call_output", "call_id": "c3", "output": json.dumps({"count": 3})},
        *turns[2]["output"],
    ]


SUMMED = {
    "input_tokens": 60,
    "output_tokens": 21,
    "total_tokens": 81,
    "input_tokens_details": {"cached_tokens": 7},
    "output_tokens_details": {"reasoning_tokens": 10},
}


# -- rules 8 and 9 ----------------------------------------------------------------------------------
@async_test
async def test_the_verify_body_is_the_row_plus_the_merged_response():
    turns = three_turns()
    row = task_row(expected_count=3, _ng_task_index=4, anything_else={"k": [1, 2]})
    async with EnvService(TOOLS) as env, AgentService(*turns) as agent:
        outcome = await drive(agent, env, row=row)
    assert outcome.ok, outcome.error
    body = env.verify_body
    # What NeMo Gym's remote_agent sends: the row with its params materialised by NeMo Gym's request
    # model, and the merged response materialised by its response model (nemo_request).
    assert {k: v for k, v in body.items() if k != "response"} == run_record(row), (
        "every other row field reaches /verify"
    )
    assert list(body) == [*run_record(row), "response"]
    response = body["response"]
    assert response == materialize_response(outcome.response) and len(response) >= 33
    assert response["id"] == "resp_c" and response["model"] == "model-c", "the last reply"
    assert response["extra_from_last"] == "yes"
    assert response["object"] == "response"
    assert response["output"] == [materialize_item(i) for i in expected_output(turns)], (
        "every item of every step, in order"
    )
    assert response["usage"] == SUMMED
    assert outcome.response["output"] == expected_output(turns)  # stored as the agent sent them
    # and the agent's last call carried the task input plus everything so far
    first_input = row["responses_create_params"]["input"]
    assert agent.calls[2].json["input"] == first_input + expected_output(turns)[:-1]


@async_test
async def test_usage_is_summed_over_all_calls():
    async with EnvService(TOOLS) as env, AgentService(*three_turns()) as agent:
        outcome = await drive(agent, env)
    assert outcome.usage == SUMMED
    assert outcome.warnings == []


@async_test
async def test_a_call_without_usage_adds_nothing_to_the_sum():
    turns = three_turns()
    del turns[1]["usage"]
    async with EnvService(TOOLS) as env, AgentService(*turns) as agent:
        outcome = await drive(agent, env)
    assert outcome.usage["input_tokens"] == 40 and outcome.usage["total_tokens"] == 54
    assert outcome.warnings == [], "some usage was reported"


@async_test
async def test_the_merged_response_is_a_valid_responses_object():
    from rollouts.engine.contract import parse_reply

    async with EnvService(TOOLS) as env, AgentService(*three_turns()) as agent:
        outcome = await drive(agent, env)
    parse_reply(outcome.response)


@async_test
async def test_the_verify_reply_is_kept_as_it_came_and_its_reward_is_the_outcomes():
    verify = echo_verify(reward=0.25, extra_metric=7, reward_components={"a": 1})
    async with EnvService(TOOLS, verify=verify) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok and outcome.reward == 0.25
    assert outcome.verify_response == {
        **env.verify_body,
        "reward": 0.25,
        "extra_metric": 7,
        "reward_components": {"a": 1},
    }


# NeMo Gym's verify-response model reads ``reward`` in pydantic's lax mode (tests/data/agent_results.json)
@pytest.mark.parametrize(
    "reward, expected",
    [
        (0, 0.0),
        (1, 1.0),
        (0.5, 0.5),
        (-1.5, -1.5),
        (True, 1.0),
        (False, 0.0),
        ("0.5", 0.5),
        (" 1 ", 1.0),
        ("1_0", 10.0),
    ],
)
@async_test
async def test_a_reward_nemo_gyms_model_reads_as_a_number_is_accepted_as_that_float(reward, expected):
    async with EnvService(verify=echo_verify(reward=reward)) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outcome.reward == expected and isinstance(outcome.reward, float)
    assert outcome.verify_response["reward"] == reward, "the reply is stored as it came"


# -- rule 15: seed and verify failures --------------------------------------------------------------
@pytest.mark.parametrize("status", [400, 404, 500, 503])
@async_test
async def test_a_seed_failure_is_a_failure_row_and_the_agent_is_never_called(status):
    async with EnvService(seed=Reply(status, text="cannot seed")) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok is False and outcome.reward is None
    assert outcome.failure_kind == FailureKind.SEED_FAILED
    assert str(status) in outcome.error and "cannot seed" in outcome.error
    assert agent.requests == []
    assert outcome.response is None and outcome.num_agent_calls == 0
    assert env.at("/verify") == []


BAD_VERIFY = {
    "non-2xx": Reply(500, text="verifier crashed"),
    "422": Reply(422, json={"reward": 1.0}),
    "not json": Reply(200, text="reward=1"),
    "json array": Reply(200, json=[{"reward": 1.0}]),
    "no reward": echo_verify(score=1.0),
    "null reward": echo_verify(reward=None),
    "word reward": echo_verify(reward="abc"),
    "list reward": echo_verify(reward=[1]),
    "nan reward": echo_verify(reward="nan"),
    "inf reward": echo_verify(reward="inf"),
    "only a reward": Reply(200, json={"reward": 1.0}),
    "no response": echo_verify(drop=("response",), reward=1.0),
    "no responses_create_params": echo_verify(drop=("responses_create_params",), reward=1.0),
    "response not a Responses object": echo_verify(reward=1.0, response={"id": "r"}),
    "mask_sample not a bool": echo_verify(reward=1.0, mask_sample="maybe"),
    "failure_kind a number": echo_verify(reward=1.0, failure_kind=3),
}


@pytest.mark.parametrize("name", list(BAD_VERIFY))
@async_test
async def test_a_bad_verify_reply_is_a_verify_failure(name):
    obs = RecordingObserver()
    async with EnvService(TOOLS, verify=BAD_VERIFY[name]) as env, AgentService(reply(message("done"))) as agent:
        outcome = await drive(agent, env, observer=obs)
    assert outcome.ok is False
    assert outcome.failure_kind == FailureKind.VERIFY_FAILED
    assert outcome.reward is None and outcome.verify_response is None
    assert outcome.terminal is False
    assert outcome.response["output"] == [message("done")], "the trajectory is kept"
    assert len(obs.steps) == 1


@async_test
async def test_a_non_2xx_verify_reports_the_status_and_the_start_of_the_body():
    async with EnvService(verify=Reply(500, text="V" * 1000)) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env)
    assert "500" in outcome.error and "V" * 500 in outcome.error and "V" * 501 not in outcome.error


# -- the observer and partial trajectories ----------------------------------------------------------
@async_test
async def test_the_observer_receives_steps_and_items_in_order_with_seq_numbers_and_latencies():
    obs = RecordingObserver()
    turns = three_turns()
    async with EnvService(TOOLS) as env, AgentService(*turns) as agent:
        outcome = await drive(agent, env, observer=obs)
    assert outcome.ok, outcome.error
    assert obs.events[0][0] == "seeded" and obs.events[0][1] >= 0
    assert [e[0] for e in obs.events] == ["seeded", "step", "items", "step", "items", "items", "step"]
    steps = obs.steps
    assert all(isinstance(s, StepRecord) for s in steps)
    assert [s.index for s in steps] == [0, 1, 2]
    assert [s.response_id for s in steps] == ["resp_a", "resp_b", "resp_c"]
    assert [s.num_asks for s in steps] == [1, 2, 0]
    assert all(s.latency_ms > 0 and s.http_status == 200 and s.error is None for s in steps)
    assert steps[0].usage == turns[0]["usage"]
    items = obs.items
    assert all(isinstance(i, ItemRecord) for i in items)
    assert [i.seq for i in items] == list(range(len(items)))
    assert [i.item for i in items] == expected_output(turns)
    assert [i.step for i in items] == [0, 0, 0, 1, 1, 1, 1, 1, 1, 2]
    assert [i.origin for i in items] == [
        "agent",
        "agent",
        "gym",
        "agent",
        "agent",
        "agent",
        "agent",
        "gym",
        "gym",
        "agent",
    ]
    gym = [i for i in items if i.origin == "gym"]
    assert all(g.latency_ms is not None and g.latency_ms >= 0 and g.tool_status == 200 for g in gym)
    by_call = {i.item.get("call_id"): i for i in items if i.kind == "function_call"}
    assert by_call["c1"].asked and by_call["c2"].asked and by_call["c3"].asked
    assert not by_call["own1"].asked and by_call["own1"].paired
    assert outcome.seed_ms is not None and outcome.verify_ms is not None and outcome.total_ms > 0


@async_test
async def test_a_rollout_that_fails_midway_keeps_its_partial_trajectory():
    obs = RecordingObserver()
    turns = three_turns()
    async with EnvService(TOOLS) as env, AgentService(turns[0], turns[1], Reply(500, text="agent crashed")) as agent:
        outcome = await drive(agent, env, observer=obs)
    assert outcome.failure_kind == FailureKind.AGENT_HTTP_ERROR
    assert outcome.response is not None
    assert outcome.response["output"] == expected_output(turns)[:-1]
    assert outcome.response["id"] == "resp_b"
    assert outcome.usage["input_tokens"] == 30
    assert [s.index for s in obs.steps] == [0, 1, 2]
    assert obs.steps[-1].error and "500" in obs.steps[-1].error
    assert [i.seq for i in obs.items] == list(range(9))
    assert outcome.num_agent_calls == 3 and outcome.num_tool_calls == 3
    assert env.at("/verify") == []


@async_test
async def test_a_terminal_failure_midway_keeps_the_partial_trajectory_too():
    turns = three_turns()
    async with EnvService(TOOLS) as env, AgentService(turns[0], {"not": "a response"}) as agent:
        outcome = await drive(agent, env)
    assert outcome.terminal and outcome.failure_kind == FailureKind.AGENT_INVALID_RESPONSE
    assert [i["type"] for i in outcome.response["output"]] == ["reasoning", "function_call", "function_call_output"]


@async_test
async def test_an_echo_of_task_params_nemo_gyms_model_refuses_is_not_held_against_the_env():
    """A function tool without ``strict`` is refused by NeMo Gym's request model (it would not run
    the task at all); the env echoing those params back is not a verify failure, but params of the
    wrong shape that the env made up are."""
    row = task_row()
    row["responses_create_params"]["tools"] = [{"type": "function", "name": "t", "parameters": {"type": "object"}}]
    async with EnvService(verify=echo_verify(reward=1.0)) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, row)
    assert outcome.ok, outcome.error
    bad = echo_verify(reward=1.0, responses_create_params={"input": 3})
    async with EnvService(verify=bad) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.VERIFY_FAILED and "responses_create_params.input" in outcome.error


@pytest.mark.parametrize("strict", [True, False])
@async_test
async def test_the_outcome_says_whether_nemo_gyms_model_takes_the_verify_reply_whole(strict):
    """The writer's ``agent_result`` reads ``verify_accepted`` instead of validating the reply again:
    it must be what ``verify_refusal`` of the whole reply finds (echoed params included), and give
    the same row."""
    row = task_row()
    tool = {"type": "function", "name": "t", "parameters": {"type": "object"}}
    row["responses_create_params"]["tools"] = [{**tool, "strict": True} if strict else tool]
    async with EnvService(verify=echo_verify(reward=1.0)) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, row)
    assert outcome.ok, outcome.error
    assert outcome.verify_accepted is strict
    assert outcome.verify_accepted == (verify_refusal(outcome.verify_response) is None)
    assert agent_result(outcome.verify_response, outcome.verify_accepted) == agent_result(outcome.verify_response)
