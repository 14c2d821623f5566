"""NeMo Gym config files, read as NeMo Gym 0.7.0 reads them (``nemo_gym/global_config.py``).

Several files merge in order, later wins (``+config_paths=[a.yaml,b.yaml]``); a file's own
``config_paths`` are pulled in before it, so the file that names them overrides them. ``${...}``
interpolations are resolved by OmegaConf, the library NeMo Gym uses. Keys gymweb does not read are
ignored, as NeMo Gym ignores keys its servers do not declare.

What gymweb takes from a config (the spec's ``counter_remote.yaml``)::

    remote_agent:                         # the agent's name (agent_ref.name in the rows)
      responses_api_agents:
        remote_agent:
          agent_base_url: http://...      # the user's agent service
          resources_server: {type: resources_servers, name: counter_env}
          concurrency: 4
          max_steps: 8
          remote_responses_timeout_secs: 1800.0
          run_timeout_secs: 2100.0
    counter_env:                          # the environment, by that name
      resources_servers:
        example_session_state_mgmt: {host: ..., port: ...}   # host/port only once NeMo Gym started it

No Django here. Errors are ``NemoConfigError`` naming the file and the key path.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

__all__ = [
    "AGENTS",
    "RESOURCES_SERVERS",
    "AgentConfig",
    "NemoConfig",
    "NemoConfigError",
    "ResourcesServerConfig",
    "load_files",
    "load_texts",
    "run_config_yaml",
]

AGENTS = "responses_api_agents"
RESOURCES_SERVERS = "resources_servers"
CONFIG_PATHS = "config_paths"
# NeMo Gym's reserved top-level keys that are never server instances (NEMO_GYM_RESERVED_TOP_LEVEL_KEYS,
# the ones a config file commonly holds); any other top-level mapping with one server type is one.
RESERVED = frozenset(
    {
        "config_paths",
        "entrypoint",
        "default_host",
        "head_server",
        "disallowed_ports",
        "head_server_deps",
        "python_version",
        "pip_install_verbose",
        "use_absolute_ip",
        "uv_pip_set_python",
        "skip_venv_if_present",
        "hf_token",
        "ray_head_node_address",
        "port_range_low",
        "port_range_high",
        "dry_run",
        "server_spinup_timeout_seconds",
        "model_endpoint_readiness_timeout_seconds",
        "allow_openai_version_skew",
        "uv_cache_dir",
        "uv_lock_timeout_seconds",
        "uv_venv_dir",
        "results_dir",
        "cache_dir",
        "_inherit_from",
        "_copy",
        "nemo_gym_log_dir",
        "verbose",
        "json",
        "query",
        "observability_enabled",
        "model_call_capture_dir",
        "component_name",
        "skip_verification",
        "skip_verification_reward",
        "allow_unsupported_pairing",
        "environment_server_name",
        "environment_server_routes",
        "environment_routing_mode",
    }
)
MISSING = "???"
# NeMo Gym registers these two as identity resolvers (its own key-swapping reads them later).
for _name in ("inherit_from", "copy"):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, lambda a, _n=_name: f"${{{_n}:{a}}}")


class NemoConfigError(ValueError):
    """A config gymweb cannot use; the message names the file (or files) and the key path."""


@dataclass(frozen=True)
class ResourcesServerConfig:
    """A resources server instance: ``name`` is its top-level key (what an agent's
    ``resources_server.name`` names), ``server`` the key under ``resources_servers`` (the server's
    directory, e.g. ``example_session_state_mgmt``). ``host``/``port``: set once NeMo Gym started it."""

    name: str
    server: str
    host: str | None = None
    port: int | None = None

    @property
    def url(self) -> str | None:
        """``http://host:port`` when both are known, else None."""
        if self.host and self.port and int(self.port) > 0:
            return f"http://{self.host}:{int(self.port)}"
        return None


@dataclass(frozen=True)
class AgentConfig:
    """An agent instance of a config: ``name`` its top-level key, ``agent_type`` the key under
    ``responses_api_agents`` (``remote_agent``). The rest as NeMo Gym's RemoteAgentConfig reads it
    (None where the file does not say); ``sources`` maps each gymweb field it fills
    (``agent_url``, ``env``, ``concurrency``, ``max_steps``, ``remote_responses_timeout_s``,
    ``run_timeout_s``) to ``"FILE: key.path"``."""

    name: str
    agent_type: str
    path: str
    agent_base_url: str | None
    resources_server: str | None
    concurrency: int | None = None
    max_steps: int | None = None
    remote_responses_timeout_s: float | None = None
    run_timeout_s: float | None = None
    sources: dict[str, str] = field(default_factory=dict)
    host: str | None = None
    port: int | None = None

    @property
    def server_url(self) -> str | None:
        """Where NeMo Gym runs this agent's own server (its remote_agent), when the config says."""
        if self.host and self.port and int(self.port) > 0:
            return f"http://{self.host}:{int(self.port)}"
        return None


