"""NeMo Gym's ``gym eval aggregate``: merge rollout shards and compute their aggregate metrics.

Reference: nemo-gym 0.7.0 ``rollout_collection.py`` (``RolloutAggregationHelper``,
``_expand_input_glob``, ``_latest_failure_rows``, ``_counted_failure_row``,
``_missing_rollout_rows_counted_as_zero``, ``_fill_task_fields``, ``_coverage_report``). No Django:
``manage.py aggregate`` is a thin wrapper.

Shards are ``rollouts.jsonl``-like files matched by a glob (or several, comma-separated); each may
have its failures sidecar (``<stem>_failures.jsonl``) and materialised inputs
(``<stem>_materialized_inputs.jsonl``) beside it. A rollout is identified across shards by
``(environment server, _ng_task_index, _ng_rollout_index)``: separate runs number their tasks from 0,
so two servers may reuse indices (``aggregate_metrics.environment_server_of``).

What is written for ``--output OUT.jsonl`` (``merge_shards``, ``write_merged``):

- ``OUT.jsonl``: every shard's success rows, sorted by (task, rollout), each written with
  ``orjson.dumps`` as NeMo Gym writes its merged file. A rollout with a success row in two shards is
  an error naming both places (NeMo Gym would merge both and its env's aggregation would then fail
  on the duplicate key).
- ``OUT_failures.jsonl`` (gymweb's addition; NeMo Gym merges no sidecar): every shard's failure rows,
  shard by shard in file order, so each rollout's attempts stay in order and "the last attempt
  stands", attempt counts and terminal flags read as they did per shard.
- ``OUT_materialized_inputs.jsonl`` (gymweb's addition): one materialised row per rollout, the first
  shard's when several list it (as NeMo Gym counts a missing rollout once, for the first shard).
- ``OUT_aggregate_metrics.json``: ``aggregate_metrics.build_aggregate_metrics`` over the merged
  successes plus, when asked (``count_failure_classes_as_zero``, ``count_missing_rollouts_as_zero``),
  failed or lost rollouts counted as reward 0 for the metrics only, exactly as NeMo Gym selects them:
  a shard's sidecar row counts only when that shard has no success for the key; of several attempts
  of one rollout the last (in shard, then line order) stands; a rollout with a success anywhere is
  never counted; a counted row gets its task's dataset fields from the materialised inputs (only
  those fields real rows of its server carry).
"""

from __future__ import annotations

import glob as glob_module
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollouts.collection.stamps import ENVIRONMENT_SERVER_KEY
from rollouts.engine.targets import DEFAULT_MAX_REPLY_BYTES, TargetPolicy
from rollouts.evaluation.aggregate_metrics import (
    AggregateOutcome,
    aggregate_metrics_bytes,
    aggregate_metrics_path,
    build_aggregate_metrics,
    environment_server_of,
    strip_row,
)
from rollouts.evaluation.outputs import check_outputs, write_bytes
from rollouts.nemo.jsonl import JsonlError, iter_objects
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "MergeResult",
    "Shard",
    "ShardError",
    "expand_input_glob",
    "failures_path_for",
    "materialized_path_for",
    "merge_shards",
    "merged_paths",
    "write_merged",
]

FAILURE_CLASS = "_ng_failure_class"


class ShardError(JsonlError):
    """A shard cannot be merged; ``str(exc)`` names the file and the 1-based line."""


def failures_path_for(path: str | Path) -> Path:
    """NeMo Gym's ``failures_path_for``: ``shards/a.jsonl`` → ``shards/a_failures.jsonl``."""
    path = Path(path)
    return path.with_name(path.stem + "_failures.jsonl")


def materialized_path_for(path: str | Path) -> Path:
    """NeMo Gym's ``materialized_path_for``: ``shards/a.jsonl`` → ``shards/a_materialized_inputs.jsonl``."""
    path = Path(path)
    return path.with_stem(path.stem + "_materialized_inputs").with_suffix(".jsonl")


def expand_input_glob(input_glob: str) -> list[Path]:
    """NeMo Gym's ``_expand_input_glob``: one pattern or several separated by commas (whitespace
    around them ignored); each pattern's matches sorted, duplicates across patterns dropped, and
    files whose stem ends in ``_failures`` or ``_materialized_inputs`` (a shard's sidecars, which its
    glob also matches) left out. Directories are left out too."""
    seen: dict[str, None] = {}
    for pattern in (p.strip() for p in input_glob.split(",")):
        if not pattern:
            continue
        for match in sorted(glob_module.glob(pattern)):
            if Path(match).stem.endswith(("_failures", "_materialized_inputs")) or Path(match).is_dir():
                continue
            seen.setdefault(match, None)
    return [Path(p) for p in seen]


