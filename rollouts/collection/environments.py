"""NeMo Gym environments for runs: configs and head servers resolved into a run's agent and env
(``collect --config/--head-url/--agent-name``, the new-run form), the env URL resolved again on
retry, the mis-wiring check, registered head servers and the Environments page's listing.

The NeMo Gym logic itself is in ``rollouts.nemo`` (no Django); this module adds the settings, the
target policy (every request goes through ``rollouts.targets``' client) and the database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Max, QuerySet
from django.utils import timezone

from rollouts import targets
from rollouts.engine.loop import InvalidBaseURL, validate_base_url
from rollouts.models import HeadServer as HeadServerRecord
from rollouts.models import Run
from rollouts.nemo import head_server, miswiring
from rollouts.nemo.config import NemoConfig, NemoConfigError, run_config_yaml
from rollouts.nemo.head_server import DEFAULT_HEAD_URL, HeadServer, HeadServerError

__all__ = [
    "NemoConfigError",
    "HeadServerError",
    "Resolved",
    "default_head_url",
    "fetch_head",
    "known_environments",
    "miswiring_problem",
    "name_the_meant_url",
    "refresh_env_url",
    "register_head",
    "resolve",
    "run_config",
]

HEAD_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0
# a FastAPI app builds its OpenAPI document on the first request: seconds on a loaded machine
OPENAPI_TIMEOUT_S = 15.0


def client(timeout_s: float = HEAD_TIMEOUT_S) -> httpx.Client:
    """A client with this instance's target policy and reply cap."""
    return targets.sync_client(timeout_s)


def default_head_url(config: NemoConfig | None = None) -> str:
    """The head server to use when none is named: the config's ``head_server`` block, else
    ``GYMWEB_NEMO_GYM_HEAD_URL``, else NeMo Gym's default ``http://127.0.0.1:11000``."""
    return (config.head_server_url() if config else None) or settings.GYMWEB_NEMO_GYM_HEAD_URL or DEFAULT_HEAD_URL


def fetch_head(url: str, timeout_s: float = HEAD_TIMEOUT_S) -> HeadServer:
    """Read the head server at ``url`` (``rollouts.nemo.head_server.fetch``) through the target
    policy. Raises ``HeadServerError`` naming the URL (bad URL, refused host, unreachable, not a
    head server)."""
    try:
        url = validate_base_url(url, "head server URL")
    except InvalidBaseURL as exc:
        raise HeadServerError(str(exc)) from None
    try:
        targets.check_url(url)
    except targets.TargetRefused as exc:
        raise HeadServerError(
            f"the head server {url} is refused by this instance's target policy ({exc.reason}); for a local "
            "set-up set GYMWEB_ALLOW_LOCAL_TARGETS=1, or list it in GYMWEB_ALLOWED_TARGET_HOSTS"
        ) from None
    with client(timeout_s) as c:
        head = head_server.fetch(c, url)
    HeadServerRecord.objects.filter(url=head.url).update(last_seen=timezone.now())
    return head


@dataclass
class Resolved:
    """A run's services and knobs from a NeMo Gym config and/or head server. ``options``: only the
    knobs the config sets (``concurrency``, ``max_steps``, ``remote_responses_timeout_s``,
    ``run_timeout_s``); ``sources``: field → where its value came from (``"FILE: key.path"``)."""

    agent_name: str
    agent_url: str | None
    env_name: str
    env_url: str
    head_url: str | None
    options: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def resolve(
    config: NemoConfig | None,
    *,
    head_url: str | None = None,
    agent_name: str | None = None,
    env_name: str | None = None,
) -> Resolved:
    """The agent (``agent_name`` or the single one with an ``agent_base_url``) and its environment.

    Without ``config``, the head server's own config is read (``head_url``, else
    ``default_head_url``). The env URL comes from the head server's ``/server_instances`` whenever
    a head server is named (or the config gives the env no host/port), else from the config's
    ``host``/``port``. ``env_name`` picks another resources server of the config than the
    agent's. Raises ``NemoConfigError`` (file and key path) or ``HeadServerError`` (head server URL
    and the name)."""
    head: HeadServer | None = None
    if config is None:
        head = fetch_head(head_url or default_head_url())
        config = head.config
    agent = config.agent(agent_name)
    sources = dict(agent.sources)
    if env_name and env_name != agent.resources_server:
        servers = config.resources_servers()
        if env_name not in servers:
            raise NemoConfigError(
                f"{config.label}: no resources server named {env_name!r} (there: {', '.join(servers) or 'none'})"
            )
        env = servers[env_name]
        sources["env"] = "the environment chosen"
    else:
        env = config.environment(agent)
    if head is None and (head_url or not env.url):
        head = fetch_head(head_url or default_head_url(config))
    if head is not None:
        env_url = head.resources_server_url(env.name)
        sources["env_url"] = f"head server {head.url}: {env.name}"
    else:
        env_url = env.url or ""
        sources["env_url"] = config.where(f"{env.name}.resources_servers.{env.server}.port")
    options = {
        k: getattr(agent, k)
        for k in ("concurrency", "max_steps", "remote_responses_timeout_s", "run_timeout_s")
        if getattr(agent, k) is not None
    }
    return Resolved(
        agent_name=agent.name,
        agent_url=agent.agent_base_url,
        env_name=env.name,
        env_url=env_url,
        head_url=head.url if head else None,
        options=options,
        sources=sources,
    )


