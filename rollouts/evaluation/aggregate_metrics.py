"""NeMo Gym's ``<stem>_aggregate_metrics.json``: what ``gym eval run`` and ``gym eval aggregate`` write
from the environment's ``/aggregate_metrics``, and what ``gym eval compare`` reads.

Reference: nemo-gym 0.7.0, ``rollout_collection.py`` (``_call_aggregate_metrics``) and
``reward_profile.py`` (``compute_aggregate_metrics``, the default every NeMo Gym resources server
serves). No Django here; ``rollouts.evaluation.run_aggregate_metrics`` applies it to stored runs and
``rollouts.evaluation.shards`` to shard files.

The file is a JSON list (orjson, ``OPT_INDENT_2``) with one entry per environment server the rows ran
through::

    {"agent_ref": {"name": <agent>}, "_ng_environment_server": <server>,
     "agent_metrics": {...}, "key_metrics": {...}, "group_level_metrics": [...],
     "repeat_level_metrics": [...], "perf_summary": {...}  (only when the env returns one)}

How NeMo Gym builds it (and so this module):

* Rows (``rollouts.jsonl`` successes) are sorted by ``(_ng_task_index, _ng_rollout_index)`` and
  grouped by their ``_ng_environment_server`` stamp (``environment_server_of``).
* Each group's rows are *stripped* (``strip_row``): ``response``, ``responses_create_params``,
  ``ng_agent_observations``, ``ng_model_call_capture`` and ``ng_trajectory`` are dropped, but
  ``response.usage`` and ``response.incomplete_details`` are kept as ``{"response": {...}}``. They are
  POSTed as ``{"verify_responses": [...]}`` to the env's ``/aggregate_metrics``; its reply fills the
  entry (missing keys default to empty, like NeMo Gym's ``AggregateMetrics`` model).
* When the env has no ``/aggregate_metrics`` (or it fails), ``compute_aggregate_metrics`` computes the
  same keys locally: NeMo Gym's default computation (the ``RewardProfiler`` over the stripped rows as
  one agent named "agent", across-repeat statistics with Student-t intervals, ``num_repeats``,
  ``key_metrics`` = the ``mean/*`` entries), without an env's custom metrics. Callers say so.
* Entries are labelled by their agent name (``agent_ref``), or by the server name when two servers
  front the same agent (``global_config.label_runs``).
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from rollouts.collection.stamps import ENVIRONMENT_SERVER_KEY, environment_server_name
from rollouts.engine.policy_transports import make_sync_client
from rollouts.engine.targets import DEFAULT_MAX_REPLY_BYTES, TargetPolicy
from rollouts.evaluation.outputs import check_outputs, dumps, write_bytes
from rollouts.evaluation.reward_profile import label_runs, profile_rows
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "AggregateOutcome",
    "EnvAggregateError",
    "EnvAggregateNotServed",
    "aggregate_metrics_path",
    "build_aggregate_metrics",
    "compute_aggregate_metrics",
    "compute_perf_summary",
    "environment_server_of",
    "post_aggregate_metrics",
    "strip_row",
    "write_aggregate_metrics",
]

MASK_SAMPLE = "mask_sample"
# Heavy fields NeMo Gym leaves out of the /aggregate_metrics request (rollout_collection.py).
STRIPPED_KEYS = (
    "response",
    "responses_create_params",
    "ng_agent_observations",
    "ng_model_call_capture",
    "ng_trajectory",
)
# AggregateMetrics (config_types.py): the reply's fields and their defaults.
REPLY_FIELDS = {"group_level_metrics": list, "agent_metrics": dict, "key_metrics": dict, "repeat_level_metrics": list}
LOCAL_NOTE = "computed by gymweb with NeMo Gym's default /aggregate_metrics computation (no env-specific metrics)"


def aggregate_metrics_path(output: str | Path) -> Path:
    """NeMo Gym's ``aggregate_metrics_path_for``: ``results/rollouts.jsonl`` →
    ``results/rollouts_aggregate_metrics.json`` (the name ``gym eval compare`` derives from the
    rollouts path)."""
    output = Path(output)
    return output.with_stem(output.stem + "_aggregate_metrics").with_suffix(".json")


def environment_server_of(row: Mapping[str, Any], default_agent: str = "remote_agent") -> str:
    """The environment server a row is scored under: its ``_ng_environment_server`` stamp, else the
    one NeMo Gym generates for its agent (``stamps.environment_server_name`` of ``agent_ref.name``,
    ``default_agent`` when the row names none)."""
    stamp = row.get(ENVIRONMENT_SERVER_KEY)
    if isinstance(stamp, str):
        return stamp
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return environment_server_name(name if isinstance(name, str) and name else default_agent)


def _agent_of(row: Mapping[str, Any]) -> str | None:
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else None


def strip_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as NeMo Gym sends it to ``/aggregate_metrics``: without the heavy fields
    (``STRIPPED_KEYS``), with ``response`` reduced to its ``usage`` and ``incomplete_details`` when
    either is present (not null)."""
    entry = {k: v for k, v in row.items() if k not in STRIPPED_KEYS}
    response = row.get("response") or {}
    kept = {}
    if isinstance(response, Mapping):
        if response.get("usage") is not None:
            kept["usage"] = response["usage"]
        if response.get("incomplete_details") is not None:
            kept["incomplete_details"] = response["incomplete_details"]
    if kept:
        entry["response"] = kept
    return entry