def _read_rows(path: Path) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """``(line number, line bytes, row)`` for each non-blank line, parsed by orjson; ``ShardError``
    for a line that is not a JSON object (NeMo Gym's ``loads_jsonl_line``: "Malformed JSON in FILE at
    line N")."""
    return iter_objects(path, error=ShardError, parser="orjson")


def _key(row: Mapping[str, Any]) -> tuple[Any, Any]:
    return row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME)


def _order_key(row: Mapping[str, Any]) -> tuple:
    return (row.get(TASK_INDEX_KEY_NAME) or 0, row.get(ROLLOUT_INDEX_KEY_NAME) or 0)


@dataclass
class Shard:
    """One shard: its rollouts file and the sidecars beside it (None when absent)."""

    path: Path
    failures: Path | None
    materialized: Path | None
    successes: int = 0
    failure_rows: int = 0
    materialized_rows: int = 0


@dataclass
class MergeResult:
    """What ``merge_shards`` read and computed.

    ``success_lines``: the merged successes, each as ``orjson.dumps`` of its row, in (task, rollout)
    order. ``failure_lines`` / ``materialized_lines``: the merged sidecars. ``aggregate``: the
    aggregate metrics (``AggregateOutcome``). ``counted``: how many failure rows and missing
    rollouts entered the metrics as zeros (``{"failures": n, "missing": m}``). ``dropped``: failure
    classes of the rollouts left out of the metrics. ``notes``: lines for a terminal.
    """

    shards: list[Shard] = field(default_factory=list)
    success_lines: list[bytes] = field(default_factory=list)
    failure_lines: list[bytes] = field(default_factory=list)
    materialized_lines: list[bytes] = field(default_factory=list)
    aggregate: AggregateOutcome = field(default_factory=AggregateOutcome)
    counted: dict[str, int] = field(default_factory=lambda: {"failures": 0, "missing": 0})
    dropped: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def scored(self) -> int:
        """Rollouts in the metrics: successes plus the ones counted as zeros."""
        return len(self.success_lines) + self.counted["failures"] + self.counted["missing"]

    def coverage_lines(self) -> list[str]:
        """NeMo Gym's ``_coverage_report`` for the shards: silent when the metrics cover every
        rollout the sidecars account for."""
        expected = self.scored + sum(self.dropped.values())
        lines = []
        missing = expected - self.scored
        if missing > 0:
            routed = ", ".join(f"{count} {name}" for name, count in sorted(self.dropped.items()))
            lines.append(
                f"Rollouts missing from the score: {missing} of {expected} materialized "
                f"({routed} routed this run; see the shards' _failures.jsonl sidecars)"
            )
            lines.append(f"Metrics cover: {self.scored} of {expected} rollouts")
        if self.counted["missing"]:
            lines.append(f"Scored as zero because they left no row: {self.counted['missing']} of {expected} rollouts")
        return lines


