"""Every ``GYMWEB_*`` setting, read once from the environment, typed, with its default and what it does.

``gymweb.settings`` (Django's settings) reads :func:`load` and exposes each field ``x`` as
``settings.GYMWEB_X``; nothing else reads ``GYMWEB_*`` variables. ``gymweb settings`` prints them
with their values (secrets masked) and where each came from; ``docs/settings.md`` holds the table
made by :func:`markdown_table` (a test fails when they differ); an unknown ``GYMWEB_*`` variable
is a system-check warning (``gymweb.W010``, :func:`unknown_variables`).

Adding a setting is one line in :class:`GymwebSettings`, ``name: type = S(default, "what it does")``,
then ``gymweb settings --markdown`` to refresh the table (docs/settings.md, "Adding a setting").

Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off``; lists are comma-separated; an
empty variable counts as unset. A bad value stops start-up with the variable's name and why
(:class:`SettingsError`).
"""

from __future__ import annotations

import difflib
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, BeforeValidator, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "GYMWEB_"


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_list)]


def default_data_dir() -> Path:
    """The per-user data folder: ``$XDG_DATA_HOME/gymweb``, else ``~/.local/share/gymweb``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gymweb"


def S(default: Any = None, description: str = "", *, shown: str | None = None) -> Any:
    """One setting's field: its ``default``, a one-line ``description``, and ``shown``, the default
    as the docs print it when the value is derived from other settings or the machine."""
    return Field(default, description=description, json_schema_extra={"shown": shown} if shown is not None else None)


MIB = 1024 * 1024


class GymwebSettings(BaseSettings):
    """gymweb's settings, one field per ``GYMWEB_<FIELD NAME>`` environment variable."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", case_sensitive=False)

    # -- where state lives
    data_dir: Path = Field(
        default_factory=default_data_dir,
        validation_alias=AliasChoices("GYMWEB_DATA_DIR", "GYMWEB_VAR_DIR"),
        description="where gymweb keeps its state: the SQLite database, collected static files, the demo's key and password (GYMWEB_VAR_DIR is read too, as an older name)",
        json_schema_extra={"shown": "`~/.local/share/gymweb` (`$XDG_DATA_HOME/gymweb`)"},
    )
    sqlite_path: str = S(
        "", "the SQLite database file when DATABASE_URL is not set", shown="`<data dir>/gymweb.sqlite3`"
    )
    test_sqlite_path: str = S(
        "", "the test suite's SQLite database file", shown="`<data dir>/test_gymweb_<pid>.sqlite3`"
    )
    static_root: str = S(
        "", "where `collectstatic` writes and WhiteNoise serves from", shown="`<data dir>/staticfiles`"
    )
    # -- the web server
    secret_key: SecretStr = S(
        SecretStr(""), "signs sessions and CSRF tokens; required with DEBUG off (empty: a built-in development key)"
    )
    debug: bool = S(False, "Django's DEBUG (never on a shared server)")
    allowed_hosts: CommaList = S(["127.0.0.1", "localhost", "testserver"], "host names the site answers to")
    csrf_trusted_origins: CommaList = S(
        [], "origins (`https://host[:port]`) whose form posts are accepted when the proxy changes the Host"
    )
    secure_proxy_ssl_header: str = S(
        "",
        "the header a TLS-terminating proxy sets to `https` (e.g. `X-Forwarded-Proto`); only if the proxy always sets or strips it",
    )
    ssl_redirect: bool = S(False, "redirect http to https (the probes and /metrics are exempt)")
    secure_cookies: bool = S(False, "session and CSRF cookies only over https")
    hsts_seconds: int = S(0, "Strict-Transport-Security max-age")
    hsts_include_subdomains: bool = S(False, "the HSTS `includeSubDomains` flag")
    hsts_preload: bool = S(False, "the HSTS `preload` flag")
    signin_failure_limit: int = S(
        10, "wrong passwords for one user name from one address before sign-in is locked (429)"
    )
    signin_address_failure_limit: int = S(
        30,
        "failed sign-ins from one client address, over any user names, within the lockout minutes before that address is refused (429) whatever the user name (0: no per-address limit)",
    )
    trusted_proxies: int = S(
        0,
        "how many proxies (nginx, a load balancer) stand in front of gymweb and append to X-Forwarded-For: the sign-in lockout then keys on the client's address they report (0: the connection's own address; never more than there are, or clients can pick their address)",
    )
    api_bad_tokens_per_minute: int = S(
        30, "wrong API tokens one client address may send in a minute; past it the API answers 429 with Retry-After"
    )
    signin_lockout_minutes: float = S(15, "how long a locked sign-in stays locked; `gymweb axes_reset` unlocks at once")
    max_upload_bytes: int = S(200 * MIB, "one uploaded file (new-run dataset, import)")
    max_request_bytes: int | None = S(
        None, "one request: larger ones get 413 before their body is read", shown="2 × upload + 10 MiB"
    )
    max_line_bytes: int = S(64 * MIB, "one line of a JSONL file (upload, import, `collect --input`)")
    max_tasks_per_user: int = S(
        2,
        "background tasks (dataset uploads, imports, agent checks, reverify, health checks) one user may have queued or running at once",
    )
    tasks_inline: bool = S(
        False,
        "run background tasks inside the web request instead of on a worker (tests; a single process without `qcluster`)",
    )
    cache_url: str = S(
        "",
        "a Redis database for Django's cache shared by every web process (empty: each process keeps its own, in memory)",
    )
    live_cache_s: float = S(
        2,
        "while a run is running: how long its page's aggregates and rollout table are shared by everyone watching (0: recompute every poll)",
    )
    live_analysis_cache_s: float = S(15, "the same for a running run's profile page and charts")
    summary_cache_s: float = S(600, "how long a final run's aggregates stay cached (keyed by its counts, never stale)")
    display_max_chars: int = S(20_000, "characters of one item the trajectory page shows at first")
    display_max_items_per_step: int = S(500, "items of one step the trajectory page shows at first")
    reverify_web_max_rows: int = S(
        2000, "largest run the run page reverifies (as a background task; larger: `gymweb reverify`)"
    )
    default_agent_url: str = S("", "pre-filled agent URL on the new-run form and the agent check")
    default_env_url: str = S("", "pre-filled env URL on the new-run form")
    # -- NeMo Gym environments
    nemo_gym_head_url: str = S(
        "",
        "the NeMo Gym head server `collect --config`, the new-run form and `env list` use when none is named (empty: the config's head_server block, else http://127.0.0.1:11000)",
    )
    nemo_gym_bin: str = S("", "NeMo Gym's `gym` executable for `env start` (empty: `gym` on PATH)")
    # -- which hosts a run may reach
    allowed_target_hosts: CommaList = S(
        [], "when not empty, only these targets (`host`, `host:port`, IP, CIDR, with or without a port) may be reached"
    )
    allow_local_targets: bool = S(False, "loopback and private addresses may be reached (a local single-user set-up)")
    max_reply_bytes: int = S(64 * MIB, "the largest reply read from an agent or an env (over it: `reply_too_large`)")
    reply_budget_bytes: int = S(
        512 * MIB,
        "the bytes all replies being read at once in one worker may hold together (0: unbounded; over it: `reply_over_budget`, not terminal)",
    )
    failed_reply_max_bytes: int = S(
        1 * MIB, "how much of an agent reply gymweb refused is kept for the rollout page and the API"
    )
    # -- workers and collection
    redis_url: str = S("", "django-q2's Redis broker (empty: the database is the broker)")
    q_name: str = S("gymweb", "django-q2's cluster name (workers sharing a broker share it)")
    q_workers: int = S(2, "worker processes per `gymweb worker`")
    q_log_level: str = S("WARNING", "django-q2's own log level")
    lease_s: float = S(
        30, "a claimed rollout's lease: not renewed for this long, its worker counts as dead and the key runs again"
    )
    heartbeat_s: float = S(2, "how often a worker renews its leases and its heartbeat")
    poll_s: float = S(0.5, "how often a worker looks for new work")
    wake_poll_s: float = S(
        0.01,
        "on SQLite, how often an idle worker (and an open results stream) reads the database's change counter to start a launched run (send a new result) at once (0: polls only; PostgreSQL notifies)",
    )
    auto_retry: bool = S(
        True,
        "runs made in the web and the API retry their non-terminal failures by themselves (up to max attempts) before they complete",
    )
    auto_retry_delay_s: float = S(
        5.0,
        "the wait before the first automatic retry wave, from the run's last failure; each later wave waits twice as long",
    )
    archive_dir: str = S(
        "", "where archived runs' files go, one folder per run (empty: `archive` in the data directory)"
    )
    delete_batch: int = S(200, "rollouts (with everything under them) deleted, archived or restored per transaction")
    delete_batch_items: int = S(500, "trajectory items per such transaction (a rollout with more makes one of its own)")
    delete_pause_s: float = S(0.05, "pause between two such transactions, so writers waiting for the lock get it")
    stream_poll_s: float = S(
        0.05,
        "how often an open results stream looks for new results when the database cannot signal them (GYMWEB_WAKE_POLL_S = 0, or neither SQLite nor PostgreSQL)",
    )
    stream_keepalive_s: float = S(
        15.0, "an open results stream sends an empty line after this many seconds without a result"
    )
    stream_max_s: float = S(
        240.0, "a results stream ends after this long (the client reconnects with its cursor; below gunicorn's timeout)"
    )
    web_threads: int = S(
        0,
        "threads of each web worker process, from which the open-stream limit is derived; `gymweb serve` sets it from --threads (set it when starting gunicorn yourself; 0: taken as 16; 1 for `sync` workers)",
    )
    max_result_streams: int | None = S(
        None,
        "open results streams (that wait) one web process holds at once; past it 503 with Retry-After, so some threads stay for pages and /healthz (0: none; ?wait=0 reads are not counted; a value above the threads less one is held to that, with a warning)",
        shown="threads − max(1, threads ÷ 4): 12 of 16",
    )
    max_result_streams_per_user: int | None = S(
        None,
        "open results streams one user (all their API tokens) holds at once in one web process; past it 429 with Retry-After",
        shown="half the per-process limit, at least 1",
    )
    stream_retry_after_s: int = S(5, "the Retry-After (seconds) of a results stream refused by those limits")
    flush_s: float = S(0.25, "how often a worker writes what its rollouts produced")
    gc_threshold: int = S(
        200_000, "Python's first garbage-collector threshold while a dispatcher serves (0: Python's default)"
    )
    connect_retry_pause_s: float = S(0.5, "pause before retrying a refused connection")
    http_keepalive_s: float = S(
        15.0,
        "how long an idle connection to an agent or env is kept for the next call (a rollout's env connection idles through each agent call: above the agent's latency it is reused, at the cost of one more open file per rollout in flight); keep it below the servers' own idle limit (aiohttp servers: 75 s)",
    )
    connect_retry_budget_s: float = S(
        0.0,
        "seconds more of retries (backoff up to 5 s) once a connection to the agent or env failed 3 times "
        "(0: the contract's 3 attempts only); a service restarting within it costs no rollout",
    )
    process_capacity: int = S(2000, "most rollouts in flight per worker process")
    env_max_in_flight: int = S(
        0,
        "most calls one worker process has in flight to one env (resources server) at once; the rest wait in the worker and the oldest rollout's call goes first, so rollouts end in the order they started (0: no bound, as NeMo Gym). For envs that are one process (most NeMo Gym resources servers): a few times the env's cores. A run's own env_max_in_flight (run setting) replaces it for that run",
    )
    dispatch_in_workers: bool = S(True, "each worker process runs a dispatcher")
    release_timeout_s: float = S(20, "how long a stopping worker may take to release its rollouts")
    supervise_minutes: int = S(1, "how often the supervisor revives runs whose workers died")
    write_lease_s: float = S(
        120,
        "an upload or import being written renews its lease with every batch, and a background task's worker renews its task's lease every quarter of it; not renewed for this long, the writer counts as dead (the supervisor deletes what it stored) and the task is failed with the reason on its page",
    )
    aggregate_max_rows: int = S(200_000, "most rows sent to the env's /aggregate_metrics (past it: computed locally)")
    aggregate_timeout_s: float = S(60, "timeout of the /aggregate_metrics call")
    max_keys_per_run: int = S(200_000, "most (task, rollout) keys in one run")
    max_run_concurrency: int = S(
        4096, "the largest concurrency (rollouts in flight) a run may have; raise it for fleets (scale-out.md)"
    )
    max_run_timeout_s: float = S(24 * 3600, "the largest run_timeout_s a run may have")
    # -- operations
    log_level: str = S("INFO", "gymweb's own log level")
    log_format: Literal["text", "json"] = S(
        "text", "`text`: time, level, logger, message; `json`: one JSON object per line"
    )
    metrics_token: SecretStr = S(SecretStr(""), "bearer token that /metrics requires (`Authorization: Bearer <token>`)")
    metrics_allowed_ips: CommaList = S([], "client addresses or CIDR ranges that may read /metrics without the token")


