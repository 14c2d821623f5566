"""Profiling a stored run, or NeMo Gym files from anywhere, like NeMo Gym's ``gym eval profile``.

The statistics are ``rollouts.evaluation.reward_profile`` (a faithful reimplementation of NeMo Gym's
profiler) and ``rollouts.evaluation.pass_at_k``; this module only feeds them and names the files:

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

import gc
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollouts.collection.export import CHUNK, iter_successes
from rollouts.collection.profile_numbers import loads_profile_numbers
from rollouts.evaluation.outputs import check_outputs
from rollouts.evaluation.pass_at_k import gymweb_extras, gymweb_extras_path, write_gymweb_extras
from rollouts.evaluation.reward_profile import (
    ProfileResult,
    ReducedRollout,
    profile_file_paths,
    profile_rows,
    write_profile_files,
)
from rollouts.models import Rollout, Run, Task
from rollouts.nemo.jsonl import JsonlError, iter_objects
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

log = logging.getLogger(__name__)

__all__ = [
    "ProfileInputError",
    "RUN_STEM",
    "failures_as_zero_rows",
    "default_failures_path",
    "files_profile",
    "iter_jsonl_objects",
    "merge_failures_as_zero",
    "output_stem_for",
    "profile_paths",
    "profile_run",
    "run_materialized_rows",
    "run_success_rows",
    "summary_lines",
    "write_files_profile",
    "write_profile",
    "write_run_profile",
]

RUN_STEM = "rollouts"
EXTRAS_FAILURES_NOTE = (
    "failures count as reward 0.0: each rollout (a task and its rollout number) counts with its success reward, "
    "or 0.0 when it only failed; rollouts never finished (pending, running, cancelled, interrupted) are left out"
)


class ProfileInputError(JsonlError):
    """A JSONL file cannot be profiled. ``str(exc)`` names the file and the 1-based line, e.g.
    ``"results/rollouts.jsonl, line 3: not valid JSON (Expecting value: line 1 column 1 (char 0))"``."""


# ---------------------------------------------------------------------------------------------
# A stored run
# ---------------------------------------------------------------------------------------------


Key = tuple[int, int]  # (task_index, rollout_index)


def _agent_name(task_row: Mapping[str, Any], run: Run) -> str:
    """A task's ``agent_ref`` name (the materialised row's, else the run's agent name, like ``export``)."""
    ref = task_row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else run.agent_name


def _agent_names(run: Run) -> dict[int, str]:
    """``{task_index: agent_ref name}`` of the run's tasks (``_agent_name``). One entry per task, not
    per rollout."""
    names: dict[int, str] = {}
    for task_index, row_json in (
        Task.objects.filter(run=run).values_list("task_index", "row_json").iterator(chunk_size=500)
    ):
        names[task_index] = _agent_name(json.loads(row_json), run)
    return names


def _success_rewards(run: Run) -> dict[Key, float | None]:
    """``{(task_index, rollout_index): reward}`` of the run's succeeded attempts (the highest
    non-null one should a key have several, like SQL's ``MAX``)."""
    rewards: dict[Key, float | None] = {}
    fetch = (
        Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED)
        .order_by("task_index", "rollout_index")
        .values_list("task_index", "rollout_index", "reward")
    )
    for task_index, rollout_index, reward in fetch.iterator(chunk_size=2000):
        _keep_max(rewards, (task_index, rollout_index), reward)
    return rewards


def _keep_max(rewards: dict[Key, float | None], key: Key, reward: float | None) -> None:
    if key not in rewards or (reward is not None and (rewards[key] is None or reward > rewards[key])):
        rewards[key] = reward