def _counted_failure_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo Gym's ``_counted_failure_row``: the metrics-only copy of a sidecar row counted as zero
    (failure diagnostics dropped, ``mask_sample`` False, ``reward`` 0.0 unless it has one)."""
    scored = {
        k: v for k, v in row.items() if not k.startswith("_ng_failure_") and k not in ("failure_kind", "failure_reason")
    }
    scored["mask_sample"] = False
    scored.setdefault("reward", 0.0)
    return scored


def merge_shards(
    paths: Sequence[str | Path],
    *,
    count_failure_classes_as_zero: Sequence[str] = (),
    count_missing_rollouts_as_zero: bool = False,
    env_url: str | None = None,
    timeout_s: float = 60.0,
    default_agent: str = "remote_agent",
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> MergeResult:
    """Merge the shards at ``paths`` and compute their aggregate metrics (see the module docstring).

    ``count_failure_classes_as_zero``: ``_ng_failure_class`` values (gymweb writes
    ``remote_agent_error``) whose failed rollouts enter the metrics as reward 0.
    ``count_missing_rollouts_as_zero``: materialised rollouts with no row anywhere enter as 0.
    ``env_url``: ask that env's ``/aggregate_metrics`` (else computed locally; notes say so), under
    the target ``policy`` (None: the strict default) with replies capped at ``max_reply_bytes``.

    Raises ``ShardError`` (file and line) for a line that is not a JSON object, a success row
    without both indices, or a rollout with success rows in two places; ``FileNotFoundError`` for
    a missing shard. Holds each success row's bytes and its stripped row (``strip_row``) in memory,
    never the parsed response.
    """
    result = MergeResult()
    group = lambda row: environment_server_of(row, default_agent)  # noqa: E731
    successes, seen, shard_keys = _read_successes(paths, result, group)

    # Successes in NeMo Gym's order (a stable sort: ties keep shard order), re-serialised with
    # orjson as NeMo Gym writes its merged file.
    successes.sort(key=lambda item: item[0])
    result.success_lines = [line for _, line, _ in successes]
    rows = [row for _, _, row in successes]
    del successes

    latest_failures, recorded_by_shard = _read_failures(result, shard_keys, group)
    result_ids = set(seen)
    wanted = set(count_failure_classes_as_zero)
    counted = [
        _counted_failure_row(row)
        for identity, row in latest_failures.items()
        if identity not in result_ids and row.get(FAILURE_CLASS) in wanted and _routable(row)
    ]
    result.counted["failures"] = len(counted)

    accounted = result_ids | set(latest_failures)
    materialized_by_identity, missing = _read_materialized(
        result, shard_keys, recorded_by_shard, accounted, group, count_missing_rollouts_as_zero
    )
    result.counted["missing"] = len(missing)
    counted.extend(missing)
    if counted:
        _fill_task_fields(counted, rows, materialized_by_identity, group)
    counted_ids = {(group(r), *_key(r)) for r in counted}
    result.dropped = Counter(
        row.get(FAILURE_CLASS) or "unknown"
        for identity, row in latest_failures.items()
        if identity not in result_ids and identity not in counted_ids
    )
    result.aggregate = build_aggregate_metrics(
        rows + counted,
        env_url=env_url,
        timeout_s=timeout_s,
        default_agent=default_agent,
        policy=policy,
        max_reply_bytes=max_reply_bytes,
    )
    return result


def _read_successes(
    paths: Sequence[str | Path], result: MergeResult, group
) -> tuple[list[tuple[tuple, bytes, dict[str, Any]]], dict[tuple, str], dict[int, set]]:
    """Every shard's success rows, in shard order: ``(order key, orjson bytes, stripped row)`` each,
    where each identity was seen (``{identity: "file, line N"}``) and each shard's keys. Appends the
    shards to ``result``."""
    successes: list[tuple[tuple, bytes, dict[str, Any]]] = []
    seen: dict[tuple, str] = {}
    shard_keys: dict[int, set] = {}
    for index, raw_path in enumerate(paths):
        path = Path(raw_path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        failures, materialized = failures_path_for(path), materialized_path_for(path)
        shard = Shard(path, failures if failures.is_file() else None, materialized if materialized.is_file() else None)
        keys = shard_keys[index] = set()
        for line_no, _line, row in _read_rows(path):
            if TASK_INDEX_KEY_NAME not in row or ROLLOUT_INDEX_KEY_NAME not in row:
                raise ShardError(f"the row has no {TASK_INDEX_KEY_NAME}/{ROLLOUT_INDEX_KEY_NAME}", line_no, str(path))
            identity = (group(row), *_key(row))
            where = f"{path}, line {line_no}"
            if identity in seen:
                raise ShardError(
                    f"{where}: a second success row for task {identity[1]}, rollout {identity[2]} of "
                    f"{identity[0]} (the first is at {seen[identity]}); the shards overlap"
                )
            seen[identity] = where
            keys.add(_key(row))
            successes.append((_order_key(row), orjson.dumps(row), strip_row(row)))
            shard.successes += 1
        result.shards.append(shard)
    return successes, seen, shard_keys


def _read_failures(
    result: MergeResult, shard_keys: dict[int, set], group
) -> tuple[dict[tuple, dict[str, Any]], dict[int, set]]:
    """Sidecars: every attempt for the merged sidecar; the last attempt of each rollout (not landed in
    its own shard) for counting, keyed by identity; and each shard's keys with a recorded failure."""
    latest_failures: dict[tuple, dict[str, Any]] = {}
    recorded_by_shard: dict[int, set] = defaultdict(set)
    for index, shard in enumerate(result.shards):
        if shard.failures is None:
            continue
        for _line_no, line, row in _read_rows(shard.failures):
            result.failure_lines.append(line)
            shard.failure_rows += 1
            key = _key(row)
            recorded_by_shard[index].add(key)
            if key not in shard_keys[index]:
                latest_failures[(group(row), *key)] = row
    return latest_failures, recorded_by_shard


