"""A NeMo Gym head server, read over HTTP (NeMo Gym 0.7.0's ``HeadServer``, ``nemo_gym/server_utils.py``).

``gym env start`` runs a head server (port 11000 by default) that answers:

- ``GET /global_config_dict_yaml``: a JSON string holding the merged config as YAML
  (``OmegaConf.to_yaml``), every server's ``host``/``port`` as assigned at this start;
- ``GET /server_instances``: a JSON list, one record per server process (``process_name`` is the
  config's top-level name, ``server_type``, ``url``...);
- ``GET /health``: 200 once every server is up, 503 while starting.

Ports change on every start: resolve a resources server's URL from its name each time a run
starts or is retried, never keep it. No Django here: callers pass an ``httpx.Client`` (gymweb's
target-policy client), so every request passes the target policy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from rollouts.nemo.config import AGENTS, RESOURCES_SERVERS, NemoConfig, NemoConfigError, load_texts

__all__ = [
    "DEFAULT_HEAD_URL",
    "HeadServer",
    "HeadServerError",
    "ServerInstance",
    "fetch",
    "health",
    "openapi",
    "openapi_tools",
    "same_server",
]

DEFAULT_HEAD_URL = "http://127.0.0.1:11000"
# Routes every NeMo Gym resources server serves besides its tools (SimpleResourcesServer).
NOT_TOOLS = frozenset(
    {
        "/seed_session",
        "/close_session",
        "/verify",
        "/aggregate_metrics",
        "/stats",
        "/health",
        "/healthz",
        "/livez",
        "/readyz",
        "/",
    }
)


class HeadServerError(Exception):
    """A head server that cannot be reached or read, or that does not know a name. The message
    names the head server's URL (and the name asked for)."""


@dataclass(frozen=True)
class ServerInstance:
    """One record of ``/server_instances``. ``process_name``: the config's top-level name."""

    process_name: str
    server_type: str
    name: str
    url: str

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ServerInstance:
        url = record.get("url") or (
            f"http://{record.get('host')}:{record.get('port')}" if record.get("host") and record.get("port") else ""
        )
        return cls(
            process_name=str(record.get("process_name") or record.get("config_path") or ""),
            server_type=str(record.get("server_type") or ""),
            name=str(record.get("name") or ""),
            url=str(url).rstrip("/"),
        )


@dataclass
class HeadServer:
    """What a head server answered: its ``url``, the merged ``config`` and the ``instances``."""

    url: str
    config: NemoConfig
    instances: list[ServerInstance] = field(default_factory=list)

    def instance(self, process_name: str) -> ServerInstance | None:
        return next((i for i in self.instances if i.process_name == process_name), None)

    def resources_server_url(self, name: str) -> str:
        """The current URL of the resources server whose top-level config name is ``name``.
        Raises ``HeadServerError`` naming the head server and the name when it does not know it."""
        inst = self.instance(name)
        if inst is not None and inst.server_type in ("", RESOURCES_SERVERS) and inst.url:
            return inst.url
        server = self.config.resources_servers().get(name)
        if server is not None and server.url:
            return server.url
        known = sorted(
            {i.process_name for i in self.instances if i.server_type == RESOURCES_SERVERS}
            | set(self.config.resources_servers())
        )
        raise HeadServerError(
            f"the NeMo Gym head server at {self.url} knows no resources server named {name!r} "
            f"(it runs: {', '.join(known) or 'none'})"
        )

    def agent_server_at(self, url: str) -> str | None:
        """The name of the NeMo Gym agent server (``responses_api_agents``) running at ``url``."""
        for inst in self.instances:
            if inst.server_type == AGENTS and same_server(inst.url, url):
                return inst.process_name
        for agent in self.config.agents():
            if agent.server_url and same_server(agent.server_url, url):
                return agent.name
        return None


def same_server(a: str, b: str) -> bool:
    """Whether two base URLs name the same host and port (``localhost`` and ``127.0.0.1`` alike)."""

    def key(u: str) -> tuple[str, int | None]:
        parts = urlsplit(u.strip())
        host = (parts.hostname or "").lower()
        if host in ("localhost", "::1", "0.0.0.0"):
            host = "127.0.0.1"
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            port = None
        return host, port

    return key(a) == key(b)


def _get_json(client: httpx.Client, head_url: str, route: str) -> Any:
    url = f"{head_url}{route}"
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise HeadServerError(
            f"cannot reach the NeMo Gym head server at {head_url} ({exc.__class__.__name__}: {exc}); "
            "is `gym env start` running, and on which port (NeMo Gym's default is 11000)?"
        ) from None
    if response.status_code != 200:
        raise HeadServerError(
            f"the NeMo Gym head server at {head_url} answered HTTP {response.status_code} to GET {route}"
        )
    try:
        return response.json()
    except ValueError:
        raise HeadServerError(f"{url} did not answer JSON: is {head_url} a NeMo Gym head server?") from None


def fetch(client: httpx.Client, head_url: str) -> HeadServer:
    """Read a head server's merged config and its server instances. Raises ``HeadServerError``
    naming ``head_url`` when it cannot be reached or read."""
    head_url = head_url.rstrip("/")
    text = _get_json(client, head_url, "/global_config_dict_yaml")
    if not isinstance(text, str):
        raise HeadServerError(
            f"{head_url}/global_config_dict_yaml is not a YAML string: is {head_url} a NeMo Gym head server?"
        )
    try:
        config = load_texts([(f"{head_url}/global_config_dict_yaml", text)])
    except NemoConfigError as exc:
        raise HeadServerError(str(exc)) from None
    records = _get_json(client, head_url, "/server_instances")
    if not isinstance(records, list):
        raise HeadServerError(f"{head_url}/server_instances is not a list: is {head_url} a NeMo Gym head server?")
    instances = [ServerInstance.from_json(r) for r in records if isinstance(r, dict)]
    return HeadServer(url=head_url, config=config, instances=instances)


def health(client: httpx.Client, url: str) -> tuple[bool, str]:
    """``GET {url}/health`` (every NeMo Gym server serves it): ``(ok, "ok" or why not)``."""
    try:
        response = client.get(f"{url.rstrip('/')}/health")
    except httpx.HTTPError as exc:
        return False, f"unreachable ({exc.__class__.__name__})"
    if response.status_code == 200:
        return True, "ok"
    return False, f"HTTP {response.status_code}"


def openapi_tools(client: httpx.Client, url: str) -> list[str] | None:
    """The tools a resources server serves: the POST routes of its OpenAPI document (NeMo Gym
    resources servers are FastAPI apps) other than ``/seed_session``, ``/close_session``,
    ``/verify`` and ``/aggregate_metrics``. None when the document cannot be read."""
    doc = openapi(client, url)
    if doc is None:
        return None
    paths = doc.get("paths")
    if not isinstance(paths, dict):
        return None
    return [
        p.lstrip("/")
        for p, ops in paths.items()
        if p not in NOT_TOOLS and isinstance(ops, dict) and "post" in ops and "{" not in p and p.count("/") == 1
    ]


def openapi(client: httpx.Client, url: str) -> dict[str, Any] | None:
    """``GET {url}/openapi.json`` as a dict, or None (unreachable, not 200, not a JSON object)."""
    try:
        response = client.get(f"{url.rstrip('/')}/openapi.json")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        doc = json.loads(response.content)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