# Variables with the GYMWEB_ prefix that are not server settings: read by the tests, the
# benchmarks and the example API client. Named here so the unknown-variable check knows them.
OTHER_VARIABLES: dict[str, str] = {
    "GYMWEB_URL": "the example API client's gymweb base URL",
    "GYMWEB_TOKEN": "the example API client's API token",
    "GYMWEB_NEMO_GYM_DATA": "tests: NeMo Gym's real data (default `../shared/data/nemo_gym`)",
    "GYMWEB_SCREENSHOTS": "tests: keep the browser tests' pages as PNGs in this folder (`make screenshots`)",
    "GYMWEB_BENCH_PG_NAME": "benchmarks: the PostgreSQL database name",
    "GYMWEB_BENCH_PORT": "benchmarks and tests: the first port of this session's range (servers on 127.0.0.1)",
    "GYMWEB_BENCH_PYSPY": "`bench_trainer`: record the qcluster worker's processes with py-spy into this file",
    "GYMWEB_BENCH_PYSPY_S": "`bench_trainer`: how many seconds py-spy records (default 60)",
    "GYMWEB_NEMO_GYM_EXTRA_CONFIG": "tests: a machine-local NeMo Gym config for the real `gym env start` test",
}
SECRETS = {"secret_key", "metrics_token"}


