"""What the loop does with each kind of agent reply, over real HTTP (contract rules 1, 2, 3, 7)."""

from __future__ import annotations

import json

import pytest

from rollouts.engine.failures import FailureKind
from rollouts.engine.nemo_request import materialize
from tests.servers import (
    AgentService,
    EnvService,
    RecordingObserver,
    Reply,
    async_test,
    call,
    drive,
    message,
    reply,
    task_row,
)


# -- rule 1: redirects ------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@async_test
async def test_it_never_follows_a_redirect(status):
    async with EnvService() as target, EnvService() as env:
        location = f"{target.url}/v1/responses"
        async with AgentService(Reply(status, text="moved", headers=[("Location", location)])) as agent:
            outcome = await drive(agent, env)
    assert not outcome.ok
    assert outcome.failure_kind == FailureKind.AGENT_REDIRECT
    assert location in outcome.error
    assert str(status) in outcome.error
    assert target.requests == [], "the redirect target must never be contacted"
    assert len(agent.calls) == 1
    assert env.at("/verify") == []


@async_test
async def test_a_redirect_is_not_retried_and_is_not_terminal():
    async with (
        EnvService() as env,
        AgentService(Reply(302, headers=[("Location", "http://elsewhere.invalid/")])) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_REDIRECT
    assert "http://elsewhere.invalid/" in outcome.error
    assert len(agent.calls) == 1
    assert outcome.terminal is False


# -- rule 2: non-2xx, non-JSON, non-object --------------------------------------------------------
@async_test
async def test_a_server_error_reports_the_status_and_at_most_500_characters_of_the_body():
    body = "E" * 2000
    async with EnvService() as env, AgentService(Reply(500, text=body)) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_HTTP_ERROR
    assert "500" in outcome.error
    assert "E" * 500 in outcome.error
    assert "E" * 501 not in outcome.error
    assert outcome.terminal is False
    assert env.at("/verify") == []


@pytest.mark.parametrize("status", [400, 404, 422, 503])
@async_test
async def test_any_non_2xx_status_is_an_http_error_naming_the_status(status):
    async with EnvService() as env, AgentService(Reply(status, text=f"nope {status}")) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_HTTP_ERROR
    assert str(status) in outcome.error and f"nope {status}" in outcome.error


@async_test
async def test_a_body_that_is_not_json_is_a_bad_json_failure():
    async with EnvService() as env, AgentService(Reply(200, text="<html>hello</html>")) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_BAD_JSON
    assert "<html>hello</html>" in outcome.error
    assert outcome.terminal is False


@pytest.mark.parametrize("body", [[reply(message())], "a string", 42, None])
@async_test
async def test_json_that_is_not_an_object_is_a_bad_json_failure(body):
    async with EnvService() as env, AgentService(Reply(200, json=body)) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_BAD_JSON
    assert outcome.terminal is False


# -- rule 3: invalid Responses objects are terminal -----------------------------------------------
def _without(data: dict, key: str) -> dict:
    data = dict(data)
    del data[key]
    return data


INVALID_REPLIES = {
    "missing id": _without(reply(message()), "id"),
    "missing output": _without(reply(message()), "output"),
    "missing tools": _without(reply(message()), "tools"),
    "not a response at all": {"this is": "not a Responses API object"},
    "partial usage": reply(message(), use={"input_tokens": 3, "output_tokens": 4}),
    "unknown item type": reply({"type": "hologram", "id": "h"}),
    "arguments not a string": reply({"type": "function_call", "call_id": "c", "name": "t", "arguments": {"a": 1}}),
    "object is wrong": reply(message(), object="chat.completion"),
}


@pytest.mark.parametrize("name", list(INVALID_REPLIES))
@async_test
async def test_an_invalid_responses_object_is_a_terminal_failure_and_never_retried(name):
    async with EnvService() as env, AgentService(INVALID_REPLIES[name]) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok is False
    assert outcome.failure_kind == FailureKind.AGENT_INVALID_RESPONSE
    assert outcome.terminal is True
    assert len(agent.calls) == 1
    assert env.tool_requests == [] and env.at("/verify") == []


@async_test
async def test_the_invalid_response_error_names_the_bad_field():
    bad = reply({"type": "function_call", "name": "t", "arguments": "{}"})
    async with EnvService() as env, AgentService(bad) as agent:
        outcome = await drive(agent, env)
    assert "call_id" in outcome.error


@async_test
async def test_only_an_invalid_response_is_terminal():
    async with EnvService() as env, AgentService(Reply(500, text="x")) as agent:
        assert (await drive(agent, env)).terminal is False
    assert FailureKind.TERMINAL == {FailureKind.AGENT_INVALID_RESPONSE}


@async_test
async def test_unknown_extra_fields_in_a_reply_are_tolerated_and_kept():
    item = {**message("3"), "vendor": {"x": 1}}
    async with EnvService() as env, AgentService(reply(item, vendor_top="kept", reasoning_effort=None)) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outcome.response["output"] == [item]
    assert outcome.response["vendor_top"] == "kept"


@pytest.mark.parametrize("how", ["omitted", "null"])
@async_test
async def test_usage_omitted_or_null_is_accepted_with_one_warning_and_no_usage(how):
    body = reply(message(), use=None)
    if how == "omitted":
        del body["usage"]
    async with EnvService() as env, AgentService(body) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outcome.usage is None
    assert len(outcome.warnings) == 1 and "usage" in outcome.warnings[0]
    assert env.verify_body["response"]["usage"] is None


@async_test
async def test_the_seeds_quickstart_reply_drives_a_rollout():
    def quickstart(output):
        return {
            "id": "claude-cli-service",
            "created_at": 0.0,
            "model": "claude-haiku",
            "object": "response",
            "output": output,
            "parallel_tool_calls": False,
            "tools": [],
            "tool_choice": "auto",
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "total_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    ask = [
        {
            "type": "function_call",
            "id": "fc_0_0",
            "call_id": "c_0_0",
            "name": "increment_counter",
            "arguments": json.dumps({"count": 1}),
        }
    ]
    final = [
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "id": "m_1",
            "content": [{"type": "output_text", "text": "1", "annotations": []}],
        }
    ]
    async with (
        EnvService({"increment_counter": {"count": 1}}) as env,
        AgentService(quickstart(ask), quickstart(final)) as agent,
    ):
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outcome.reward == 1.0
    assert [r.json for r in env.at("/increment_counter")] == [{"count": 1}]