def _order_key(row: Mapping[str, Any]) -> tuple:
    """NeMo Gym's ``_rollout_order_key``: task, then repeat (missing indices count as 0)."""
    return (row.get(TASK_INDEX_KEY_NAME) or 0, row.get(ROLLOUT_INDEX_KEY_NAME) or 0)


# ---------------------------------------------------------------------------------------------
# The default computation (reward_profile.compute_aggregate_metrics without custom hooks)
# ---------------------------------------------------------------------------------------------


def _perf_stat(values: list[float], stat: str) -> float:
    """``reward_profile._stat``: statistics.fmean/median/pstdev, sum, min, max, or a linear quantile
    (``p90`` = ``Series.quantile(0.9)``, which is ``np.quantile``)."""
    if stat == "mean":
        return statistics.fmean(values)
    if stat == "median":
        return statistics.median(values)
    if stat == "total":
        return sum(values)
    if stat == "std":
        return statistics.pstdev(values)
    if stat == "min":
        return min(values)
    if stat == "max":
        return max(values)
    return float(np.quantile(np.asarray(values, dtype=np.float64), int(stat[1:]) / 100))


def compute_perf_summary(records: Sequence[Mapping[str, Any]], total_rollouts: int) -> dict[str, Any] | None:
    """NeMo Gym's ``compute_perf_summary``: the ``perf_summary`` block from the rows' ``ng_perf``
    dicts (token counts, turns, latency in ms), or None when no row carries one. Coverage fractions
    are over ``total_rollouts`` (every row, masked ones included)."""
    if total_rollouts <= 0 or not records:
        return None

    def values(key: str) -> list[float]:
        return [r[key] for r in records if isinstance(r.get(key), (int, float))]

    summary: dict[str, Any] = {
        "overall_observability_coverage": len(records) / total_rollouts,
        "token_observability_coverage": sum(
            1
            for r in records
            if isinstance(r.get("token_observability_coverage"), (int, float)) and r["token_observability_coverage"] > 0
        )
        / total_rollouts,
    }
    for name in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens"):
        found = values(name)
        if found:
            for stat in ("mean", "median", "total"):
                summary[f"{stat}_{name}"] = _perf_stat(found, stat)
    turns = values("num_turns")
    if turns:
        for stat in ("mean", "median", "std", "min", "p90", "max"):
            summary[f"{stat}_num_turns"] = _perf_stat(turns, stat)
    per_turn = [
        r["completion_tokens"] / r["num_turns"]
        for r in records
        if isinstance(r.get("completion_tokens"), (int, float))
        and isinstance(r.get("num_turns"), (int, float))
        and r["num_turns"] > 0
    ]
    if per_turn:
        summary["mean_tokens_per_turn"] = _perf_stat(per_turn, "mean")
        summary["median_tokens_per_turn"] = _perf_stat(per_turn, "median")
    latency = values("total_latency_ms")
    if latency:
        for stat in ("p50", "p90", "p99", "mean"):
            summary[f"total_latency_{stat}_ms"] = _perf_stat(latency, stat)
    return summary