def _leaf_paths(node: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                yield from _leaf_paths(value, path)
            else:
                yield path


@dataclass
class NemoConfig:
    """A merged, resolved NeMo Gym config. ``data``: the plain dict; ``files``: the sources in merge
    order; ``origin``: key path → the file that set it last (for "which field came from where")."""

    data: dict[str, Any]
    files: list[str]
    origin: dict[str, str]

    @property
    def label(self) -> str:
        return ", ".join(self.files) or "(no file)"

    def where(self, path: str) -> str:
        """``FILE: path`` for a key path (the file that set it, or every file when none did)."""
        probe = path
        while probe and probe not in self.origin:
            probe = probe.rpartition(".")[0]
        return f"{self.origin.get(probe) or self.label}: {path}"

    def _instances(self, server_type: str) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for name, value in self.data.items():
            if name in RESERVED or not isinstance(value, dict):
                continue
            inner = value.get(server_type)
            if isinstance(inner, dict) and len(inner) == 1:
                ((kind, block),) = inner.items()
                if isinstance(block, dict):
                    out.append((str(name), str(kind), block))
        return out

    def resources_servers(self) -> dict[str, ResourcesServerConfig]:
        """Every resources server instance, by its top-level name, in file order."""
        out = {}
        for name, kind, block in self._instances(RESOURCES_SERVERS):
            out[name] = ResourcesServerConfig(
                name=name, server=kind, host=_str(block.get("host")), port=_int(block.get("port"))
            )
        return out

    def agents(self) -> list[AgentConfig]:
        """Every agent instance (``responses_api_agents``), in file order."""
        out = []
        for name, kind, block in self._instances(AGENTS):
            path = f"{name}.{AGENTS}.{kind}"
            sources = {}

            def take(key: str, field_name: str, cast: Any) -> Any:
                value = block.get(key)
                if value is None or value == MISSING:
                    return None
                try:
                    result = cast(value)
                except (TypeError, ValueError):
                    raise NemoConfigError(
                        f"{self.where(f'{path}.{key}')} must be a {cast.__name__}, not {value!r}"
                    ) from None
                sources[field_name] = self.where(f"{path}.{key}")
                return result

            url = take("agent_base_url", "agent_url", str)
            reference = block.get("resources_server")
            env = None
            if isinstance(reference, dict) and reference.get("name") not in (None, MISSING):
                env = str(reference["name"])
                sources["env"] = self.where(f"{path}.resources_server.name")
            out.append(
                AgentConfig(
                    name=name,
                    agent_type=kind,
                    path=path,
                    agent_base_url=url,
                    resources_server=env,
                    concurrency=take("concurrency", "concurrency", int),
                    max_steps=take("max_steps", "max_steps", int),
                    remote_responses_timeout_s=take(
                        "remote_responses_timeout_secs", "remote_responses_timeout_s", float
                    ),
                    run_timeout_s=take("run_timeout_secs", "run_timeout_s", float),
                    sources=sources,
                    host=_str(block.get("host")),
                    port=_int(block.get("port")),
                )
            )
        return out

    def agent(self, name: str | None = None) -> AgentConfig:
        """The agent named ``name`` (its top-level key); without a name, the single agent block
        that has an ``agent_base_url``. Raises ``NemoConfigError`` naming the files and the agents
        there are."""
        agents = self.agents()
        if name:
            for agent in agents:
                if agent.name == name:
                    return agent
            known = ", ".join(a.name for a in agents) or "none"
            raise NemoConfigError(
                f"{self.label}: no agent named {name!r} (a top-level key with a {AGENTS} block); agents there: {known}"
            )
        usable = [a for a in agents if a.agent_base_url]
        if len(usable) == 1:
            return usable[0]
        if not usable:
            raise NemoConfigError(
                f"{self.label}: names no usable agent: no top-level block has {AGENTS}.<type>.agent_base_url "
                "(the URL of your agent service)"
            )
        raise NemoConfigError(
            f"{self.label}: several agents have an agent_base_url ({', '.join(a.name for a in usable)}); "
            "choose one with --agent-name"
        )

    def environment(self, agent: AgentConfig) -> ResourcesServerConfig:
        """The resources server the agent's ``resources_server`` reference names. Raises
        ``NemoConfigError`` naming the file and the key path when there is none or it is unknown."""
        key = f"{agent.path}.resources_server.name"
        if not agent.resources_server:
            raise NemoConfigError(f"{self.where(key)} is not set: the agent {agent.name!r} names no resources server")
        servers = self.resources_servers()
        if agent.resources_server not in servers:
            known = ", ".join(servers) or "none"
            raise NemoConfigError(
                f"{self.where(key)} names {agent.resources_server!r}, which is not a resources server in "
                f"{self.label} (resources servers there: {known})"
            )
        return servers[agent.resources_server]

    def head_server_url(self) -> str | None:
        """The ``head_server`` block's ``http://host:port`` when it sets both."""
        block = self.data.get("head_server")
        if isinstance(block, dict) and block.get("host") and _int(block.get("port")):
            return f"http://{block['host']}:{_int(block['port'])}"
        return None


def _str(value: Any) -> str | None:
    return None if value in (None, "", MISSING) else str(value)


def _int(value: Any) -> int | None:
    try:
        return None if value in (None, "", MISSING) else int(value)
    except (TypeError, ValueError):
        return None


def _parse(text: str, source: str) -> DictConfig:
    try:
        loaded = OmegaConf.create(yaml.safe_load(text) if text.strip() else {})
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise NemoConfigError(f"{source}{where}: not valid YAML: {problem}") from None
    except (OmegaConfBaseException, ValueError) as exc:
        raise NemoConfigError(f"{source}: cannot be read as a config: {exc}") from None
    if not isinstance(loaded, DictConfig):
        raise NemoConfigError(
            f"{source}: a NeMo Gym config is a mapping at the top level, not a {type(loaded).__name__}"
        )
    return loaded


def _merge(parts: Sequence[tuple[str, DictConfig]]) -> NemoConfig:
    origin: dict[str, str] = {}
    for source, part in parts:
        for path in _leaf_paths(OmegaConf.to_container(part, resolve=False)):
            origin[path] = source
    merged = OmegaConf.merge(*(p for _, p in parts)) if parts else OmegaConf.create({})
    try:
        data = OmegaConf.to_container(merged, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        source = origin.get(str(key), ", ".join(s for s, _ in parts))
        raise NemoConfigError(f"{source}: {key}: cannot resolve {getattr(exc, 'msg', exc)}") from None
    return NemoConfig(data=copy.deepcopy(data), files=[s for s, _ in parts], origin=origin)


def load_texts(texts: Sequence[tuple[str, str]]) -> NemoConfig:
    """Merge configs given as ``(source name, YAML text)`` in order (later wins). Their own
    ``config_paths`` are not followed (a head server's config lists the files it already merged)."""
    return _merge([(source, _parse(text, source)) for source, text in texts])


def load_files(paths: Sequence[str | Path]) -> NemoConfig:
    """Merge config files as ``+config_paths=[...]`` does: in order, later wins, each file's own
    ``config_paths`` pulled in before it (relative to that file's folder, else the working folder).
    Raises ``NemoConfigError`` for a missing or unreadable file, bad YAML (file, line, column) or an
    interpolation that cannot be resolved."""
    ordered: list[tuple[str, DictConfig]] = []
    seen: set[Path] = set()

    def visit(path: Path, named_as: str, named_in: str | None) -> None:
        resolved = path.expanduser().resolve()
        if resolved in seen:
            return
        seen.add(resolved)
        try:
            text = resolved.read_text(encoding="utf-8")
        except FileNotFoundError:
            where = f"{named_in}: config_paths entry " if named_in else ""
            raise NemoConfigError(f"{where}{named_as}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise NemoConfigError(f"{named_as}: cannot be read ({exc})") from None
        part = _parse(text, str(path))
        includes = part.get(CONFIG_PATHS) if CONFIG_PATHS in part else None
        for entry in list(includes or []):
            entry_path = Path(str(entry))
            candidates = (
                [entry_path] if entry_path.is_absolute() else [resolved.parent / entry_path, Path.cwd() / entry_path]
            )
            found = next((c for c in candidates if c.exists()), candidates[0])
            visit(found, str(entry), str(path))
        ordered.append((str(path), part))

    for raw in paths:
        visit(Path(raw), str(raw), None)
    return _merge(ordered)


def run_config_yaml(
    *,
    agent_name: str,
    agent_url: str,
    env_name: str,
    env_server: str | None,
    concurrency: int,
    max_steps: int | None,
    remote_responses_timeout_s: float,
    run_timeout_s: float,
    num_repeats: int = 1,
    header: str = "",
) -> str:
    """A run's settings as a NeMo Gym config that ``gym env start "+config_paths=[FILE]"`` and
    ``gym eval run --no-serve +agent_name=AGENT`` accept: the resources server block (``env_server``
    is its directory name under ``resources_servers``; None writes NeMo Gym's ``???``, which NeMo Gym
    refuses until it is filled in) and the remote_agent block with the run's knobs. ``header``:
    comment lines put first."""
    config = {
        env_name: {RESOURCES_SERVERS: {env_server or MISSING: {"entrypoint": "app.py", "domain": "agent"}}},
        agent_name: {
            AGENTS: {
                "remote_agent": {
                    "entrypoint": "app.py",
                    "agent_base_url": agent_url,
                    "resources_server": {"type": RESOURCES_SERVERS, "name": env_name},
                    "concurrency": int(concurrency),
                    "max_steps": int(max_steps) if max_steps else None,
                    "remote_responses_timeout_secs": float(remote_responses_timeout_s),
                    "run_timeout_secs": float(run_timeout_s),
                }
            }
        },
    }
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
