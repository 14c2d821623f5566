"""The target policy at connection time (``rollouts.engine.targets``): the loop's client (httpx over
aiohttp, ``PolicyResolver`` + ``PolicyAsyncTransport``) and the sync client (``PolicyNetworkBackend``)
judge the address they are about to connect to, so no spelling and no DNS answer reaches a refused
host, and the refused service receives nothing. Real servers on 127.0.0.1."""

from __future__ import annotations

import ipaddress

import pytest

from rollouts.engine import targets
from rollouts.engine.failures import FailureKind
from rollouts.engine.http import make_client
from rollouts.engine.policy_transports import make_sync_client
from rollouts.engine.targets import TargetPolicy, TargetRefused
from tests.servers import AgentService, EnvService, async_test, drive, message, reply

STRICT = TargetPolicy()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
def dns(monkeypatch):
    """Names ending in ``.test`` resolve where the test says (``dns["x.test"] = ["127.0.0.1"]``)."""
    table: dict[str, list[str]] = {}
    real = targets.resolve

    def fake(host: str, port: int):
        name = host.lower().rstrip(".")
        if name in table:
            return [ipaddress.ip_address(a) for a in table[name]]
        return real(host, port)

    monkeypatch.setattr(targets, "resolve", fake)
    return table


@pytest.mark.parametrize(
    "spelling", ["127.0.0.1", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]", "localhost"]
)
@async_test
async def test_a_rollout_to_an_agent_on_loopback_fails_as_target_refused_in_every_spelling(spelling):
    async with EnvService() as env, AgentService(reply(message())) as agent:
        agent_url = f"http://{spelling}:{port_of(agent.url)}"
        outcome = await drive(
            agent_url, env, policy=TargetPolicy.from_settings(False, [f"127.0.0.1:{port_of(env.url)}"])
        )
    assert outcome.failure_kind == FailureKind.TARGET_REFUSED, outcome.error
    assert f"did not connect to the agent service at {agent_url}/v1/responses" in outcome.error
    assert "GYMWEB_ALLOWED_TARGET_HOSTS" in outcome.error
    assert agent.calls == []  # nothing was sent
    assert not outcome.terminal  # a Retry after the policy changes runs it again


@async_test
async def test_an_env_on_loopback_fails_the_seed_as_target_refused_and_names_the_setting():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, policy=STRICT)
    assert outcome.failure_kind == FailureKind.TARGET_REFUSED
    assert outcome.error.startswith("seed_session failed: gymweb did not connect to the environment")
    assert "127.0.0.1 is a loopback address" in outcome.error and "GYMWEB_ALLOW_LOCAL_TARGETS=1" in outcome.error
    assert env.requests == [] and agent.calls == []


@async_test
async def test_a_refusal_is_not_retried_like_a_dead_service():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, policy=STRICT, connect_attempts=3, retry_pause_s=30.0)
    # three attempts with 30 s pauses would outlast the 10 s rollout timeout
    assert outcome.failure_kind == FailureKind.TARGET_REFUSED


@async_test
async def test_a_dns_name_that_resolves_to_loopback_is_refused_when_connecting(dns):
    dns["agent.rebind.test"] = ["127.0.0.1"]
    async with EnvService() as env, AgentService(reply(message())) as agent:
        url = f"http://agent.rebind.test:{port_of(agent.url)}"
        policy = TargetPolicy.from_settings(False, [f"127.0.0.1:{port_of(env.url)}"])
        outcome = await drive(url, env, policy=policy)
    assert outcome.failure_kind == FailureKind.TARGET_REFUSED
    assert "agent.rebind.test" in outcome.error and agent.calls == []


@async_test
async def test_a_name_that_passed_the_form_but_resolves_to_loopback_later_is_refused(dns):
    # DNS rebinding: public when the form looked, loopback when the worker connects
    dns["flip.test"] = ["93.184.216.34"]
    STRICT.check_url("http://flip.test:9102")
    dns["flip.test"] = ["127.0.0.1"]
    async with EnvService() as env, AgentService(reply(message())) as agent:
        url = f"http://flip.test:{port_of(agent.url)}"
        outcome = await drive(url, env, policy=TargetPolicy.from_settings(False, [f"127.0.0.1:{port_of(env.url)}"]))
    assert outcome.failure_kind == FailureKind.TARGET_REFUSED and agent.calls == []


@async_test
async def test_a_name_resolving_to_the_metadata_address_is_refused_even_with_local_targets_allowed(dns):
    dns["meta.rebind.test"] = ["169.254.169.254"]
    client = make_client(1, policy=TargetPolicy(allow_local=True))
    try:
        with pytest.raises(TargetRefused) as info:
            await client.post("http://meta.rebind.test/latest/meta-data", content=b"{}")
    finally:
        await client.aclose()
    assert "cloud-metadata address" in str(info.value)


@async_test
async def test_a_host_port_entry_lets_the_run_through_and_refuses_another_port():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        listed = [f"127.0.0.1:{port_of(agent.url)}", f"127.0.0.1:{port_of(env.url)}"]
        good = await drive(agent, env, policy=TargetPolicy.from_settings(False, listed))
        other = await drive(agent, env, policy=TargetPolicy.from_settings(False, listed[1:]))
    assert good.ok, good.error
    assert other.failure_kind == FailureKind.TARGET_REFUSED
    assert f"127.0.0.1:{port_of(agent.url)} is not in GYMWEB_ALLOWED_TARGET_HOSTS" in other.error


@async_test
async def test_a_cidr_entry_with_ports_lets_the_run_through_and_one_without_does_not_open_loopback():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        ports = [f"127.0.0.0/8:{port_of(agent.url)}", f"127.0.0.0/8:{port_of(env.url)}"]
        outcome = await drive(agent, env, policy=TargetPolicy.from_settings(False, ports))
        bare = await drive(agent, env, policy=TargetPolicy.from_settings(False, ["127.0.0.0/8"]))
    assert outcome.ok, outcome.error
    assert bare.failure_kind == FailureKind.TARGET_REFUSED and "list it as host:port" in bare.error


@async_test
async def test_allow_local_lets_a_local_run_through():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, policy=TargetPolicy(allow_local=True))
    assert outcome.ok, outcome.error


@pytest.mark.parametrize(
    "spelling", ["127.0.0.1", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]", "localhost"]
)
def test_the_sync_client_refuses_loopback_in_every_spelling_and_sends_nothing(spelling):
    from aiohttp import web

    from gymweb.examples._serve import BackgroundServer

    hits = []

    async def handler(request):
        hits.append(request.path)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    with BackgroundServer(app) as server:
        url = f"http://{spelling}:{port_of(server.url)}/aggregate_metrics"
        with make_sync_client(STRICT) as client, pytest.raises(TargetRefused) as info:
            client.post(url, content=b"{}")
        assert "loopback" in str(info.value)
        with make_sync_client(TargetPolicy(allow_local=True)) as client:
            if spelling != "[::ffff:127.0.0.1]":  # the C library cannot connect to a mapped address everywhere
                assert client.post(url, content=b"{}").status_code == 200
    assert hits == ([] if spelling == "[::ffff:127.0.0.1]" else ["/aggregate_metrics"])


def test_the_sync_client_refuses_a_name_resolving_to_loopback(dns):
    dns["env.rebind.test"] = ["127.0.0.1"]
    with make_sync_client(STRICT) as client, pytest.raises(TargetRefused) as info:
        client.get("http://env.rebind.test:9/reverify_mode")
    assert "env.rebind.test resolves to 127.0.0.1" in str(info.value)
