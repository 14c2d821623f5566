"""What the loop keeps of an agent reply it refuses, where a redirect pointed, and when it says the
agent reported no usage; over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from rollouts.engine.failures import FailureKind
from tests.servers import AgentService, EnvService, Reply, async_test, drive, free_url, message, reply


@async_test
async def test_an_invalid_reply_is_kept_whole_with_its_errors_pointing_into_it():
    bad = reply({"type": "web_search_call", "id": "ws_1", "status": "completed"}, use={"input_tokens": 3})
    async with EnvService() as env, AgentService(bad) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_INVALID_RESPONSE
    kept = outcome.refused_reply
    assert kept is not None
    assert json.loads(kept.body) == bad and kept.truncated is False and kept.size == len(kept.body)
    assert kept.status == 200 and kept.content_type.startswith("application/json")
    paths = [e["path"] for e in kept.errors]
    assert ["output", 0, "action"] in paths
    assert ["usage", "output_tokens"] in paths


@async_test
async def test_a_refused_body_past_the_cap_is_cut_and_says_so():
    body = "x" * 5000
    async with EnvService() as env, AgentService(Reply(502, text=body)) as agent:
        outcome = await drive(agent, env, refused_reply_max_bytes=1000)
    kept = outcome.refused_reply
    assert kept is not None and kept.status == 502
    assert kept.body == b"x" * 1000 and kept.size == 5000 and kept.truncated is True
    assert kept.errors == []


@async_test
async def test_a_valid_reply_keeps_nothing():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok and outcome.refused_reply is None


@pytest.mark.parametrize(
    "location, resolved",
    [
        ("/v2/responses", "/v2/responses"),
        ("../other/v1/responses", "/other/v1/responses"),
        ("https://elsewhere.invalid/v1/responses", None),
    ],
)
@async_test
async def test_a_redirect_names_the_location_resolved_against_the_request_url_and_the_agent_url(location, resolved):
    async with EnvService() as env, AgentService(Reply(307, headers=[("Location", location)])) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_REDIRECT
    target = f"{agent.url}{resolved}" if resolved else location
    assert f"redirecting to {target}" in outcome.error
    if resolved:
        assert f"(Location: {location})" in outcome.error
    assert "the agent URL" in outcome.error and "agent_base_url" in outcome.error
    if target.endswith("/v1/responses"):
        assert target[: -len("/v1/responses")] in outcome.error
    assert outcome.refused_reply is not None and outcome.refused_reply.status == 307


NO_USAGE = "the agent service reported no usage"


@async_test
async def test_the_no_usage_note_is_given_where_a_reply_without_usage_arrived():
    async with EnvService() as env, AgentService(reply(message(), use=None)) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok
    assert any(NO_USAGE in w for w in outcome.warnings)


@pytest.mark.parametrize("case", ["unreachable", "redirect", "invalid", "http error"])
@async_test
async def test_no_usage_note_where_no_reply_was_accepted(case):
    answers = {
        "redirect": Reply(302, headers=[("Location", "/x")]),
        "invalid": reply(message(), object="nope", use=None),
        "http error": Reply(500, text="down"),
    }
    async with EnvService() as env:
        if case == "unreachable":
            outcome = await drive(free_url(), env)
        else:
            async with AgentService(answers[case]) as agent:
                outcome = await drive(agent, env)
    assert not outcome.ok
    assert not any(NO_USAGE in w for w in outcome.warnings), outcome.warnings
