"""Replies are capped (``GYMWEB_MAX_REPLY_BYTES``): a reply of the agent or the env is
counted as it streams and never read past the cap; over it the rollout fails with its own failure
kind ``reply_too_large`` naming the cap and the setting. Servers on 127.0.0.1 stream without end, so
a client that kept reading would never finish; the cap is set small here."""

from __future__ import annotations

import contextlib
import json

import pytest
from aiohttp import web

from rollouts.engine.failures import FailureKind
from tests.servers import LOCAL, AgentService, EnvService, Reply, async_test, call, drive, message, reply

CAP = 64 * 1024
CHUNK = b"x" * 16384
ENDLESS = 200 * 1024 * 1024  # the servers give up after this much (a client that reads on would get it all)


class Streamer:
    """An aiohttp server whose ``path`` answers 200 with a chunked body that goes on until the
    client stops reading (or ``ENDLESS`` bytes); ``written`` counts what it managed to send.
    Other paths answer like the counter env (``{}`` and ``reward: 1``)."""

    def __init__(self, path: str, declared_length: bool = False):
        self.path = path
        self.declared_length = declared_length
        self.written = 0
        self.hits: list[str] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.hits.append(request.path)
        if request.path != self.path:
            return web.json_response({"reward": 1.0} if request.path == "/verify" else {})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.declared_length:
            response.content_length = ENDLESS
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write(b'{"output": "')
            while self.written < ENDLESS:
                await response.write(CHUNK)
                self.written += len(CHUNK)
        return response

    async def __aenter__(self) -> Streamer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


def assert_capped(outcome, who: str) -> None:
    assert outcome.failure_kind == FailureKind.REPLY_TOO_LARGE, (outcome.failure_kind, outcome.error)
    assert f"{who} at" in outcome.error
    assert f"larger than {CAP:,} bytes (GYMWEB_MAX_REPLY_BYTES)" in outcome.error
    assert not outcome.terminal


@async_test
async def test_an_agent_streaming_past_the_cap_fails_the_rollout_as_reply_too_large_and_is_not_read_on():
    async with EnvService() as env, Streamer("/v1/responses") as agent:
        outcome = await drive(agent.url, env, max_reply_bytes=CAP)
    assert_capped(outcome, "the agent service")
    assert agent.hits.count("/v1/responses") == 1  # not retried like a dropped connection
    assert agent.written < ENDLESS // 4  # the client stopped reading; the server could not write on


@async_test
async def test_an_agent_declaring_a_length_over_the_cap_is_refused_before_its_body_is_read():
    async with EnvService() as env, Streamer("/v1/responses", declared_length=True) as agent:
        outcome = await drive(agent.url, env, max_reply_bytes=CAP)
    assert_capped(outcome, "the agent service")


@async_test
async def test_a_tool_output_past_the_cap_fails_the_rollout_as_reply_too_large():
    script = [reply(call("big_tool", {"n": 1}, call_id="c1")), reply(message())]
    async with Streamer("/big_tool") as env, AgentService(*script) as agent:
        outcome = await drive(agent, env.url, max_reply_bytes=CAP)
    assert_capped(outcome, "the environment")
    assert outcome.error.startswith("tool call 'big_tool' failed:")
    assert len(agent.calls) == 1  # the huge output never went to the agent


@pytest.mark.parametrize("route, step", [("/seed_session", "seed_session failed"), ("/verify", "verify failed")])
@async_test
async def test_a_seed_or_verify_reply_past_the_cap_fails_the_rollout_as_reply_too_large(route, step):
    async with Streamer(route) as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env.url, max_reply_bytes=CAP)
    assert_capped(outcome, "the environment")
    assert outcome.error.startswith(step)


@async_test
async def test_a_reply_at_the_cap_is_read_whole():
    text = "y" * CAP  # exactly the cap
    async with (
        # a small verify reply of NeMo Gym's shape: an echo would carry the text and pass the cap
        EnvService(
            {"t": Reply(text=text)},
            verify={"responses_create_params": {"input": []}, "response": reply(message()), "reward": 1.0},
        ) as env,
        AgentService(reply(call("t", {}, call_id="c1")), reply(message())) as agent,
    ):
        outcome = await drive(agent, env, max_reply_bytes=CAP)
    assert outcome.ok, outcome.error
    assert outcome.response["output"][1]["output"] == text


def test_a_worker_run_fails_with_reply_too_large_under_the_setting(settings, transactional_db, counter_env_url):
    """The dispatcher's client takes ``GYMWEB_MAX_REPLY_BYTES`` (the path of workers and ``collect``)."""
    from gymweb.examples._serve import BackgroundServer
    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl
    from rollouts.models import Rollout, Run
    from rollouts.workers.process import run_in_process

    settings.GYMWEB_MAX_REPLY_BYTES = CAP

    async def huge(request):
        await request.read()
        return web.Response(body=b'{"output": "' + b"z" * (CAP * 4) + b'"}', content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/responses", huge)
    with BackgroundServer(app) as agent:
        parsed = read_jsonl([json.dumps({"responses_create_params": {"input": "hi"}})], source="t.jsonl")
        run = runs.create_run(parsed, name="capped", agent_url=agent.url, env_url=counter_env_url, max_attempts=1)
        runs.launch(run)
        run_in_process(run.pk)
    (rollout,) = Rollout.objects.filter(run=run)
    assert rollout.status == Rollout.Status.FAILED and rollout.failure_kind == "reply_too_large"
    assert f"larger than {CAP:,} bytes (GYMWEB_MAX_REPLY_BYTES)" in rollout.error
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED


@async_test
async def test_the_agent_check_reports_a_reply_past_the_cap():
    from rollouts.evaluation.conformance import check_agent

    async with Streamer("/v1/responses") as agent:
        report = await check_agent(agent.url, policy=LOCAL, max_reply_bytes=CAP, timeout_s=10)
    assert "reply_too_large" in report.codes("error")


def test_the_envs_aggregate_metrics_reply_is_capped_too():
    from gymweb.examples._serve import BackgroundServer
    from rollouts.evaluation.aggregate_metrics import EnvAggregateError, post_aggregate_metrics

    async def huge(request):
        await request.read()
        return web.Response(body=b"[" + b"0," * CAP + b"0]", content_type="application/json")

    app = web.Application()
    app.router.add_post("/aggregate_metrics", huge)
    with BackgroundServer(app) as env, pytest.raises(EnvAggregateError) as info:
        post_aggregate_metrics(env.url, [], policy=LOCAL, max_reply_bytes=CAP, timeout_s=10)
    assert "GYMWEB_MAX_REPLY_BYTES" in str(info.value)