def _read_materialized(
    result: MergeResult,
    shard_keys: dict[int, set],
    recorded_by_shard: dict[int, set],
    accounted: set,
    group,
    count_missing_rollouts_as_zero: bool,
) -> tuple[dict[tuple, dict[str, Any]], list[dict[str, Any]]]:
    """Materialised inputs: one row per rollout (the first shard's), by identity; and, when
    ``count_missing_rollouts_as_zero``, a zero row for each rollout no shard accounts for
    (``accounted`` grows with them)."""
    materialized_by_identity: dict[tuple, dict[str, Any]] = {}
    missing: list[dict[str, Any]] = []
    unroutable = 0
    for index, shard in enumerate(result.shards):
        if shard.materialized is None:
            if count_missing_rollouts_as_zero:
                result.notes.append(
                    f"{materialized_path_for(shard.path)} is missing; rollouts owed by that shard cannot be counted"
                )
            continue
        for _line_no, line, row in _read_rows(shard.materialized):
            shard.materialized_rows += 1
            identity = (group(row), *_key(row))
            if identity not in materialized_by_identity:
                materialized_by_identity[identity] = row
                result.materialized_lines.append(line)
            if not count_missing_rollouts_as_zero:
                continue
            key = _key(row)
            if key in shard_keys[index] or key in recorded_by_shard[index] or identity in accounted:
                continue
            if not _routable(row):
                unroutable += 1
                continue
            accounted.add(identity)
            missing.append(_missing_zero(row))
    if unroutable:
        result.notes.append(
            f"{unroutable} materialized rollout(s) name no agent or environment server and are not counted"
        )
    return materialized_by_identity, missing


def _missing_zero(row: Mapping[str, Any]) -> dict[str, Any]:
    """The reward-0 row of a materialised rollout no shard accounts for."""
    zero = {
        TASK_INDEX_KEY_NAME: row.get(TASK_INDEX_KEY_NAME),
        ROLLOUT_INDEX_KEY_NAME: row.get(ROLLOUT_INDEX_KEY_NAME),
        "agent_ref": row.get("agent_ref"),
        "reward": 0.0,
    }
    if ENVIRONMENT_SERVER_KEY in row:
        zero[ENVIRONMENT_SERVER_KEY] = row[ENVIRONMENT_SERVER_KEY]
    return zero


def _routable(row: Mapping[str, Any]) -> bool:
    """NeMo Gym's ``_routing_identity`` is not None: the row names an agent or an environment server."""
    ref = row.get("agent_ref")
    return bool((ref.get("name") if isinstance(ref, Mapping) else None) or row.get(ENVIRONMENT_SERVER_KEY))


def _fill_task_fields(
    added: list[dict[str, Any]],
    real: Sequence[Mapping[str, Any]],
    materialized: Mapping[tuple, Mapping[str, Any]],
    group,
) -> None:
    """NeMo Gym's ``_fill_task_fields``: give each added row (counted failure, imputed zero) its
    task's dataset fields from the materialised row of its rollout, only those that real rows of the
    same server carry (``_``-prefixed, ``responses_create_params`` and ``response`` excepted)."""
    carried: dict[Any, set] = defaultdict(set)
    for row in real:
        carried[group(row)].update(row)
    for target in added:
        identity = (group(target), *_key(target))
        source = materialized.get(identity)
        if source is None:
            continue
        for key in carried[identity[0]] & source.keys():
            if not key.startswith("_") and key not in ("responses_create_params", "response"):
                target.setdefault(key, source[key])


def merged_paths(output: str | Path, merge: bool = True) -> dict[str, Path]:
    """The files ``write_merged`` writes for ``output``: ``rollouts``, ``failures``, ``materialized``
    (only with ``merge``) and ``aggregate_metrics``."""
    output = Path(output)
    paths = {"aggregate_metrics": aggregate_metrics_path(output)}
    if merge:
        paths = {
            "rollouts": output,
            "failures": failures_path_for(output),
            "materialized": materialized_path_for(output),
            **paths,
        }
    return paths


def write_merged(
    result: MergeResult, output: str | Path, *, merge: bool = True, overwrite: bool = False
) -> dict[str, Path]:
    """Write ``result`` for ``output`` (``merged_paths``). No file is replaced unless ``overwrite``:
    all are checked first (``outputs.OutputExists``), so a refusal writes none. The aggregate
    metrics file is not written when there is nothing to score (no entries), as in NeMo Gym.
    Returns the paths written."""
    paths = merged_paths(output, merge)
    check_outputs(paths.values(), overwrite)
    written: dict[str, Path] = {}
    if merge:
        written["rollouts"] = write_bytes(paths["rollouts"], b"".join(line + b"\n" for line in result.success_lines))
        written["failures"] = write_bytes(paths["failures"], b"".join(line + b"\n" for line in result.failure_lines))
        written["materialized"] = write_bytes(
            paths["materialized"], b"".join(line + b"\n" for line in result.materialized_lines)
        )
    if result.aggregate.entries:
        written["aggregate_metrics"] = write_bytes(
            paths["aggregate_metrics"], aggregate_metrics_bytes(result.aggregate.entries)
        )
    return written