def _coverage(
    all_rows: Sequence[Mapping[str, Any]], scored: Sequence[Mapping[str, Any]], masked: Sequence[Any]
) -> dict[str, Any]:
    """``reward_profile._coverage_metrics``: empty unless something was masked."""
    if not masked:
        return {}
    tasks_total = {r.get(TASK_INDEX_KEY_NAME, 0) for r in all_rows}
    tasks_measured = {r.get(TASK_INDEX_KEY_NAME, 0) for r in scored}
    return {
        "coverage/measured_rollouts": len(scored),
        "coverage/masked_rollouts": len(masked),
        "coverage/measured_tasks": len(tasks_measured),
        "coverage/fully_masked_tasks": len(tasks_total - tasks_measured),
    }


def compute_aggregate_metrics(verify_responses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """NeMo Gym's default ``/aggregate_metrics`` answer for stripped rows (``strip_row``), in task then
    repeat order: ``{"group_level_metrics": [...], "agent_metrics": {...}, "key_metrics": {...},
    "perf_summary": {...} | None, "repeat_level_metrics": [...]}``.

    Masked rows (``mask_sample``) leave the quality figures and show as ``coverage/*``; missing
    indices count as 0. Raises ``ValueError`` for two rows with the same (task, rollout) key (NeMo
    Gym's env answers HTTP 500 then: "Duplicate result row for rollout key ...").
    """
    empty: dict[str, Any] = {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }
    if not verify_responses:
        return empty
    scored = [r for r in verify_responses if not r.get(MASK_SAMPLE)]
    masked = [r for r in verify_responses if r.get(MASK_SAMPLE)]
    coverage = _coverage(verify_responses, scored, masked)
    perf_summary = compute_perf_summary(
        [r["ng_perf"] for r in verify_responses if isinstance(r.get("ng_perf"), dict)],
        total_rollouts=len(verify_responses),
    )
    if not scored:
        return {**empty, "agent_metrics": dict(coverage), "key_metrics": dict(coverage), "perf_summary": perf_summary}

    # One synthetic agent "agent", as NeMo Gym's compute_aggregate_metrics profiles them.
    masked_keys = {(r.get(TASK_INDEX_KEY_NAME, 0), r.get(ROLLOUT_INDEX_KEY_NAME, 0)) for r in masked}
    inputs = [
        {
            TASK_INDEX_KEY_NAME: r.get(TASK_INDEX_KEY_NAME, 0),
            ROLLOUT_INDEX_KEY_NAME: r.get(ROLLOUT_INDEX_KEY_NAME, 0),
            "agent_ref": {"name": "agent"},
        }
        for r in verify_responses
    ]
    inputs = [row for row in inputs if (row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]) not in masked_keys]
    results = []
    for r in scored:
        result = {k: v for k, v in r.items() if k != MASK_SAMPLE}
        if "response" not in result:
            result["response"] = {}
        result.setdefault(TASK_INDEX_KEY_NAME, 0)
        result.setdefault(ROLLOUT_INDEX_KEY_NAME, 0)
        results.append(result)
    with warnings.catch_warnings():
        # NeMo Gym's env logs these (zero spread, repeats missing some tasks) on its own console.
        warnings.simplefilter("ignore", UserWarning)
        profile = profile_rows(inputs, results)

    agent_metrics: dict[str, Any] = {}
    for entry in profile.agent_metrics:
        agent_metrics.update((k, v) for k, v in entry.items() if k != "agent_ref")
    agent_metrics.update(coverage)
    agent_metrics["num_repeats"] = len({r.get(ROLLOUT_INDEX_KEY_NAME, 0) for r in verify_responses})
    key_metrics = {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}
    key_metrics.update(coverage)
    return {
        "group_level_metrics": profile.reward_profiling,
        "agent_metrics": agent_metrics,
        "key_metrics": key_metrics,
        "perf_summary": perf_summary,
        "repeat_level_metrics": [
            {k: v for k, v in e.items() if k != "agent_ref"} for e in profile.repeat_level_metrics
        ],
    }