def refresh_env_url(run: Run) -> str | None:
    """Resolve a head-server run's env URL again (its resources server may have moved port) and
    store it. Returns the URL, or None for a run whose env URL was given directly. Raises
    ``HeadServerError``."""
    if not (run.head_url and run.env_name):
        return None
    url = fetch_head(run.head_url).resources_server_url(run.env_name)
    if url != run.env_url:
        run.env_url = url
        run.save(update_fields=["env_url"])
    return url


def register_head(url: str, config_files: list[str] | None = None) -> HeadServerRecord:
    """Remember a head server (for ``env list``, the Environments page and the form)."""
    record, _ = HeadServerRecord.objects.get_or_create(url=url.rstrip("/"))
    if config_files is not None:
        record.config_files = "\n".join(config_files)
    record.last_seen = timezone.now()
    record.save()
    return record


def _candidate_heads(agent_url: str, head_url: str | None) -> list[str]:
    if head_url:
        return [head_url]
    out = [settings.GYMWEB_NEMO_GYM_HEAD_URL]
    out += list(HeadServerRecord.objects.values_list("url", flat=True)[:10])
    host = urlsplit(agent_url).hostname
    if host:
        out.append(f"http://{'[' + host + ']' if ':' in host else host}:11000")
    return [u for u in dict.fromkeys(out) if u]


# Agent URLs found not to be NeMo Gym agent servers: {url: monotonic time}. A training loop
# launches a batch every few seconds against the same agent; probing it each time (a new client
# and a request) was a large part of the launch.
_PLAIN_AGENT_TTL_S = 60.0
_plain_agents: dict[str, float] = {}


def miswiring_problem(agent_url: str, head_url: str | None = None) -> str | None:
    """When ``agent_url`` is a NeMo Gym agent server (it serves ``/run``), the explanation naming
    the URL the user most likely meant (the agent's ``agent_base_url`` in the head server's config;
    the head servers tried: ``head_url``, else the setting, the registered ones and port 11000 of
    the agent's host). None when it is not one, or cannot be asked; that answer is kept for
    ``_PLAIN_AGENT_TTL_S`` seconds per URL (in this process)."""
    now = time.monotonic()
    if now - _plain_agents.get(agent_url, -_PLAIN_AGENT_TTL_S) < _PLAIN_AGENT_TTL_S:
        return None
    with client(OPENAPI_TIMEOUT_S) as c:
        doc = head_server.openapi(c, agent_url)
    if not miswiring.is_nemo_gym_agent_server(doc):
        if len(_plain_agents) > 1000:
            _plain_agents.clear()
        _plain_agents[agent_url] = now
        return None
    for url in _candidate_heads(agent_url, head_url):
        try:
            head = fetch_head(url, PROBE_TIMEOUT_S)
        except HeadServerError:
            continue
        name = head.agent_server_at(agent_url)
        if name is None:
            continue
        try:
            likely = head.config.agent(name).agent_base_url
        except NemoConfigError:
            likely = None
        return miswiring.explain(agent_url, agent_name=name, likely_url=likely, head_url=head.url)
    return miswiring.explain(agent_url)


def name_the_meant_url(report: Any, url: str, head_url: str | None = None) -> None:
    """When an agent check (``conformance.Report``) found NeMo Gym's own agent server, replace its
    advice with ``miswiring_problem``'s explanation naming the URL the user most likely meant."""
    found = [f for f in report.findings if f.code == miswiring.FAILURE_CODE]
    if not found:
        return
    try:
        explained = miswiring_problem(url, head_url)
    except DatabaseError:  # check_agent needs no database; the registered head servers are a bonus
        explained = None
    if explained:
        found[0].how_to_fix = explained


@dataclass
class Environment:
    """One environment for the Environments page / ``env list``: a resources server of a head
    server (``head_url``, ``name``) or an env URL past runs used (``name`` empty)."""

    url: str
    name: str = ""
    server: str = ""
    head_url: str = ""
    healthy: bool | None = None
    health: str = ""
    tools: list[str] | None = None
    runs: list[Run] = field(default_factory=list)
    num_runs: int = 0


@dataclass
class HeadListing:
    """A registered head server as read now: its environments and agents, or ``error``."""

    url: str
    environments: list[Environment] = field(default_factory=list)
    agents: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


