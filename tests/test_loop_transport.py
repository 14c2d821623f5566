"""Transport and bounds (contract rules 11, 12, 13, 14), over real sockets on 127.0.0.1."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from rollouts.engine.failures import FailureKind
from rollouts.engine.loop import InvalidBaseURL, validate_base_url
from tests.servers import (
    LOCAL,
    AgentService,
    EnvService,
    RawServer,
    RecordingObserver,
    Reply,
    async_test,
    call,
    drive,
    free_url,
    message,
    reasoning,
    reply,
)

GOOD = reply(message("ok"))


def agent_answer(path, body):
    return 200, GOOD


# -- rule 11: connection refused, reset, dropped ----------------------------------------------------
@async_test
async def test_a_refused_connection_fails_as_unreachable_naming_the_url():
    url = free_url()
    async with EnvService() as env:
        started = time.perf_counter()
        outcome = await drive(url, env, retry_pause_s=0.15)
        elapsed = time.perf_counter() - started
    assert outcome.failure_kind == FailureKind.AGENT_UNREACHABLE
    assert elapsed >= 0.3, "three attempts: two pauses"  # "no more" is the error's "3 attempts"
    assert f"is your service running at {url}" in outcome.error.lower()
    assert "3 attempts" in outcome.error
    assert outcome.terminal is False
    assert env.at("/verify") == []


@pytest.mark.parametrize("mode", ["drop", "reset", "accept_close"])
@async_test
async def test_a_service_that_always_drops_the_connection_gets_exactly_three_attempts(mode):
    async with RawServer(mode) as agent, EnvService() as env:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_UNREACHABLE
    assert agent.connections == 3
    assert agent.url in outcome.error


@async_test
async def test_attempts_are_separated_by_a_pause():
    async with RawServer("reset") as agent, EnvService() as env:
        started = time.perf_counter()
        outcome = await drive(agent, env, retry_pause_s=0.15)
        elapsed = time.perf_counter() - started
    assert outcome.failure_kind == FailureKind.AGENT_UNREACHABLE
    assert elapsed >= 0.3, "two pauses between three attempts"


@pytest.mark.parametrize("mode", ["drop", "reset", "accept_close"])
@async_test
async def test_a_service_that_drops_the_first_two_connections_then_answers_succeeds(mode):
    async with RawServer(mode, fail_first=2, respond=agent_answer) as agent, EnvService() as env:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert agent.connections == 3
    assert outcome.num_agent_calls == 1


@async_test
async def test_a_server_error_is_not_retried():
    async with AgentService(Reply(500, text="no")) as agent, EnvService() as env:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_HTTP_ERROR
    assert len(agent.requests) == 1


@async_test
async def test_a_timed_out_call_is_not_retried():
    async with AgentService(Reply(json=GOOD, delay=2.0)) as agent, EnvService() as env:
        outcome = await drive(agent, env, remote_responses_timeout_s=0.3)
    assert outcome.failure_kind == FailureKind.AGENT_TIMEOUT
    assert len(agent.requests) == 1


@async_test
async def test_a_service_that_does_not_speak_http_fails_at_once_as_the_agents_error():
    async with RawServer("garbage") as agent, EnvService() as env:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_HTTP_ERROR, outcome.error
    assert agent.connections == 1
    assert agent.url in outcome.error
    assert "internal" not in outcome.error


@pytest.mark.parametrize(
    "route, kind",
    [
        ("/seed_session", FailureKind.SEED_FAILED),
        ("/increment_counter", FailureKind.TOOL_TRANSPORT_FAILED),
        ("/verify", FailureKind.VERIFY_FAILED),
    ],
)
@async_test
async def test_an_env_that_does_not_speak_http_is_that_env_calls_failure(route, kind):
    def env_answer(path, body):
        return None if path == route else (200, {**json.loads(body), "reward": 1.0} if path == "/verify" else {})

    script = [reply(call("increment_counter", {"count": 1})), GOOD]
    async with RawServer("garbage", fail_first=0, respond=env_answer) as env, AgentService(*script) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == kind, outcome.error
    assert env.paths.count(route) == 1, "not retried"


@async_test
async def test_seed_and_verify_retry_dropped_connections_too():
    seen = []

    def env_answer(path, body):
        seen.append(path)
        return (200, {**json.loads(body), "reward": 0.5}) if path == "/verify" else (200, {})

    async with RawServer("reset", fail_first=2, respond=env_answer) as env, AgentService(GOOD) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert outcome.reward == 0.5
    assert env.connections == 4  # 2 dropped seeds, the seed, the verify
    assert seen == ["/seed_session", "/verify"]


@async_test
async def test_an_unreachable_env_fails_the_seed_and_the_agent_is_never_called():
    async with AgentService(GOOD) as agent:
        url = free_url()
        outcome = await drive(agent, url)
    assert outcome.failure_kind == FailureKind.SEED_FAILED
    assert url in outcome.error
    assert agent.requests == []


@async_test
async def test_an_env_dropping_the_verify_call_is_a_verify_failure_after_three_attempts():
    def env_answer(path, body):
        return (200, {}) if path == "/seed_session" else None

    async with RawServer("drop", fail_first=0, respond=env_answer) as env, AgentService(GOOD) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.VERIFY_FAILED
    assert env.paths == ["/seed_session"] + ["/verify"] * 3
    assert outcome.response["output"] == GOOD["output"], "the trajectory is kept"


@async_test
async def test_with_a_retry_budget_an_env_restarting_for_a_moment_costs_no_rollout():
    seen = []

    def env_answer(path, body):
        seen.append(path)
        return (200, {**json.loads(body), "reward": 1.0}) if path == "/verify" else (200, {})

    # six refused connections: past the contract's three attempts, within a 3 s budget
    async with RawServer("reset", fail_first=6, respond=env_answer) as env, AgentService(GOOD) as agent:
        outcome = await drive(agent, env, retry_pause_s=0.05, connect_retry_budget_s=3.0)
    assert outcome.ok, outcome.error
    assert env.connections == 8  # 6 dropped seeds, the seed, the verify
    assert seen == ["/seed_session", "/verify"]


@async_test
async def test_a_retry_budget_ends_and_the_failure_says_how_long_it_tried():
    async with RawServer("reset") as agent, EnvService() as env:
        outcome = await drive(agent, env, retry_pause_s=0.05, connect_retry_budget_s=0.6)
    assert outcome.failure_kind == FailureKind.AGENT_UNREACHABLE
    assert agent.connections > 3, "tries go on past the three attempts while the budget lasts"
    assert f"{agent.connections} attempts over 0.6 s" in outcome.error


# -- rule 12: timeouts ------------------------------------------------------------------------------
@async_test
async def test_a_slow_agent_call_fails_as_agent_timeout_naming_the_knob():
    obs = RecordingObserver()
    async with AgentService(Reply(json=GOOD, delay=3.0)) as agent, EnvService() as env:
        started = time.perf_counter()
        outcome = await drive(agent, env, observer=obs, remote_responses_timeout_s=0.3)
        elapsed = time.perf_counter() - started
    assert outcome.failure_kind == FailureKind.AGENT_TIMEOUT
    assert re.search(r"\bremote_responses_timeout_s\b", outcome.error), outcome.error
    assert "0.3" in outcome.error
    assert elapsed >= 0.25  # an upper bound would time the machine: the failure kind says it was cut
    assert obs.steps[0].error


@async_test
async def test_the_per_call_timeout_applies_to_each_call_not_the_whole_rollout():
    # four calls of 0.2 s each under a 0.35 s per-call bound: 0.8 s in all is fine
    script = [Reply(json=reply(reasoning()), delay=0.2)] * 3 + [Reply(json=GOOD, delay=0.2)]
    async with AgentService(*script) as agent, EnvService() as env:
        outcome = await drive(agent, env, remote_responses_timeout_s=0.35)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 4


@async_test
async def test_a_rollout_that_runs_too_long_fails_as_rollout_timeout_naming_the_knob():
    # the agent never finishes: it only ever reasons (rule 10 calls it again and again)
    async with AgentService(Reply(json=reply(reasoning()), delay=0.02)) as agent, EnvService() as env:
        started = time.perf_counter()
        outcome = await drive(agent, env, run_timeout_s=0.3)
        elapsed = time.perf_counter() - started
    assert outcome.failure_kind == FailureKind.ROLLOUT_TIMEOUT
    assert re.search(r"\brun_timeout_s\b", outcome.error), outcome.error
    assert elapsed >= 0.25  # an upper bound would time the machine: the failure kind says it was cut
    assert outcome.terminal is False
    assert outcome.response is not None and outcome.response["output"], "partial trajectory kept"
    assert env.at("/verify") == []


@async_test
async def test_a_hanging_tool_call_is_bounded_by_the_rollout_timeout():
    script = [reply(call("slow_tool", {}, call_id="c1")), GOOD]
    async with AgentService(*script) as agent, EnvService({"slow_tool": Reply(json={}, delay=5.0)}) as env:
        started = time.perf_counter()
        outcome = await drive(agent, env, run_timeout_s=0.3)
    assert outcome.failure_kind == FailureKind.ROLLOUT_TIMEOUT
    assert time.perf_counter() - started < 2.0


@async_test
async def test_a_hanging_seed_is_bounded_by_the_rollout_timeout():
    async with AgentService(GOOD) as agent, EnvService(seed=Reply(json={}, delay=5.0)) as env:
        outcome = await drive(agent, env, run_timeout_s=0.3)
    assert outcome.failure_kind == FailureKind.ROLLOUT_TIMEOUT
    assert agent.requests == []


@async_test
async def test_the_rollout_timeout_wins_when_it_is_shorter_than_the_call_timeout():
    async with AgentService(Reply(json=GOOD, delay=5.0)) as agent, EnvService() as env:
        outcome = await drive(agent, env, run_timeout_s=0.3, remote_responses_timeout_s=3.0)
    assert outcome.failure_kind == FailureKind.ROLLOUT_TIMEOUT


@async_test
async def test_the_client_sets_no_hidden_default_timeout():
    # httpx's default is 5 s and aiohttp's 300 s: the loop's own bounds must be the only ones.
    from rollouts.engine.http import make_client

    client = make_client(2, policy=LOCAL)
    try:
        assert client.timeout.connect is None and client.timeout.read is None
    finally:
        await client.aclose()


# -- rule 13: agent_base_url ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
        ("https://agent.example.com/prefix/", "https://agent.example.com/prefix"),
        ("http://[::1]:9000/", "http://[::1]:9000"),
    ],
)
def test_a_good_base_url_is_accepted_without_its_trailing_slash(url, expected):
    assert validate_base_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "/v1",
        "agent:9000",
        "localhost:9000",
        "//agent.example.com",
        "ftp://agent.example.com",
        "file:///etc/passwd",
        "http://agent.example.com/?x=1",
        "http://agent.example.com?",
        "http://agent.example.com/#frag",
        "http://agent.example.com#",
        "http://",
        "",
    ],
)
def test_a_bad_base_url_is_rejected(url):
    with pytest.raises(InvalidBaseURL):
        validate_base_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:s3cretPW@agent.example.com:9000/",
        "https://alice:s3cretPW@agent.example.com",
        "http://s3cretPW@agent.example.com",
        "http://alice:s3cretPW@agent.example.com/?q=1",
        "ftp://alice:s3cretPW@agent.example.com",
        "http://alice:s3cretPW/x@agent.example.com",
        "http://alice:s3cretPW#x@agent.example.com",
        "http://alice:s3cretPW?x@agent.example.com",
        "alice:s3cretPW@agent.example.com",
        "http//alice:s3cretPW@agent.example.com",
        "http://alice:s3cretPW@",
    ],
)
def test_embedded_credentials_are_rejected_and_never_echoed(url):
    with pytest.raises(InvalidBaseURL) as info:
        validate_base_url(url)
    assert "s3cretPW" not in str(info.value)


def test_the_error_names_the_setting():
    with pytest.raises(InvalidBaseURL) as info:
        validate_base_url("ftp://x", what="agent_base_url")
    assert "agent_base_url" in str(info.value)


# -- rule 14: proxy variables are ignored -----------------------------------------------------------
PROXY_VARS = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]


@pytest.fixture
def dead_proxy_env(monkeypatch):
    """Point every proxy variable at a port where nothing listens."""
    proxy = free_url()
    for var in PROXY_VARS:
        monkeypatch.setenv(var, proxy)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    return proxy


@async_test
async def test_proxy_variables_are_ignored(dead_proxy_env):
    script = [reply(call("increment_counter", {"count": 1})), GOOD]
    async with AgentService(*script) as agent, EnvService({"increment_counter": {"count": 1}}) as env:
        outcome = await drive(agent, env)
    assert outcome.ok, outcome.error
    assert len(agent.calls) == 2 and len(env.requests) == 3


@async_test
async def test_proxy_variables_are_ignored_and_the_proxy_is_never_contacted(monkeypatch):
    async with RawServer("reset") as proxy:
        for var in PROXY_VARS:
            monkeypatch.setenv(var, proxy.url)
        for var in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(var, raising=False)
        async with AgentService(GOOD) as agent, EnvService() as env:
            outcome = await drive(agent, env)
            # the same variables do send a client that reads the environment to the proxy,
            # so the check above is meaningful
            async with httpx.AsyncClient(trust_env=True) as reading_client:
                with pytest.raises(httpx.HTTPError):
                    await reading_client.post(f"{agent.url}/v1/responses", json={})
        assert outcome.ok, outcome.error
        assert proxy.connections == 1, "only the environment-reading client went to the proxy"


# -- rule 12: concurrency (aiohttp's connector caps connections at 100 unless sized) ----------------
@async_test
async def test_one_shared_client_carries_more_than_100_agent_calls_in_flight_at_once():
    import asyncio

    from rollouts.engine.http import make_client
    from rollouts.engine.loop import DEFAULT_CONCURRENCY, run_rollout
    from tests.servers import settings, task_row

    assert DEFAULT_CONCURRENCY == 32
    n = 120
    in_flight = {"now": 0}
    everyone_here = asyncio.Event()

    async def held_until_all_arrive(rec, k):
        in_flight["now"] += 1
        if in_flight["now"] >= n:
            everyone_here.set()
        try:
            await asyncio.wait_for(everyone_here.wait(), timeout=3.0)
        except TimeoutError:
            return Reply(503, text=f"only {in_flight['now']} calls arrived together")
        return GOOD

    async with AgentService(held_until_all_arrive) as agent, EnvService() as env:
        client = make_client(n, policy=LOCAL)
        try:
            cfg = settings(agent.url, env.url)
            outcomes = await asyncio.gather(*(run_rollout(client, task_row(), cfg) for _ in range(n)))
        finally:
            await client.aclose()
    failed = [o.error for o in outcomes if not o.ok]
    assert not failed, failed[0]
