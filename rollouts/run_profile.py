"""Profiling a stored run, or NeMo Gym files from anywhere, like NeMo Gym's ``gym eval profile``.

The statistics are ``rollouts.profile`` (a faithful reimplementation of NeMo Gym's profiler); this
module only feeds it and names the files:

- ``<stem>_reward_profiling.jsonl``, ``<stem>_agent_metrics.json``,
  ``<stem>_repeat_level_metrics.json``: NeMo Gym's three files, NeMo Gym's convention (successes
  only; keys without a success row are left out, ``allow_partial_rollouts``).
- ``<stem>_gymweb_pass_at_k.json``: gymweb's own pass@k, with **failures counted as reward 0**
  (DESIGN.md, "Aggregates": both views are shown side by side).

Which keys count in the failures-as-0 figures: a (task, rollout) key counts when it has a succeeded
attempt (its reward) or at least one failed attempt and no success (0.0). Keys with neither
(pending, running, or only cancelled/interrupted rows: not attempts, DESIGN.md "Failure rows") are
left out, since nothing is known about them yet.

A stored run's stem is ``rollouts`` (the names ``collect`` writes). For files, the stem is the
rollouts file's own (``results/foo.jsonl`` → ``results/foo_reward_profiling.jsonl``), as in NeMo Gym.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

from django.db.models import Count, Max, Q

from .export import iter_materialized, iter_successes
from .models import Rollout, Run, Task
from .profile import ProfileResult, gymweb_extras, profile_rows, write_gymweb_extras, write_profile_files

__all__ = [
    "ProfileInputError",
    "RUN_STEM",
    "failures_as_zero_rows",
    "default_failures_path",
    "files_profile",
    "iter_jsonl_objects",
    "merge_failures_as_zero",
    "output_stem_for",
    "profile_run",
    "summary_lines",
    "write_files_profile",
    "write_profile",
    "write_run_profile",
]

RUN_STEM = "rollouts"
EXTRAS_FAILURES_NOTE = (
    "failures count as reward 0.0: a (task, rollout) key counts with its success reward, or 0.0 when it "
    "only failed; keys never finished (pending, running, cancelled, interrupted) are left out"
)


class ProfileInputError(ValueError):
    """A JSONL file cannot be profiled. ``str(exc)`` names the file and the 1-based line, e.g.
    ``"results/rollouts.jsonl, line 3: not valid JSON (Expecting value: line 1 column 1 (char 0))"``."""


# ---------------------------------------------------------------------------------------------
# A stored run
# ---------------------------------------------------------------------------------------------


def _agent_names(run: Run) -> dict[int, str]:
    """``{task_index: agent_ref name}`` (the materialised row's ``agent_ref``, else the run's agent
    name, like ``export``). One entry per task, not per rollout."""
    names: dict[int, str] = {}
    for task_index, row_json in Task.objects.filter(run=run).values_list("task_index", "row_json").iterator(chunk_size=500):
        ref = json.loads(row_json).get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        names[task_index] = name if isinstance(name, str) else run.agent_name
    return names


def failures_as_zero_rows(run: Run) -> Iterator[dict[str, Any]]:
    """One row per finished key of ``run``, for gymweb's pass@k with failures counted as 0.

    Yields ``{"_ng_task_index", "_ng_rollout_index", "reward", "agent_ref": {"name"}}`` in key order,
    with ``reward`` the key's success reward, or 0.0 when it only failed (see the module docstring).
    One SQL aggregate grouped by key; the response texts are never read.
    """
    S = Rollout.Status
    keys = (
        Rollout.objects.filter(run=run)
        .values("task_index", "rollout_index")
        .annotate(
            success_reward=Max("reward", filter=Q(status=S.SUCCEEDED)),
            succeeded=Count("id", filter=Q(status=S.SUCCEEDED)),
            failed=Count("id", filter=Q(status=S.FAILED)),
        )
        .filter(Q(succeeded__gt=0) | Q(failed__gt=0))
        .order_by("task_index", "rollout_index")
    )
    names = _agent_names(run)
    for key in keys.iterator(chunk_size=2000):
        reward = key["success_reward"] if key["succeeded"] else 0.0
        yield {
            "_ng_task_index": key["task_index"],
            "_ng_rollout_index": key["rollout_index"],
            "reward": float(reward) if reward is not None else 0.0,
            "agent_ref": {"name": names.get(key["task_index"], run.agent_name)},
        }


def _extras(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    extras = gymweb_extras(rows)
    extras["estimator"]["failures"] = EXTRAS_FAILURES_NOTE
    return extras


def profile_run(run: Run) -> tuple[ProfileResult, dict[str, Any]]:
    """Profile a stored run.

    Returns ``(result, extras)``: ``result`` is NeMo Gym's profile of the run's success rows
    (``export.iter_successes``) joined to its materialised rows (``export.iter_materialized``), with
    ``allow_partial_rollouts=True`` since keys that failed have no success row; ``extras`` is
    ``profile.gymweb_extras`` over ``failures_as_zero_rows(run)`` (pass@k with failures as 0), with
    ``extras["estimator"]["failures"]`` saying so.

    Both streams are read once from the database (responses are reduced to numbers as they come).
    May emit NeMo Gym's ``UserWarning`` about repeats with missing rollouts.
    """
    result = profile_rows(
        (json.loads(line) for line in iter_materialized(run)),
        (json.loads(line) for line in iter_successes(run)),
        allow_partial_rollouts=True,
    )
    return result, _extras(failures_as_zero_rows(run))


def write_profile(result: ProfileResult, extras: dict[str, Any], stem: Union[str, Path]) -> list[Path]:
    """Write a profile's four files for ``stem`` (``DIR/rollouts`` or ``DIR/rollouts.jsonl`` give
    ``DIR/rollouts_reward_profiling.jsonl``, ``..._agent_metrics.json``, ``..._repeat_level_metrics.json``,
    ``..._gymweb_pass_at_k.json``); directories are created. Returns the four paths in that order."""
    paths = list(write_profile_files(result, stem))
    paths.append(write_gymweb_extras(extras, stem))
    return paths


def write_run_profile(run: Run, output_dir: Union[str, Path]) -> list[Path]:
    """Profile ``run`` and write the four files into ``output_dir`` (created when missing):
    ``rollouts_reward_profiling.jsonl``, ``rollouts_agent_metrics.json``,
    ``rollouts_repeat_level_metrics.json`` (NeMo Gym's names and layout) and
    ``rollouts_gymweb_pass_at_k.json`` (gymweb's). Returns the four paths in that order."""
    result, extras = profile_run(run)
    return write_profile(result, extras, Path(output_dir) / RUN_STEM)


# ---------------------------------------------------------------------------------------------
# Files from anywhere (``gym eval profile --inputs M --rollouts R``)
# ---------------------------------------------------------------------------------------------


def iter_jsonl_objects(path: Union[str, Path], *, require_indices: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the JSON object on each non-blank line of ``path``.

    Raises ``ProfileInputError`` naming the file and 1-based line for a line that is not JSON, not
    UTF-8, not a JSON object, or (``require_indices``) without ``_ng_task_index`` and
    ``_ng_rollout_index``; ``FileNotFoundError``/``IsADirectoryError`` as ``open`` does.
    """
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except UnicodeDecodeError as exc:
                raise ProfileInputError(f"{path}, line {line_no}: not UTF-8 text ({exc.reason})") from None
            except ValueError as exc:
                raise ProfileInputError(f"{path}, line {line_no}: not valid JSON ({exc})") from None
            if not isinstance(value, dict):
                raise ProfileInputError(f"{path}, line {line_no}: expected a JSON object, got {type(value).__name__}")
            if require_indices and not ("_ng_task_index" in value and "_ng_rollout_index" in value):
                raise ProfileInputError(
                    f"{path}, line {line_no}: the row has no _ng_task_index/_ng_rollout_index "
                    "(profiling joins inputs and rollouts on these two indices)"
                )
            yield value


def merge_failures_as_zero(
    success_rows: Iterable[Mapping[str, Any]], failure_rows: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Rows for pass@k with failures as 0, from a ``rollouts.jsonl`` and its failures sidecar.

    One row per key (``_ng_task_index``, ``_ng_rollout_index``): the success's ``reward`` when the
    key has a success row, else 0.0 when it has failure rows (a key retried several times has one
    failure row per attempt: it still counts once). ``agent_ref`` is kept from the row. Rows without
    the two indices raise ``ProfileInputError``. Holds one small dict per key in memory.
    """
    keys: dict[tuple[Any, Any], dict[str, Any]] = {}

    def key_of(row: Mapping[str, Any], what: str, n: int) -> tuple[Any, Any]:
        try:
            return row["_ng_task_index"], row["_ng_rollout_index"]
        except KeyError:
            raise ProfileInputError(f"{what} row #{n} has no _ng_task_index/_ng_rollout_index") from None

    for n, row in enumerate(success_rows, 1):
        key = key_of(row, "rollout", n)
        keys[key] = {"_ng_task_index": key[0], "_ng_rollout_index": key[1], "reward": row.get("reward")}
        if isinstance(row.get("agent_ref"), dict):
            keys[key]["agent_ref"] = row["agent_ref"]
    for n, row in enumerate(failure_rows, 1):
        key = key_of(row, "failure", n)
        if key in keys:
            continue
        keys[key] = {"_ng_task_index": key[0], "_ng_rollout_index": key[1], "reward": 0.0}
        if isinstance(row.get("agent_ref"), dict):
            keys[key]["agent_ref"] = row["agent_ref"]
    return list(keys.values())  # gymweb_extras groups and orders them by task and rollout index


def files_profile(
    materialized_path: Union[str, Path],
    rollouts_path: Union[str, Path],
    *,
    failures_path: Optional[Union[str, Path]] = None,
    allow_partial_rollouts: bool = False,
) -> tuple[ProfileResult, dict[str, Any]]:
    """Profile NeMo Gym files: ``gym eval profile --inputs materialized_path --rollouts rollouts_path``.

    ``allow_partial_rollouts`` is NeMo Gym's ``++allow_partial_rollouts`` (default False: every
    materialised row needs a rollout row). ``failures_path`` (a failures sidecar, optional) only
    changes gymweb's pass@k: its keys count as 0 (``merge_failures_as_zero``); without it pass@k is
    over the success rows.

    Returns ``(result, extras)``. Raises ``ProfileInputError`` (file + line) for bad JSONL and
    ``ValueError`` for rows NeMo Gym's profiler rejects (duplicate keys, rollouts without an input,
    missing rollouts in strict mode); ``FileNotFoundError`` for a missing file.
    """
    for p in (materialized_path, rollouts_path, failures_path):
        if p is not None and not Path(p).is_file():
            raise FileNotFoundError(f"{p}: no such file")
    result = profile_rows(
        iter_jsonl_objects(materialized_path, require_indices=True),
        iter_jsonl_objects(rollouts_path, require_indices=True),
        allow_partial_rollouts=allow_partial_rollouts,
    )
    if failures_path is None:
        extras = gymweb_extras(result)
    else:
        extras = _extras(
            merge_failures_as_zero(
                iter_jsonl_objects(rollouts_path, require_indices=True), iter_jsonl_objects(failures_path, require_indices=True)
            )
        )
    return result, extras


def default_failures_path(rollouts_path: Union[str, Path]) -> Path:
    """The failures sidecar NeMo Gym writes beside ``rollouts_path`` (``foo.jsonl`` →
    ``foo_failures.jsonl``)."""
    p = Path(rollouts_path)
    stem = p.with_suffix("") if p.suffix == ".jsonl" else p
    return stem.parent / f"{stem.name}_failures.jsonl"


def output_stem_for(rollouts_path: Union[str, Path], output_dir: Optional[Union[str, Path]] = None) -> Path:
    """Where NeMo Gym writes a profile of ``rollouts_path``: beside it, named after its stem; with
    ``output_dir``, in that directory under the same names."""
    p = Path(rollouts_path)
    return Path(output_dir) / p.name if output_dir is not None else p


def write_files_profile(
    materialized_path: Union[str, Path],
    rollouts_path: Union[str, Path],
    *,
    output_dir: Optional[Union[str, Path]] = None,
    failures_path: Optional[Union[str, Path]] = None,
    allow_partial_rollouts: bool = False,
) -> tuple[ProfileResult, dict[str, Any], list[Path]]:
    """``files_profile`` and write the four files (see ``output_stem_for``). Returns
    ``(result, extras, paths)``; raises like ``files_profile``."""
    result, extras = files_profile(
        materialized_path, rollouts_path, failures_path=failures_path, allow_partial_rollouts=allow_partial_rollouts
    )
    stem = output_stem_for(rollouts_path, output_dir)
    return result, extras, write_profile(result, extras, stem)


# ---------------------------------------------------------------------------------------------
# A readable summary (the command prints it; a page can show the same lines)
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4f}"
    return "n/a" if value is None else str(value)


def summary_lines(result: ProfileResult, extras: dict[str, Any]) -> list[str]:
    """A few lines for a terminal: completion, and per agent the mean reward over successes (NeMo
    Gym's ``mean/reward``) and gymweb's pass@1 / pass@k (over ``extras``)."""
    c = result.completion_summary
    lines = []
    if c:
        lines.append(
            f"{c.get('total_input_rows', 0)} task(s); {c.get('completed_rollout_rows', 0)} of "
            f"{c.get('expected_rollout_rows', 0)} rollout(s) have a success row "
            f"({c.get('reward_profile_completion_pct', 0.0):.1f}%)"
        )
    overall: dict[Any, dict[str, Any]] = {}
    for entry in extras.get("overall", []):
        overall[(entry.get("agent_ref") or {}).get("name")] = entry
    for entry in result.agent_metrics:
        name = (entry.get("agent_ref") or {}).get("name")
        lines.append(f"agent {name}: mean/reward (successes) {_fmt(entry.get('mean/reward'))}")
    for name, entry in overall.items():
        ks = sorted({int(k[5:]) for k in entry if k.startswith("pass@") and k[5:].isdigit()})
        shown = ", ".join(f"pass@{k} {_fmt(entry[f'pass@{k}'])}" for k in sorted({ks[0], ks[-1]})) if ks else "no rollouts"
        basis = "failures as 0" if extras.get("estimator", {}).get("failures") else "success rows only"
        lines.append(f"agent {name}: {shown} over {entry.get('num_tasks', 0)} task(s) (gymweb pass@k, {basis})")
    return lines