@async_test
async def test_a_gzip_compressed_reply_is_decoded():
    import gzip

    body = gzip.compress(json.dumps(reply(message("zipped"))).encode())
    headers = [("Content-Encoding", "gzip"), ("Content-Type", "application/json")]
    async with EnvService() as env, AgentService(Reply(raw=body, headers=headers)) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outcome.response["output"][0]["content"][0]["text"] == "zipped"


# -- rule 7: string input -------------------------------------------------------------------------
@async_test
async def test_a_string_input_becomes_one_user_message():
    row = task_row(input="add 1 then get the count")
    async with EnvService() as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, row=row)
    assert outcome.ok, outcome.error
    sent = agent.calls[0].json["input"]
    # As NeMo Gym's remote_agent sends it: the message model's fields that were set, in its order.
    assert sent == [{"content": "add 1 then get the count", "role": "user"}]
    assert b'"input":[{"content":"add 1 then get the count","role":"user"}]' in agent.calls[0].body


@async_test
async def test_a_string_input_is_followed_by_the_conversation_on_later_calls():
    row = task_row(input="add 1")
    script = [reply(call("increment_counter", {"count": 1})), reply(message())]
    async with EnvService({"increment_counter": {"count": 1}}) as env, AgentService(*script) as agent:
        await drive(agent, env, row=row)
    second = agent.calls[1].json["input"]
    assert second[0] == {"content": "add 1", "role": "user"}
    assert [i["type"] for i in second[1:]] == ["function_call", "function_call_output"]


# -- the agent only ever receives responses_create_params -----------------------------------------
@async_test
async def test_the_agent_never_receives_row_fields_other_than_responses_create_params():
    row = task_row(input="add 1", expected_count=77, extra_env_field="ENV-ONLY-VALUE", _ng_task_index=3)
    script = [reply(call("increment_counter", {"count": 1})), reply(message())]
    async with EnvService({"increment_counter": {"count": 1}}) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env, row=row)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 2
    for rec in agent.calls:
        text = rec.body.decode()
        assert set(rec.json) == set(row["responses_create_params"]), "exactly the params, input grown"
        for forbidden in (
            "SECRET-ANSWER-KEY",
            "verifier_metadata",
            "expected_count",
            "ENV-ONLY-VALUE",
            "_ng_task_index",
        ):
            assert forbidden not in text
        assert rec.json["tools"] == row["responses_create_params"]["tools"]
        assert "authorization" not in rec.headers, "gymweb sends no credential to the agent"
    # ... while the env got the whole row on seed and verify, its params materialised by NeMo Gym's
    # request model (every field, in that model's order), as NeMo Gym's remote_agent sends them.
    seeded = env.at("/seed_session")[0].json
    assert seeded == {**row, "responses_create_params": materialize(row["responses_create_params"])}
    assert list(seeded) == list(row) and len(seeded["responses_create_params"]) == 30
    assert (
        seeded["responses_create_params"]["background"] is None
        and seeded["responses_create_params"]["input"] == "add 1"
    )
    assert env.verify_body["verifier_metadata"] == row["verifier_metadata"]


@async_test
async def test_the_callers_row_is_not_modified():
    import copy

    row = task_row(input=[{"role": "user", "content": "add 1"}])
    before = copy.deepcopy(row)
    script = [reply(call("increment_counter", {"count": 1})), reply(message())]
    async with EnvService({"increment_counter": {"count": 1}}) as env, AgentService(*script) as agent:
        await drive(agent, env, row=row)
    assert row == before


@async_test
async def test_a_failed_agent_call_is_reported_to_the_observer_as_a_step_with_an_error():
    obs = RecordingObserver()
    async with EnvService() as env, AgentService(Reply(502, text="bad gateway")) as agent:
        outcome = await drive(agent, env, observer=obs)
    assert outcome.failure_kind == FailureKind.AGENT_HTTP_ERROR
    (step,) = obs.steps
    assert step.index == 0 and step.http_status == 502 and "502" in step.error
    assert step.latency_ms >= 0