class SettingsError(Exception):
    """A ``GYMWEB_*`` variable has a value of the wrong type; the message names each one."""


def env_name(field: str) -> str:
    """``lease_s`` → ``GYMWEB_LEASE_S``."""
    return PREFIX + field.upper()


def _names_of(field: str) -> list[str]:
    info = GymwebSettings.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices]
    return [env_name(field)]


def load() -> GymwebSettings:
    """The settings from the environment. Raises ``SettingsError`` naming each bad variable, its
    value and why."""
    try:
        return GymwebSettings()
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = str(err["loc"][0]) if err["loc"] else ""
            name = loc if loc.upper().startswith(PREFIX) else env_name(loc)
            lines.append(f"{name}={os.environ.get(name, '')!r}: {err['msg']}")
        raise SettingsError("bad gymweb settings in the environment:\n  " + "\n  ".join(lines)) from None


def django_settings(conf: GymwebSettings) -> dict[str, Any]:
    """``{"GYMWEB_LEASE_S": 30.0, ...}`` for every field (secrets as plain strings)."""
    out = {}
    for field in GymwebSettings.model_fields:
        value = getattr(conf, field)
        out[env_name(field)] = value.get_secret_value() if isinstance(value, SecretStr) else value
    return out


def _mask_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return value


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(value)
    if value is None:
        return ""
    return str(value)