# ---------------------------------------------------------------------------------------------
# Asking the env
# ---------------------------------------------------------------------------------------------


class EnvAggregateNotServed(Exception):
    """The env answered 404 or 405 to ``POST /aggregate_metrics``: it does not serve the route."""


class EnvAggregateError(Exception):
    """``/aggregate_metrics`` failed: no connection, timeout, an error status or a reply that is not
    NeMo Gym's ``AggregateMetrics`` object. ``str(exc)`` says which, with the URL."""


def _validated_reply(data: Any, url: str) -> dict[str, Any]:
    """The reply as NeMo Gym's ``AggregateMetrics.model_validate`` takes it: an object whose known
    fields have the right types (missing ones default to empty; unknown ones are ignored). A reply
    with none of those fields (another shape, such as ``{"mean/reward": 0.8}``) would validate as an
    empty ``AggregateMetrics`` and give a file ``gym eval compare`` refuses ("share no metric
    keys"): it is refused here, so the caller computes the file locally and says so."""
    if not isinstance(data, dict):
        raise EnvAggregateError(f"{url} answered with JSON that is not an object")
    if not any(name in data for name in (*REPLY_FIELDS, "perf_summary")):
        shown = ", ".join(repr(k) for k in list(data)[:5]) + (", ..." if len(data) > 5 else "")
        raise EnvAggregateError(
            f"{url} answered with an object that is not NeMo Gym's AggregateMetrics (none of "
            f"{', '.join(REPLY_FIELDS)}; its keys: {shown or 'none'})"
        )
    reply: dict[str, Any] = {}
    for name, kind in REPLY_FIELDS.items():
        value = data.get(name, kind())
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, dict) for v in value)):
            raise EnvAggregateError(
                f"{url} answered with a '{name}' that is not {'a list of objects' if kind is list else 'an object'}"
            )
        reply[name] = value
    perf = data.get("perf_summary")
    if perf is not None and not isinstance(perf, dict):
        raise EnvAggregateError(f"{url} answered with a 'perf_summary' that is not an object")
    reply["perf_summary"] = perf
    return reply


