"""Three edge cases where gymweb does exactly what NeMo Gym's remote_agent does
(DESIGN.md rules 6, 8 and 10), each driven over real HTTP against the example counter env (a
NeMo Gym-compatible resources server) and a scripted agent on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from gymweb.examples._serve import BackgroundServer
from gymweb.examples.counter_env import make_app
from tests.servers import AgentService, RecordingObserver, async_test, call, drive, message, reply, task_row, usage


@pytest.fixture(scope="module")
def counter_env():
    with BackgroundServer(make_app()) as server:
        yield server.url


def add_3_row(expected_count: int) -> dict:
    return task_row(input=[{"role": "user", "content": "add 3"}], initial_count=0, expected_count=expected_count)


# -- rule 10: incomplete_details stops before the reply's asks run ---------------------------------
@async_test
async def test_an_incomplete_reply_ends_the_loop_before_its_asks_run(counter_env):
    ask = call("increment_counter", {"count": 3}, call_id="c1", id="fc_1")
    stopped = reply(ask, status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    obs = RecordingObserver()
    async with AgentService(stopped, reply(message("3"))) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=0), observer=obs)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 1
    # NeMo Gym: merged output [function_call] and reward 1.0 (the counter never moved from 0).
    assert outcome.response["output"] == [ask]
    assert outcome.reward == 1.0
    assert outcome.num_tool_calls == 0
    assert outcome.verify_response["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert not [i for i in obs.items if i.origin == "gym"], "no output was added for the unanswered ask"


@async_test
async def test_the_same_ask_without_incomplete_details_runs(counter_env):
    ask = call("increment_counter", {"count": 3}, call_id="c1")
    async with AgentService(reply(ask), reply(message("3"))) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=3))
    assert outcome.ok, outcome.error
    assert [i["type"] for i in outcome.response["output"]] == ["function_call", "function_call_output", "message"]
    assert outcome.reward == 1.0


@async_test
async def test_a_max_steps_stop_still_runs_the_last_asks(counter_env):
    ask = call("increment_counter", {"count": 3}, call_id="c1")
    async with AgentService(reply(ask)) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=3), max_steps=1)
    assert outcome.ok, outcome.error
    assert [i["type"] for i in outcome.response["output"]] == ["function_call", "function_call_output"]
    assert outcome.reward == 1.0


# -- rule 6: NeMo Gym's error text for arguments that are not JSON, byte for byte -----------------
@pytest.mark.parametrize(
    "arguments, expected",
    [
        (
            "not json",
            '{"error": "Invalid tool call arguments: JSONDecodeError(\'Expecting value: line 1 column 1 (char 0)\')"}',
        ),
        (
            "",
            '{"error": "Invalid tool call arguments: JSONDecodeError(\'Expecting value: line 1 column 1 (char 0)\')"}',
        ),
        (
            '{"count": 3',
            '{"error": "Invalid tool call arguments: JSONDecodeError(\\"Expecting \',\' delimiter: line 1 column 12 (char 11)\\")"}',
        ),
        (
            "{count: 3}",
            '{"error": "Invalid tool call arguments: JSONDecodeError(\'Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\')"}',
        ),
    ],
)
@async_test
async def test_arguments_that_are_not_json_get_nemo_gyms_error_text(counter_env, arguments, expected):
    async with AgentService(reply(call("increment_counter", arguments, call_id="c1")), reply(message("0"))) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=0))
    assert outcome.ok, outcome.error
    sent_back = [i for i in agent.calls[1].json["input"] if i.get("type") == "function_call_output"]
    assert sent_back == [{"type": "function_call_output", "call_id": "c1", "output": expected}]
    assert outcome.response["output"][1]["output"] == expected
    assert outcome.reward == 1.0, "the call never reached the env"


# -- rule 8: extra usage keys of the first reply are kept, the five counts summed -------------------
@async_test
async def test_extra_usage_keys_are_kept_as_nemo_gym_keeps_them(counter_env):
    first = {**usage(100, 10, cached=4, reasoning_tokens=2), "cost": 0.25, "input_tokens_per_turn": [100]}
    first["input_tokens_details"]["audio_tokens"] = 7
    second = {**usage(150, 20, cached=6, reasoning_tokens=3), "cost": 0.5, "input_tokens_per_turn": [150]}
    script = [reply(call("increment_counter", {"count": 3}, call_id="c1"), use=first), reply(message("3"), use=second)]
    async with AgentService(*script) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=3))
    assert outcome.ok, outcome.error
    expected = {
        "input_tokens": 250,
        "output_tokens": 30,
        "total_tokens": 280,
        "input_tokens_details": {"cached_tokens": 10, "audio_tokens": 7},
        "output_tokens_details": {"reasoning_tokens": 5},
        "cost": 0.25,
        "input_tokens_per_turn": [100],
    }
    assert outcome.usage == expected
    assert outcome.verify_response["response"]["usage"] == expected
    assert json.loads(json.dumps(outcome.response["usage"])) == expected


@async_test
async def test_the_first_reply_that_reports_usage_gives_the_extra_keys(counter_env):
    later = {**usage(5, 1), "cost": 1.5}
    script = [reply(call("increment_counter", {"count": 3}, call_id="c1"), use=None), reply(message("3"), use=later)]
    async with AgentService(*script) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=3))
    assert outcome.ok, outcome.error
    assert outcome.usage == later


@async_test
async def test_a_null_detail_count_makes_the_sum_unknown_not_zero(counter_env):
    first = usage(10, 5)
    first["input_tokens_details"]["cached_tokens"] = None
    script = [
        reply(call("increment_counter", {"count": 3}, call_id="c1"), use=first),
        reply(message("3"), use=usage(10, 5, cached=3)),
    ]
    async with AgentService(*script) as agent:
        outcome = await drive(agent, counter_env, row=add_3_row(expected_count=3))
    assert outcome.ok, outcome.error
    assert outcome.usage["input_tokens"] == 20
    assert outcome.usage["input_tokens_details"] == {"cached_tokens": None}
    assert outcome.usage["output_tokens_details"] == {"reasoning_tokens": 0}
