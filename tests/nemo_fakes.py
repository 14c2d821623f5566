"""Fake NeMo Gym servers on 127.0.0.1 that answer what the real ones answered (``tests/data/head_server``).

- ``FakeHeadServer``: ``GET /global_config_dict_yaml``, ``/server_instances`` and ``/health`` of a
  NeMo Gym 0.7.0 head server started with the spec's counter config, with the resources server's
  URL, the remote_agent server's URL and the ``agent_base_url`` set to the test's servers. Change
  ``env_url`` while it runs to move the resources server (as a restart does).
- ``fake_nemo_agent_server()``: NeMo Gym's own remote_agent server as gymweb sees it: an OpenAPI
  document with ``/run`` beside ``/v1/responses``, and replies whose function_calls already carry
  their function_call_output (the recorded mis-wired reply).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from aiohttp import web

from gymweb.examples._serve import BackgroundServer, json_response

DATA = Path(__file__).parent / "data" / "head_server"
ENV_NAME = "example_session_state_mgmt_resources_server"
AGENT_NAME = "remote_agent"


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


class FakeHeadServer:
    """A head server answering the recorded replies with today's URLs."""

    def __init__(
        self, env_url: str, agent_base_url: str = "http://127.0.0.1:9000", agent_server_url: str | None = None
    ):
        self.env_url = env_url
        self.agent_base_url = agent_base_url
        self.agent_server_url = agent_server_url or "http://127.0.0.1:9415"
        self.requests: list[str] = []
        self.server = BackgroundServer(self._app()).start()
        self.url = self.server.url

    def stop(self) -> None:
        self.server.stop()

    def instances(self) -> list[dict]:
        records = json.loads((DATA / "server_instances.json").read_text())
        for r in records:
            url = {ENV_NAME: self.env_url, AGENT_NAME: self.agent_server_url}.get(r["process_name"])
            if url:
                r["url"] = url
                r["host"], r["port"] = _host_port(url)
        return records

    def config_yaml(self) -> str:
        config = yaml.safe_load(json.loads((DATA / "global_config_dict_yaml.json").read_text()))
        env = config[ENV_NAME]["resources_servers"]["example_session_state_mgmt"]
        env["host"], env["port"] = _host_port(self.env_url)
        agent = config[AGENT_NAME]["responses_api_agents"]["remote_agent"]
        agent["host"], agent["port"] = _host_port(self.agent_server_url)
        agent["agent_base_url"] = self.agent_base_url
        config["head_server"] = {"host": "127.0.0.1", "port": _host_port(self.url)[1]}
        return yaml.safe_dump(config, sort_keys=False)

    def _app(self) -> web.Application:
        async def config(request):
            self.requests.append(request.path)
            return json_response(self.config_yaml())

        async def instances(request):
            self.requests.append(request.path)
            return json_response(self.instances())

        async def health(request):
            return json_response({"status": "ok"})

        app = web.Application()
        app.router.add_get("/global_config_dict_yaml", config)
        app.router.add_get("/server_instances", instances)
        app.router.add_get("/health", health)
        return app


def miswired_response() -> dict:
    """The reply NeMo Gym's remote_agent server gave: paired function_call/function_call_output
    items, then the assistant's message."""
    row = json.loads((DATA / "miswired_rollout.jsonl").read_text().splitlines()[0])
    return row["response"]


def fake_nemo_agent_server() -> BackgroundServer:
    """NeMo Gym's own remote_agent server: ``/run``, ``/v1/responses``, ``/aggregate_metrics``."""

    async def openapi(request):
        paths = {p: {"post": {}} for p in ("/v1/responses", "/run", "/aggregate_metrics", "/v1/agent_sessions")}
        return json_response({"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths})

    async def responses(request):
        return json_response(miswired_response())

    async def run(request):
        return json_response({"reward": 0.0})

    app = web.Application()
    app.router.add_get("/openapi.json", openapi)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/run", run)
    return BackgroundServer(app).start()


def self_tooled_agent() -> BackgroundServer:
    """An agent service that runs the env's tools itself (no ``/run``: only its replies show it)."""

    async def responses(request):
        return json_response(miswired_response())

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    return BackgroundServer(app).start()


def counter_tools_env(verify) -> BackgroundServer:
    """A resources server with the counter's tools: ``/seed_session`` answers ``{}``, every tool
    ``{"success": true}`` (``{"count": 3}`` for ``get_counter_value``), and ``/verify`` is the aiohttp
    handler ``verify`` (a test's verdict, or bytes it recorded)."""

    async def seed(request):
        return web.json_response({})

    async def tool(request):
        name = request.match_info["name"]
        return web.json_response({"count": 3} if name == "get_counter_value" else {"success": True})

    app = web.Application()
    app.router.add_post("/seed_session", seed)
    app.router.add_post("/verify", verify)
    app.router.add_post("/{name}", tool)
    return BackgroundServer(app)