def describe(conf: GymwebSettings, environ: dict[str, str] | None = None) -> list[dict[str, str]]:
    """One row per setting: ``name``, ``value`` (secrets masked as ``***``, passwords in URLs too),
    ``source`` (``environment`` with the variable read, or ``default``) and ``description``."""
    environ = os.environ if environ is None else environ
    rows = []
    for field, info in GymwebSettings.model_fields.items():
        value = getattr(conf, field)
        if isinstance(value, SecretStr):
            shown = "***" if value.get_secret_value() else ""
        else:
            shown = _shown(value)
            if field.endswith("_url"):
                shown = _mask_url(shown)
        given = [n for n in _names_of(field) if environ.get(n, "") != ""]
        rows.append(
            {
                "name": env_name(field),
                "value": shown,
                "source": f"environment ({given[0]})" if given else "default",
                "description": info.description or "",
            }
        )
    return rows


def known_names() -> set[str]:
    """Every ``GYMWEB_*`` variable gymweb or its tools read."""
    names = set(OTHER_VARIABLES)
    for field in GymwebSettings.model_fields:
        names.update(_names_of(field))
    return names


def unknown_variables(environ: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``GYMWEB_*`` variables in ``environ`` that nothing reads, each with the closest known name
    (or None): a typo must not pass silently."""
    environ = os.environ if environ is None else environ
    known = known_names()
    out = []
    for name in sorted(environ):
        if name.upper().startswith(PREFIX) and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), sorted(known), n=1, cutoff=0.75)
            out.append((name, close[0] if close else None))
    return out


MARK_BEGIN = "<!-- settings table: begin (generated by `gymweb settings --markdown`; do not edit) -->"
MARK_END = "<!-- settings table: end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table() -> str:
    """The settings table of docs/settings.md (between ``MARK_BEGIN`` and ``MARK_END``)."""
    lines = ["| variable | type | default | what |", "|---|---|---|---|"]
    for field, info in GymwebSettings.model_fields.items():
        extra = info.json_schema_extra or {}
        if isinstance(extra, dict) and extra.get("shown"):
            default = str(extra["shown"])
        else:
            value = info.get_default(call_default_factory=False)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            text = _shown(value)
            default = f"`{text}`" if text else "empty"
        kind = _type_name(info.annotation)
        lines.append(f"| `{env_name(field)}` | {kind} | {_cell(default)} | {_cell(info.description or '')} |")
    return "\n".join(lines) + "\n"


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list:
        return "list (comma-separated)"
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if args and type(None) in args:
        return _type_name(next(a for a in args if a is not type(None))) + " (empty: derived)"
    return {bool: "bool", int: "int", float: "float", str: "str", Path: "path", SecretStr: "secret"}.get(
        annotation, str(annotation)
    )


def other_variables_table() -> str:
    lines = ["| variable | what |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(text)} |" for name, text in OTHER_VARIABLES.items()]
    return "\n".join(lines) + "\n"