def _probe(c: httpx.Client, env: Environment, with_tools: bool) -> None:
    env.healthy, env.health = head_server.health(c, env.url)
    if with_tools and env.healthy:
        with client(OPENAPI_TIMEOUT_S) as slow:
            env.tools = head_server.openapi_tools(slow, env.url)


def head_listing(url: str, with_tools: bool = True) -> HeadListing:
    """A head server's resources servers (URL, health, tools) and agents, read now."""
    listing = HeadListing(url=url)
    try:
        head = fetch_head(url, PROBE_TIMEOUT_S)
    except HeadServerError as exc:
        listing.error = str(exc)
        return listing
    with client(PROBE_TIMEOUT_S) as c:
        for name, server in head.config.resources_servers().items():
            try:
                env_url = head.resources_server_url(name)
            except HeadServerError:
                env_url = ""
            env = Environment(url=env_url, name=name, server=server.server, head_url=head.url)
            if env_url:
                _probe(c, env, with_tools)
            listing.environments.append(env)
    for agent in head.config.agents():
        listing.agents.append(
            {
                "name": agent.name,
                "agent_base_url": agent.agent_base_url or "",
                "resources_server": agent.resources_server or "",
                "server_url": agent.server_url or "",
            }
        )
    return listing


def known_environments(
    with_tools: bool = True, max_urls: int = 50, runs: QuerySet[Run] | None = None
) -> tuple[list[HeadListing], list[Environment]]:
    """Every environment gymweb knows: the registered head servers (read now) and the env URLs of
    past runs (the ``max_urls`` most recent), each with health, tools and the runs that used it.

    ``runs`` is the runs to read past envs from (a page passes the user's visible runs, so another
    team's env URLs and run names stay hidden); default every run not still being written."""
    heads = [head_listing(r.url, with_tools) for r in HeadServerRecord.objects.all()]
    ready = Run.objects.filter(writing_until__isnull=True) if runs is None else runs
    used = (
        ready.exclude(env_url="")
        .values("env_url")
        .annotate(n=Count("id"), last=Max("created"))
        .order_by("-last")[:max_urls]
    )
    past: list[Environment] = []
    with client(PROBE_TIMEOUT_S) as c:
        for row in used:
            env = Environment(url=row["env_url"], num_runs=row["n"])
            env.runs = list(ready.filter(env_url=row["env_url"]).only("id", "name", "created", "status")[:5])
            try:
                targets.check_url(env.url, resolve_names=False)
            except targets.TargetRefused as exc:
                env.healthy, env.health = False, f"refused by the target policy ({exc.reason})"
            else:
                _probe(c, env, with_tools)
            past.append(env)
    by_url = {e.url: e for e in past}
    for listing in heads:
        for env in listing.environments:
            match = by_url.get(env.url)
            if match is not None:
                env.runs, env.num_runs = match.runs, match.num_runs
            named = ready.filter(head_url=listing.url, env_name=env.name)
            if named.exists():
                env.num_runs = max(env.num_runs, named.count())
                env.runs = env.runs or list(named.only("id", "name", "created", "status")[:5])
    return heads, past


def run_config(run: Run) -> str:
    """``run``'s settings as a NeMo Gym config (``rollouts.nemo.config.run_config_yaml``), headed by
    the two commands that repeat the run with NeMo Gym itself. The resources server's directory
    name is read from the run's head server when it answers, else left as NeMo Gym's ``???``."""
    env_name, env_server = run.env_name or "gymweb_environment", None
    if run.head_url and run.env_name:
        try:
            server = fetch_head(run.head_url, PROBE_TIMEOUT_S).config.resources_servers().get(run.env_name)
            env_server = server.server if server else None
        except HeadServerError:
            env_server = None
    agent = run.agent_name or "remote_agent"
    header = "\n".join(
        [
            f"gymweb run #{run.pk} ({run.name}) as a NeMo Gym config, to repeat it with NeMo Gym itself:",
            '  gym env start "+config_paths=[THIS_FILE.yaml]"',
            f"  gym eval run --no-serve +agent_name={agent} +input_jsonl_fpath=TASKS.jsonl "
            f"+output_jsonl_fpath=results/rollouts.jsonl +num_repeats={run.num_repeats}",
            f"The run's environment was {run.env_url}"
            + (f" ({run.env_name} of the head server {run.head_url})." if run.head_url else "."),
            *(
                []
                if env_server
                else ["Replace ??? with the name of that resources server (e.g. example_session_state_mgmt)."]
            ),
        ]
    )
    return run_config_yaml(
        agent_name=agent,
        agent_url=run.agent_url,
        env_name=env_name,
        env_server=env_server,
        concurrency=run.concurrency,
        max_steps=run.max_steps,
        remote_responses_timeout_s=run.remote_responses_timeout_s,
        run_timeout_s=run.run_timeout_s,
        num_repeats=run.num_repeats,
        header=header,
    )