def failures_as_zero_rows(
    run: Run,
    *,
    success_rewards: Mapping[Key, float | None] | None = None,
    agent_names: Mapping[int, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """One row per finished key of ``run``, for gymweb's pass@k with failures counted as 0.

    Yields ``{"_ng_task_index", "_ng_rollout_index", "reward", "agent_ref": {"name"}}`` in key order,
    with ``reward`` the key's success reward, or 0.0 when it only failed (see the module docstring).
    The response texts are never read: the succeeded attempts' ``reward`` column, the keys of the
    failed ones and the tasks' agent names. ``success_rewards`` (as ``_success_rewards``) and
    ``agent_names`` (as ``_agent_names``, or any mapping with the run's task indices) are taken as
    given when the caller has read them already (``profile_run``).
    """
    if success_rewards is None:
        success_rewards = _success_rewards(run)
    failed = (
        Rollout.objects.filter(run=run, status=Rollout.Status.FAILED)
        .order_by()
        .values_list("task_index", "rollout_index")
        .distinct()
    )
    keys = list(success_rewards)  # in key order already when read in key order: a cheap sort
    keys.extend(key for key in failed.iterator(chunk_size=2000) if key not in success_rewards)
    keys.sort()
    names = _agent_names(run) if agent_names is None else agent_names
    for key in keys:
        reward = success_rewards[key] if key in success_rewards else 0.0
        name = names.get(key[0], run.agent_name)
        yield {
            TASK_INDEX_KEY_NAME: key[0],
            ROLLOUT_INDEX_KEY_NAME: key[1],
            "reward": float(reward) if reward is not None else 0.0,
            "agent_ref": {"name": name},
        }


def _extras(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    extras = gymweb_extras(rows)
    extras["estimator"]["failures"] = EXTRAS_FAILURES_NOTE
    return extras


def run_success_rows(
    run: Run, success_rewards: dict[Key, float | None] | None = None
) -> Iterator[ReducedRollout | dict[str, Any]]:
    """The run's ``rollouts.jsonl`` rows for ``profile.profile_rows``, in key order: a
    ``ReducedRollout`` (key and stored ``profile_json``) for each success that has its numbers, and
    after them the full row (``export.iter_successes``, parsing ``verify_json``) of the others (stored
    before ``profile_json`` existed, or with numbers of another version). Same profile either way.

    ``success_rewards``: a dict to fill with the successes' ``reward`` column, as
    ``failures_as_zero_rows`` takes it (one read for both)."""
    succeeded = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED)
    # Ordered by the key only (no ``id``): unique for successes, and an index on (run, status, task,
    # rollout, profile_json) could then serve the whole read.
    stored = succeeded.order_by("task_index", "rollout_index").values_list(
        "id", "task_index", "rollout_index", "reward", "profile_json"
    )
    unread: list[int] = []
    for pk, task_index, rollout_index, reward, text in stored.iterator(chunk_size=2000):
        if success_rewards is not None:
            _keep_max(success_rewards, (task_index, rollout_index), reward)
        numbers = loads_profile_numbers(text)
        if numbers is None:
            unread.append(pk)
        else:
            yield ReducedRollout(task_index, rollout_index, numbers)
    for start in range(0, len(unread), CHUNK):
        for line in iter_successes(run, succeeded.filter(id__in=unread[start : start + CHUNK])):
            yield json.loads(line)


def run_materialized_rows(run: Run, agent_names: dict[int, str] | None = None) -> Iterator[dict[str, Any]]:
    """The run's ``<stem>_materialized_inputs.jsonl`` rows as dicts, equal to those of
    ``export.iter_materialized``: each (task, rollout) key's task row plus ``_ng_rollout_index``, in
    key order. Faster: the keys come from an index alone and the task rows are read beside them
    (both in task order), each parsed once instead of once per rollout. A key's task row is its
    run's task of that index, which is the rollouts' task in every run gymweb makes (``create_run``,
    the dispatcher's re-queued attempts and the importer all set both); a key without such a task
    takes its rollouts' as the export does. Rows of one task share the task row's nested values:
    read only.

    ``agent_names``: a dict to fill with ``{task_index: agent name}`` of the tasks read, as
    ``failures_as_zero_rows`` takes it (``_agent_names``, without parsing the task rows again)."""
    keys = (
        Rollout.objects.filter(run=run)
        .order_by("task_index", "rollout_index")
        .values_list("task_index", "rollout_index")
        .distinct()
    )
    tasks = (
        Task.objects.filter(run=run)
        .order_by("task_index")
        .values_list("task_index", "row_json")
        .iterator(chunk_size=CHUNK)
    )
    current = next(tasks, None)
    parsed_index, task_row = None, None
    for task_index, rollout_index in keys.iterator(chunk_size=2000):
        if task_index != parsed_index:
            while current is not None and current[0] < task_index:
                current = next(tasks, None)
            if current is not None and current[0] == task_index:
                parsed_index, task_row = task_index, json.loads(current[1])
                if agent_names is not None:
                    agent_names[task_index] = _agent_name(task_row, run)
            else:
                parsed_index, task_row = None, None
        if task_row is None:  # no task of this index in the run: not made by gymweb
            for line in _iter_materialized_key(run, task_index, rollout_index):
                yield json.loads(line)
            continue
        row = dict(task_row)
        row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
        yield row


def _iter_materialized_key(run: Run, task_index: int, rollout_index: int) -> Iterator[str]:
    """``export.iter_materialized``'s lines for one key (its rollouts' distinct task rows)."""
    fetch = (
        Rollout.objects.filter(run=run, task_index=task_index, rollout_index=rollout_index)
        .values_list("task__row_json", flat=True)
        .distinct()
    )
    for task_json in fetch:
        row = json.loads(task_json)
        row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
        yield json.dumps(row, ensure_ascii=False)


def profile_run(run: Run) -> tuple[ProfileResult, dict[str, Any]]:
    """Profile a stored run.

    Returns ``(result, extras)``: ``result`` is NeMo Gym's profile of the run's success rows
    (``export.iter_successes``) joined to its materialised rows (``export.iter_materialized``), with
    ``allow_partial_rollouts=True`` since keys that failed have no success row; ``extras`` is
    ``profile.gymweb_extras`` over ``failures_as_zero_rows(run)`` (pass@k with failures as 0), with
    ``extras["estimator"]["failures"]`` saying so.

    The database is read once: a success row is read as its stored numbers
    (``Rollout.profile_json``), never parsing its response, unless it has none: then its
    ``verify_json`` is parsed (``run_success_rows``); each task row is parsed once
    (``run_materialized_rows``), and the success rewards and agent names read on the way serve
    ``failures_as_zero_rows``. May emit NeMo Gym's ``UserWarning`` about repeats with missing
    rollouts.
    """
    with _gc_paused():
        rewards: dict[Key, float | None] = {}
        names: dict[int, str] = {}
        result = profile_rows(
            run_materialized_rows(run, names), run_success_rows(run, rewards), allow_partial_rollouts=True
        )
        extras = _extras(failures_as_zero_rows(run, success_rewards=rewards, agent_names=names))
        del rewards, names  # freed now, so the collector never has to look at them
    return result, extras


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (if it was on). Profiling a big run
    allocates a few hundred thousand long-lived objects that form no cycles; the collector would
    scan them again and again as they pile up (measured with benchmarks/bench_storage.py).
    Reference counting still frees everything as usual; the survivors are scanned once, when the
    collector is back on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def profile_paths(stem: str | Path) -> list[Path]:
    """The four files a profile writes for ``stem`` (``DIR/rollouts`` or ``DIR/rollouts.jsonl`` give
    ``DIR/rollouts_reward_profiling.jsonl``, ``..._agent_metrics.json``, ``..._repeat_level_metrics.json``,
    ``..._gymweb_pass_at_k.json``), in that order."""
    return [*profile_file_paths(stem), gymweb_extras_path(stem)]


def write_profile(
    result: ProfileResult, extras: dict[str, Any], stem: str | Path, *, overwrite: bool = False
) -> list[Path]:
    """Write a profile's four files for ``stem`` (``profile_paths``); directories are created.

    An existing file is never replaced unless ``overwrite``: all four are checked first, so a
    refusal (``outputs.OutputExists``) writes none of them. Returns the four paths in that order."""
    check_outputs(profile_paths(stem), overwrite)
    paths = list(write_profile_files(result, stem, overwrite=True))
    paths.append(write_gymweb_extras(extras, stem, overwrite=True))
    return paths


def write_run_profile(run: Run, output_dir: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Profile ``run`` and write the four files into ``output_dir`` (created when missing):
    ``rollouts_reward_profiling.jsonl``, ``rollouts_agent_metrics.json``,
    ``rollouts_repeat_level_metrics.json`` (NeMo Gym's names and layout) and
    ``rollouts_gymweb_pass_at_k.json`` (gymweb's). Existing files are kept unless ``overwrite``
    (``outputs.OutputExists``, checked before profiling). Returns the four paths in that order."""
    stem = Path(output_dir) / RUN_STEM
    check_outputs(profile_paths(stem), overwrite)
    result, extras = profile_run(run)
    return write_profile(result, extras, stem, overwrite=overwrite)


# ---------------------------------------------------------------------------------------------
# Files from anywhere (``gym eval profile --inputs M --rollouts R``)
# ---------------------------------------------------------------------------------------------


def iter_jsonl_objects(path: str | Path, *, require_indices: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the JSON object on each non-blank line of ``path``.

    Raises ``ProfileInputError`` naming the file and 1-based line for a line that is not JSON, not
    UTF-8, not a JSON object, or (``require_indices``) without ``_ng_task_index`` and
    ``_ng_rollout_index``; ``FileNotFoundError``/``IsADirectoryError`` as ``open`` does.
    """
    for line_no, _line, value in iter_objects(path, error=ProfileInputError):
        if require_indices and not (TASK_INDEX_KEY_NAME in value and ROLLOUT_INDEX_KEY_NAME in value):
            raise ProfileInputError(
                f"the row has no {TASK_INDEX_KEY_NAME}/{ROLLOUT_INDEX_KEY_NAME} "
                "(profiling joins inputs and rollouts on these two indices)",
                line_no,
                str(path),
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
            return row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]
        except KeyError:
            raise ProfileInputError(f"{what} row #{n} has no _ng_task_index/_ng_rollout_index") from None

    for n, row in enumerate(success_rows, 1):
        key = key_of(row, "rollout", n)
        keys[key] = {TASK_INDEX_KEY_NAME: key[0], ROLLOUT_INDEX_KEY_NAME: key[1], "reward": row.get("reward")}
        if isinstance(row.get("agent_ref"), dict):
            keys[key]["agent_ref"] = row["agent_ref"]
    for n, row in enumerate(failure_rows, 1):
        key = key_of(row, "failure", n)
        if key in keys:
            continue
        keys[key] = {TASK_INDEX_KEY_NAME: key[0], ROLLOUT_INDEX_KEY_NAME: key[1], "reward": 0.0}
        if isinstance(row.get("agent_ref"), dict):
            keys[key]["agent_ref"] = row["agent_ref"]
    return list(keys.values())  # gymweb_extras groups and orders them by task and rollout index


def files_profile(
    materialized_path: str | Path,
    rollouts_path: str | Path,
    *,
    failures_path: str | Path | None = None,
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
                iter_jsonl_objects(rollouts_path, require_indices=True),
                iter_jsonl_objects(failures_path, require_indices=True),
            )
        )
    return result, extras


def default_failures_path(rollouts_path: str | Path) -> Path:
    """The failures sidecar NeMo Gym writes beside ``rollouts_path`` (``foo.jsonl`` →
    ``foo_failures.jsonl``)."""
    p = Path(rollouts_path)
    stem = p.with_suffix("") if p.suffix == ".jsonl" else p
    return stem.parent / f"{stem.name}_failures.jsonl"


def output_stem_for(rollouts_path: str | Path, output_dir: str | Path | None = None) -> Path:
    """Where NeMo Gym writes a profile of ``rollouts_path``: beside it, named after its stem; with
    ``output_dir``, in that directory under the same names."""
    p = Path(rollouts_path)
    return Path(output_dir) / p.name if output_dir is not None else p


def write_files_profile(
    materialized_path: str | Path,
    rollouts_path: str | Path,
    *,
    output_dir: str | Path | None = None,
    failures_path: str | Path | None = None,
    allow_partial_rollouts: bool = False,
    overwrite: bool = False,
) -> tuple[ProfileResult, dict[str, Any], list[Path]]:
    """``files_profile`` and write the four files (see ``output_stem_for``). Returns
    ``(result, extras, paths)``; raises like ``files_profile``, and ``outputs.OutputExists`` before
    reading anything when an output exists and ``overwrite`` is False (without ``output_dir`` the
    files go beside the rollouts file, where NeMo Gym's own profile may already be)."""
    stem = output_stem_for(rollouts_path, output_dir)
    check_outputs(profile_paths(stem), overwrite)
    result, extras = files_profile(
        materialized_path, rollouts_path, failures_path=failures_path, allow_partial_rollouts=allow_partial_rollouts
    )
    return result, extras, write_profile(result, extras, stem, overwrite=overwrite)


# ---------------------------------------------------------------------------------------------
# A readable summary (the command prints it; a page can show the same lines)
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    """A number in the ``profile`` command's terminal lines: always four decimals (``0.5000``), ``n/a``
    for None, so the lines stay aligned; the pages trim zeros instead (``rollouts.display.number``)."""
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
        shown = (
            ", ".join(f"pass@{k} {_fmt(entry[f'pass@{k}'])}" for k in sorted({ks[0], ks[-1]})) if ks else "no rollouts"
        )
        basis = "failures as 0" if extras.get("estimator", {}).get("failures") else "success rows only"
        lines.append(f"agent {name}: {shown} over {entry.get('num_tasks', 0)} task(s) (gymweb pass@k, {basis})")
    return lines