def post_aggregate_metrics(
    env_url: str,
    stripped: Sequence[Mapping[str, Any]],
    *,
    timeout_s: float = 60.0,
    client: httpx.Client | None = None,
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> dict[str, Any]:
    """POST ``{"verify_responses": stripped}`` to ``{env_url}/aggregate_metrics`` and return the reply
    (``_validated_reply``: the ``AggregateMetrics`` fields). Redirects are not followed; proxies are
    ignored (contract rules 1, 14). Raises ``EnvAggregateNotServed`` for 404/405 and
    ``EnvAggregateError`` for anything else that is not a valid reply (also a host the target
    ``policy`` refuses, None: the strict default, and a reply over ``max_reply_bytes``); never
    hangs past ``timeout_s`` seconds. ``client``: a client from ``policy_transports.make_sync_client``."""
    url = f"{env_url.rstrip('/')}/aggregate_metrics"
    body = dumps({"verify_responses": list(stripped)})
    own = client is None
    http = client or make_sync_client(policy or TargetPolicy(), max_reply_bytes, timeout_s=timeout_s)
    try:
        response = http.post(url, content=body, headers={"content-type": "application/json"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EnvAggregateError(f"could not call {url}: {exc.__class__.__name__}: {exc}") from None
    finally:
        if own:
            http.close()
    if response.status_code in (404, 405):
        raise EnvAggregateNotServed(
            f"{url} answered HTTP {response.status_code}: the environment does not serve /aggregate_metrics"
        )
    if not response.is_success:
        raise EnvAggregateError(f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
    try:
        data = response.json()
    except ValueError:
        raise EnvAggregateError(f"{url} answered with a body that is not JSON: {response.text[:500]}") from None
    return _validated_reply(data, url)


# ---------------------------------------------------------------------------------------------
# The file's entries
# ---------------------------------------------------------------------------------------------


@dataclass
class AggregateOutcome:
    """What ``build_aggregate_metrics`` made.

    ``entries``: the file's list (one dict per environment server, in order of first appearance).
    ``sources``: ``{server: "env" | "local" | "none"}`` ("none": not answered, no local fallback).
    ``notes``: one line per server not answered by the env (why, and that it was computed locally).
    ``replies``: the env's validated replies by server.
    """

    entries: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def all_from_env(self) -> bool:
        return bool(self.sources) and all(s == "env" for s in self.sources.values())


def build_aggregate_metrics(
    rows: Iterable[Mapping[str, Any]],
    *,
    env_url: str | None = None,
    timeout_s: float = 60.0,
    default_agent: str = "remote_agent",
    local_fallback: bool = True,
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> AggregateOutcome:
    """The ``<stem>_aggregate_metrics.json`` entries for success rows (full ``rollouts.jsonl`` rows,
    any order), as NeMo Gym's ``_call_aggregate_metrics`` makes them.

    With ``env_url`` each environment server's stripped rows go to that env's ``/aggregate_metrics``
    (gymweb drives one env per run); without it, or when the env does not serve the route or fails,
    ``compute_aggregate_metrics`` answers instead and a note says so (with ``local_fallback=False``
    such a server gets no entry: ``sources[server] == "none"``). No rows, no entries (NeMo Gym
    writes no file then). Requests to the env follow the target ``policy`` (None: the strict
    default, public addresses only) and cap replies at ``max_reply_bytes``; a refusal is a note
    like any failure of the env. Raises ``ValueError`` (from the local computation) for duplicate keys
    within one server's rows.
    """
    # Stripped as they come (a full row's response is never kept), then in NeMo Gym's order.
    ordered = sorted((strip_row(row) for row in rows), key=_order_key)
    groups: dict[str, list[dict[str, Any]]] = {}
    agents: dict[str, str | None] = {}
    for row in ordered:
        server = environment_server_of(row, default_agent)
        groups.setdefault(server, []).append(row)
        if server not in agents:
            agents[server] = _agent_of(row) or default_agent
    labels = label_runs(agents)
    outcome = AggregateOutcome()
    client = make_sync_client(policy or TargetPolicy(), max_reply_bytes, timeout_s=timeout_s) if env_url else None
    try:
        for server, stripped in groups.items():
            reply = None
            if client is not None:
                try:
                    reply = post_aggregate_metrics(env_url, stripped, timeout_s=timeout_s, client=client)
                except (EnvAggregateNotServed, EnvAggregateError) as exc:
                    why = str(exc)
            else:
                why = "no environment to ask"
            if reply is None:
                if not local_fallback:
                    outcome.notes.append(f"{server}: {why}")
                    outcome.sources[server] = "none"
                    continue
                outcome.notes.append(f"{server}: {why}; {LOCAL_NOTE}")
                reply = compute_aggregate_metrics(stripped)
                outcome.sources[server] = "local"
            else:
                outcome.sources[server] = "env"
                outcome.replies[server] = reply
            entry = {
                "agent_ref": {"name": labels[server]},
                ENVIRONMENT_SERVER_KEY: server,
                "agent_metrics": reply["agent_metrics"],
                "key_metrics": reply["key_metrics"],
                "group_level_metrics": reply["group_level_metrics"],
                "repeat_level_metrics": reply["repeat_level_metrics"],
            }
            if reply.get("perf_summary") is not None:
                entry["perf_summary"] = reply["perf_summary"]
            outcome.entries.append(entry)
    finally:
        if client is not None:
            client.close()
    return outcome


def aggregate_metrics_bytes(entries: Sequence[Mapping[str, Any]]) -> bytes:
    """The file's bytes: ``orjson.dumps(entries, option=OPT_INDENT_2)``, as NeMo Gym writes it."""
    return dumps(list(entries), indent=True)


def write_aggregate_metrics(entries: Sequence[Mapping[str, Any]], path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the entries to ``path`` (``aggregate_metrics_bytes``). Never replaces an existing file
    unless ``overwrite`` (``outputs.OutputExists``). Returns the path."""
    (target,) = check_outputs([path], overwrite)
    return write_bytes(target, aggregate_metrics_bytes(entries))
