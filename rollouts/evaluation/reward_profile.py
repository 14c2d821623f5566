"""Reward profiling: NeMo Gym's ``gym eval profile``, computed with numpy and scipy and written with orjson.

Reference: ``nemo_gym/reward_profile.py`` and ``nemo_gym/cli/eval.py:reward_profile`` of nemo-gym 0.7.0.
NeMo Gym builds pandas DataFrames and lets pandas call numpy; here the same numpy functions are called
on the same values directly (see "Numerics" below), the Student-t intervals are
``scipy.stats.t.interval`` and the files are written with ``orjson.dumps``, as NeMo Gym does, so the
three files (``<stem>_reward_profiling.jsonl``, ``<stem>_agent_metrics.json``,
``<stem>_repeat_level_metrics.json``) are byte-identical to NeMo Gym's for the same input (checked
against its own output in ``tests/data/profile_fixture``). No Django.

What NeMo Gym computes, in short (every rule below is mirrored here):

* Rollout rows (``rollouts.jsonl``) are joined to the materialised inputs on
  ``(_ng_task_index, _ng_rollout_index)``. Duplicate keys on either side and rollout rows without a
  materialised input are errors; inputs without a rollout are an error unless
  ``allow_partial_rollouts`` (NeMo's ``++allow_partial_rollouts=True``).
* Rollouts whose ``mask_sample`` field is truthy are *masked*: they (and their input rows) leave the
  quality statistics, and the ``mask_sample`` field is stripped from the others. Agents with masked
  rollouts get ``coverage/*`` keys in the agent metrics.
* Profiled fields: every top-level field of a rollout row whose value is a number, plus every
  top-level numeric field of ``response.usage`` (``input_tokens``, ``output_tokens``,
  ``total_tokens``; the nested ``*_tokens_details`` are not numbers and are skipped). A usage field
  overrides a same-named top-level field. Booleans count as 0/1. Fields whose name starts with ``_``
  (``_ng_task_index``, ``_ng_rollout_index``, ``_ng_failure_*``, ...) are never profiled.
* Per task (``*_reward_profiling.jsonl``) and per agent (``*_agent_metrics.json``): ``mean``, ``max``,
  ``min``, ``median`` and ``std`` (ddof=1) of each field over the rollouts that have it; a statistic
  that is undefined (NaN) is left out. Quirk: ``std`` of a single value is NaN, but when *every*
  field's std is NaN (e.g. a task with one rollout), the fields present in every rollout of the group
  get ``std = 0.0``. ``max``/``min`` are floats unless every profiled field is an integer field
  (pandas' common dtype), then they are ints.
* Per task also: ``sample`` (the materialised input of the lowest completed rollout index, without
  the two indices), ``num_rollouts``, ``expected_num_rollouts``, ``missing_num_rollouts``,
  ``reward_profile_completion_pct`` and ``rollout_infos`` (one compact record per rollout, sorted by
  rollout index: ``rollout_id`` "task:rollout", the indices, the raw ``reward``, numeric usage fields,
  then the other numeric top-level fields).
* Per (agent, ``_ng_rollout_index``) — only for agents with at least two rollout indices —
  (``*_repeat_level_metrics.json``): ``sample_count`` (tasks in this repeat), ``missing_count`` (tasks
  the agent has in some other repeat but not this one) and, per field in sorted name order, ``mean``,
  ``median``, ``std`` (ddof=1, 0.0 for one value), ``sem`` = std/sqrt(n), ``min``, ``max``, ``p25``,
  ``p75`` (linear interpolation) and the Student-t 95% interval ``ci_low_95``/``ci_high_95`` (omitted
  for n <= 1; collapses to (mean, mean) with a warning when sem == 0).
* The per-repeat ``mean/<field>`` values are then summarised across repeats into the agent metrics:
  ``{mean,median,std,min,max,se}_across_repeats/mean/<field>`` and the Student-t 95% interval
  ``ci_{low,high}_95_across_repeats/mean/<field>`` (df = repeats - 1).
* Under "fan-out" (one task index run by several agents / environment servers) tasks are profiled per
  (task, agent) and each task row carries ``agent_ref``.

gymweb's own extras (pass@k, pass@1[avg-of-k]) are ``rollouts.evaluation.pass_at_k``, written to a
separate file, never inside NeMo Gym's files.

Memory: rollout rows are reduced to their numeric fields as they stream in (responses are not kept);
materialised rows are reduced to their keys plus one representative row per task.

Stored numbers: ``rollouts.collection.profile_numbers.profile_numbers(row)`` is that reduction of one
rollout row (everything the profiler reads from it apart from its key), small enough to store beside
the row; ``profile_rows`` takes ``ReducedRollout(task, rollout, numbers)`` in place of the row, with
the same results. gymweb stores it per success (``Rollout.profile_json``), so profiling a stored run
never parses a response.
"""

from __future__ import annotations

import operator
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Mapping as _MappingABC
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rollouts.collection.profile_numbers import row_numbers
from rollouts.collection.stamps import ENVIRONMENT_SERVER_KEY
from rollouts.evaluation.outputs import check_outputs, dumps, write_bytes
from rollouts.nemo.jsonl import iter_objects
from rollouts.nemo.keys import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.nemo.metrics_config import is_primary_metric

__all__ = [
    "ProfileResult",
    "profile_rows",
    "ReducedRollout",
    "profile_files",
    "write_profile_files",
    "profile_file_paths",
    "iter_jsonl",
    "label_runs",
    "agent_ref_name",
    "row_key",
    "stem_path",
]


_GROUP_STATS = ("mean", "max", "min", "median", "std")


# ---------------------------------------------------------------------------------------------
# Numerics: NeMo Gym's pandas/scipy statistics, computed with numpy and scipy.stats
# ---------------------------------------------------------------------------------------------
#
# pandas computes each statistic with numpy on the column's values (pandas.core.nanops, no
# bottleneck): a mean is the pairwise sum of the values (missing ones as 0.0) over their count; a
# std is the two-pass ``sqrt(sum((mean - v)**2) / (count - 1))``; a median is ``np.median`` /
# ``np.nanmedian``; a quantile ``np.percentile(..., method="linear")``. Calling the same numpy
# functions on the same values in the same layout (each group's values contiguous, so the
# reductions sum pairwise along them) gives the same bits. The Student-t intervals are
# ``scipy.stats.t.interval``, as in NeMo Gym. pandas itself is not needed.


def _block_stats(block: np.ndarray) -> tuple[np.ndarray, ...]:
    """``RewardProfiler.describe_dataframe``'s mean, max, min, median and std (ddof=1) of many groups
    of one size at once.

    ``block``: float64, shape (groups, columns, rows), C-contiguous, NaN for a missing value. Returns
    ``(mean, max, min, median, std, complete)``, each of shape (groups, columns): NaN where a
    statistic is undefined (no value; std of one value); ``complete`` is True where no value is
    missing."""
    n = block.shape[-1]
    missing = np.isnan(block)
    has_missing = bool(missing.any())
    if has_missing:
        count = n - np.count_nonzero(missing, axis=-1)
        filled = np.where(missing, 0.0, block)
    else:
        count = np.full(block.shape[:2], n)
        filled = block
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN is the answer
        mean = np.add.reduce(filled, axis=-1) / count
        squares = (mean[..., None] - filled) ** 2
        if has_missing:
            squares[missing] = 0.0
        std = np.sqrt(np.add.reduce(squares, axis=-1) / (count - 1))
        std[count <= 1] = np.nan
        maxs = np.fmax.reduce(block, axis=-1)
        mins = np.fmin.reduce(block, axis=-1)
        median = np.nanmedian(block, axis=-1) if has_missing else np.median(block, axis=-1)
    return mean, maxs, mins, median, std, count == n


def _describe_groups(matrix: np.ndarray, members: Sequence[Sequence[int]]) -> tuple[list[list[float]], ...]:
    """``describe_dataframe`` of each group of rows of ``matrix`` (float64, rows × columns, NaN =
    missing): ``(means, maxs, mins, medians, stds)`` as lists (one per group) of per-column floats,
    NaN where undefined. Groups are computed in batches of equal size. NeMo Gym's quirk is applied:
    when *every* std of a group is NaN, the columns with no missing value in that group get 0.0."""
    ngroups, ncols = len(members), matrix.shape[1]
    stats = [np.full((ngroups, ncols), np.nan) for _ in range(5)]
    complete = np.zeros((ngroups, ncols), dtype=bool)
    by_size: dict[int, list[int]] = defaultdict(list)
    for g, rows in enumerate(members):
        by_size[len(rows)].append(g)
    for size, gs in by_size.items():
        index = np.array([members[g] for g in gs], dtype=np.intp).reshape(len(gs), size)
        # (groups, rows, columns) -> (groups, columns, rows): each group's column contiguous, as in
        # pandas' blocks, so numpy sums it pairwise exactly as pandas does.
        block = np.ascontiguousarray(matrix[index].transpose(0, 2, 1))
        *values, full = _block_stats(block)
        for target, value in zip(stats, values):
            target[gs] = value
        complete[gs] = full
    std = stats[4]
    all_nan = np.isnan(std).all(axis=1)
    if all_nan.any():
        std[all_nan] = np.where(complete[all_nan], 0.0, np.nan)
    return tuple(s.tolist() for s in stats)


def _series_stats(values: np.ndarray) -> tuple[float, float, float, float, float]:
    """``(mean, median, std, min, max)`` of one column's present values (float64, 1-D, no NaN), as
    pandas' ``Series.mean()``/``median()``/``std(ddof=1)``/``min()``/``max()`` give them; std is
    0.0 for one value (NeMo Gym's ``if n > 1 else 0.0``)."""
    n = values.shape[0]
    mean = float(np.add.reduce(values) / n)
    if n > 1:
        std = float(np.sqrt(np.add.reduce((mean - values) ** 2) / (n - 1)))
    else:
        std = 0.0
    return mean, float(np.median(values)), std, float(values.min()), float(values.max())


_t_distribution = None


def _student_t():
    """``scipy.stats.t``, imported on first use (scipy.stats takes a noticeable time to import and
    only the repeat-level intervals need it)."""
    global _t_distribution
    if _t_distribution is None:
        from scipy import stats

        _t_distribution = stats.t
    return _t_distribution


def _confidence_interval(mean: float, sem: float, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """NeMo Gym's ``RewardProfiler._confidence_interval``: None for n <= 1, (mean, mean) with a
    warning for sem == 0, else ``scipy.stats.t.interval(confidence, df=n - 1, loc=mean, scale=sem)``."""
    if n <= 1:
        return None
    if sem == 0:
        warnings.warn(
            f"Standard error is 0 (all {n} values are identical) -- confidence interval "
            "collapses to a single point rather than being computed.",
            stacklevel=3,
        )
        return mean, mean
    low, high = _student_t().interval(confidence, df=n - 1, loc=mean, scale=sem)
    return float(low), float(high)


COLLAPSED_INTERVAL_NOTE = (
    "Some groups' rewards are all the same value, so their confidence interval is just that value "
    "(there is no spread to measure)."
)


def plain_notes(messages: Iterable[str]) -> list[str]:
    """The profiler's warnings for people, each once in first-seen order: the collapsed-interval
    warning (one per group, with its count) becomes one ``COLLAPSED_INTERVAL_NOTE``; others stay."""
    notes: dict[str, None] = {}
    for text in messages:
        notes[COLLAPSED_INTERVAL_NOTE if text.startswith("Standard error is 0") else text] = None
    return list(notes)


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Yield the JSON object of each non-blank line of a JSONL file (``jsonl.iter_objects``); a line
    that is not one raises ``JsonlError`` (a ``ValueError``) naming the file and line number."""
    for _number, _line, row in iter_objects(path):
        yield row


# ---------------------------------------------------------------------------------------------
# Run labels (nemo_gym/global_config.py: rollout_run_key / label_runs / rollout_run_labels)
# ---------------------------------------------------------------------------------------------


def agent_ref_name(row: Mapping[str, Any]) -> str | None:
    ref = row.get(AGENT_REF_KEY_NAME)
    return ref.get("name") if isinstance(ref, (dict, _MappingABC)) else None


def _rollout_run_key(row: Mapping[str, Any]) -> str | None:
    server = row.get(ENVIRONMENT_SERVER_KEY)
    if server is not None:
        return server
    return agent_ref_name(row)


def label_runs(agent_by_key: Mapping[Any, str | None]) -> dict[Any, Any]:
    """NeMo Gym's ``global_config.label_runs``: ``{run key: label}`` for ``{run key (environment
    server, else agent name): agent name}``. A run is labelled by its agent name unless another run
    has the same agent (two servers fronting one agent) or the label clashes with another run's
    key; then by its own key."""
    keys_by_agent: dict[str, set] = defaultdict(set)
    for key, agent_name in agent_by_key.items():
        if agent_name is not None:
            keys_by_agent[agent_name].add(key)
    labels = {
        key: agent_name if agent_name is not None and len(keys_by_agent[agent_name]) == 1 else key
        for key, agent_name in agent_by_key.items()
    }
    while True:
        counts = Counter(labels.values())
        clashing = [key for key, label in labels.items() if counts[label] > 1 and label != key]
        if not clashing:
            return labels
        for key in clashing:
            labels[key] = key


# ---------------------------------------------------------------------------------------------
# Profiling
# ---------------------------------------------------------------------------------------------


@dataclass
class ProfileResult:
    """What ``gym eval profile`` computes, ready to write.

    Attributes:
        reward_profiling: one dict per task (per (task, agent) under fan-out), sorted by task index:
            the lines of ``<stem>_reward_profiling.jsonl``.
        agent_metrics: list of one dict per agent (sorted by agent label): ``<stem>_agent_metrics.json``.
        repeat_level_metrics: list of one dict per (agent, ``_ng_rollout_index``):
            ``<stem>_repeat_level_metrics.json`` (empty when no agent has two repeats).
        completion_summary: NeMo Gym's printed completion summary (expected/completed/missing rollout
            rows, complete/partial/missing input tasks); not written to any NeMo Gym file.
        masked_rollouts: number of rollouts left out of the statistics because of ``mask_sample``.
    """

    reward_profiling: list[dict[str, Any]] = field(default_factory=list)
    agent_metrics: list[dict[str, Any]] = field(default_factory=list)
    repeat_level_metrics: list[dict[str, Any]] = field(default_factory=list)
    completion_summary: dict[str, Any] = field(default_factory=dict)
    masked_rollouts: int = 0


class _Result:
    """The part of one rollout row the profiler needs (the response itself is dropped)."""

    __slots__ = ("key", "names", "values", "info", "masked", "task_for_coverage")

    def __init__(self, key, names, values, info, masked, task_for_coverage):
        self.key = key
        self.names = names
        self.values = values
        self.info = info
        self.masked = masked
        self.task_for_coverage = task_for_coverage


def row_key(row: Mapping[str, Any], what: str, position: int) -> tuple[Any, Any]:
    try:
        return row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]
    except (KeyError, TypeError):
        raise ValueError(
            f"{what} #{position} has no {TASK_INDEX_KEY_NAME}/{ROLLOUT_INDEX_KEY_NAME}; "
            "profiling joins inputs and rollouts on these two indices"
        ) from None


def _result_of(
    key: tuple[Any, Any],
    masked: bool,
    names: Iterable[str],
    values: Iterable[Any],
    row_info: Mapping[str, Any],
    layouts: dict[tuple, tuple],
) -> _Result:
    """A ``_Result`` from a row's key and ``_row_numbers``. The info record starts with the key's
    ``rollout_id`` and indices, then takes the row's fields in order (a row field of the same name
    overrides a key field in place, as NeMo Gym's successive assignments do)."""
    task_idx, rollout_idx = key
    info: dict[str, Any] = {
        "rollout_id": f"{task_idx}:{rollout_idx}",
        TASK_INDEX_KEY_NAME: task_idx,
        ROLLOUT_INDEX_KEY_NAME: rollout_idx,
    }
    info.update(row_info)
    names_t = tuple(names)
    shared = layouts.get(names_t)
    if shared is None:
        layouts[names_t] = names_t
        shared = names_t
    # NeMo Gym counts coverage tasks by the row's own _ng_task_index: the key's first part.
    return _Result(key, shared, tuple(values), info, masked, task_idx)


def _reduce_result(result: Mapping[str, Any], key: tuple[Any, Any], layouts: dict[tuple, tuple]) -> _Result:
    """Keep only what NeMo Gym's profiler reads from a rollout row (``rollout_info_from_result`` and the
    numeric record of ``profile_from_data``)."""
    masked, names, values, info = row_numbers(result)
    return _result_of(key, masked, names, values, info, layouts)


class ReducedRollout(NamedTuple):
    """A rollout row given to ``profile_rows`` as its key and ``profile_numbers(row)``: profiles
    exactly like the row itself."""

    task_index: Any
    rollout_index: Any
    numbers: Mapping[str, Any]


def _reduce_numbers(reduced: ReducedRollout, key: tuple[Any, Any], layouts: dict[tuple, tuple]) -> _Result:
    numbers = reduced.numbers
    record = numbers["numbers"]
    return _result_of(key, numbers["masked"], record.keys(), record.values(), numbers["info"], layouts)


def profile_rows(
    materialized_rows: Iterable[Mapping[str, Any]],
    rollout_rows: Iterable[Mapping[str, Any] | ReducedRollout],
    *,
    allow_partial_rollouts: bool = False,
) -> ProfileResult:
    """Profile rollouts exactly like NeMo Gym 0.7.0's ``gym eval profile`` (``nemo_gym/reward_profile.py``).

    Args:
        materialized_rows: the materialised inputs (``<stem>_materialized_inputs.jsonl`` rows): dicts with
            ``_ng_task_index``, ``_ng_rollout_index`` and normally ``agent_ref``. Any iterable; consumed
            once, after ``rollout_rows``.
        rollout_rows: the rollouts (``rollouts.jsonl`` rows, successes only in NeMo Gym's convention): dicts
            with the two indices, ``reward``, ``response`` (only ``response.usage`` is read) and any other
            fields the env returned. Any order; consumed once, each row reduced to its numbers at once. A
            ``ReducedRollout`` (a row's key and ``profile_numbers(row)``) stands for its row: the results
            are the same, and rows and reduced rows may be mixed.
        allow_partial_rollouts: NeMo Gym's ``++allow_partial_rollouts``. False (NeMo's default): every
            materialised row needs a rollout, else ``ValueError``. True: inputs without a rollout (failed
            or unfinished rollouts) are left out of the statistics but still count in
            ``expected_num_rollouts``/``missing_num_rollouts``. gymweb runs that had failures need True.

    Returns:
        ProfileResult with the contents of NeMo Gym's three files (see ``write_profile_files``).

    Raises:
        ValueError: duplicate (task, rollout) keys, rollouts without a materialised input, rows without the
            indices, or (strict mode) inputs without a rollout.
    """
    # 1. Rollouts first, reduced to numbers (the big file: full responses are never kept).
    results, duplicate_result_key = _reduce_rollouts(rollout_rows)
    masked_keys = {k for k, r in results.items() if r.masked}

    # 2. Materialised rows, streamed: keys, run keys, one representative row per (task, run key).
    inputs = _read_inputs(materialized_rows, results, masked_keys)

    # 3. NeMo Gym's alignment checks (align_rows_and_results), in its order.
    _check_alignment(inputs, duplicate_result_key, results, allow_partial_rollouts)
    completion_summary = _completion_summary(inputs, results)
    # Coverage (coverage_by_agent): only when something was masked.
    coverage = _coverage(results, inputs.agent_name_of) if masked_keys else {}

    profile = ProfileResult(completion_summary=completion_summary, masked_rollouts=len(masked_keys))

    # 4. Labels and fan-out detection over the measured rows.
    labels = label_runs(inputs.agent_by_run_key)

    def label_of(run_key: Any) -> Any:
        return labels.get(run_key)

    tasks_measured_rows = {task for task, _ in inputs.expected_measured}
    per_agent = len({(task, label_of(rk)) for task, rk in inputs.expected_measured}) > len(tasks_measured_rows)

    aligned = sorted((results.keys() & inputs.row_keys) - masked_keys)
    if aligned:
        _profile_aligned(profile, aligned, results, inputs, label_of, per_agent)
    else:
        results.clear()
    _merge_coverage(profile.agent_metrics, coverage)
    return profile


def _reduce_rollouts(
    rollout_rows: Iterable[Mapping[str, Any] | ReducedRollout],
) -> tuple[dict[tuple[Any, Any], _Result], tuple[Any, Any] | None]:
    """Every rollout row (or ``ReducedRollout``) reduced to a ``_Result``, by key, and the first
    duplicate key (None when there is none; later duplicates are skipped)."""
    layouts: dict[tuple, tuple] = {}
    results: dict[tuple[Any, Any], _Result] = {}
    duplicate_result_key = None
    for position, result in enumerate(rollout_rows, 1):
        if isinstance(result, ReducedRollout):
            key = (result.task_index, result.rollout_index)
        else:
            key = row_key(result, "rollout row", position)
        if key in results:
            if duplicate_result_key is None:
                duplicate_result_key = key
            continue
        if isinstance(result, ReducedRollout):
            results[key] = _reduce_numbers(result, key, layouts)
        else:
            results[key] = _reduce_result(result, key, layouts)
    return results, duplicate_result_key


@dataclass
class _Inputs:
    """What profiling keeps of the materialised rows: their keys, each key's run key (environment
    server, else agent name) and agent name, the expected counts and one sample row per
    (task, run key)."""

    row_keys: set
    duplicate_row_key: tuple[Any, Any] | None
    run_key_of: dict[tuple[Any, Any], Any]
    agent_name_of: dict[tuple[Any, Any], Any]
    agent_by_run_key: dict[Any, str | None]  # measured rows only (rollout_run_labels)
    expected_measured: Counter  # (task, run_key) -> measured input rows
    expected_all: Counter  # (task, run_key) -> all input rows (completion summary)
    samples: dict[tuple[Any, Any], tuple[Any, dict[str, Any]]]  # (task, run_key) -> (rollout, row)
    completed_all: Counter  # (task, run_key) -> rollouts (completion summary)


def _read_inputs(
    materialized_rows: Iterable[Mapping[str, Any]],
    results: Mapping[tuple[Any, Any], _Result],
    masked_keys: set,
) -> _Inputs:
    """One pass over the materialised rows (see ``_Inputs``)."""
    row_keys: set = set()
    duplicate_row_key = None
    run_key_of: dict[tuple[Any, Any], Any] = {}
    agent_name_of: dict[tuple[Any, Any], Any] = {}
    interned: dict[Any, Any] = {}
    agent_by_run_key: dict[Any, str | None] = {}
    expected_measured: Counter = Counter()
    expected_all: Counter = Counter()
    samples: dict[tuple[Any, Any], tuple[Any, dict[str, Any]]] = {}
    completed_all: Counter = Counter()
    for position, row in enumerate(materialized_rows, 1):
        try:
            key = (row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME])
        except (KeyError, TypeError):
            key = row_key(row, "materialized input row", position)  # raises
        if key in row_keys:
            if duplicate_row_key is None:
                duplicate_row_key = key
            continue
        row_keys.add(key)
        # _rollout_run_key and agent_ref_name, inlined (this loop sees every key)
        ref = row.get(AGENT_REF_KEY_NAME)
        agent_name = ref.get("name") if isinstance(ref, (dict, _MappingABC)) else None
        run_key = row.get(ENVIRONMENT_SERVER_KEY)
        if run_key is None:
            run_key = agent_name
        run_key = interned.setdefault(run_key, run_key)
        agent_name = interned.setdefault(agent_name, agent_name)
        run_key_of[key] = run_key
        agent_name_of[key] = agent_name
        task_idx, rollout_idx = key
        group = (task_idx, run_key)
        expected_all[group] += 1
        completed = key in results
        if completed:
            completed_all[group] += 1
        if key in masked_keys:
            continue
        expected_measured[group] += 1
        if run_key is not None and run_key not in agent_by_run_key:
            agent_by_run_key[run_key] = agent_name
        if completed:
            _keep_sample(samples, group, rollout_idx, row)
    return _Inputs(
        row_keys,
        duplicate_row_key,
        run_key_of,
        agent_name_of,
        agent_by_run_key,
        expected_measured,
        expected_all,
        samples,
        completed_all,
    )


def _keep_sample(
    samples: dict[tuple[Any, Any], tuple[Any, dict[str, Any]]],
    group: tuple[Any, Any],
    rollout_idx: Any,
    row: Mapping[str, Any],
) -> None:
    """Keep ``row`` (without its two indices) as the group's sample when its rollout index is the lowest yet."""
    best = samples.get(group)
    if best is None or rollout_idx < best[0]:
        sample = dict(row)
        sample.pop(TASK_INDEX_KEY_NAME)
        sample.pop(ROLLOUT_INDEX_KEY_NAME)
        samples[group] = (rollout_idx, sample)


def _check_alignment(
    inputs: _Inputs,
    duplicate_result_key: tuple[Any, Any] | None,
    results: Mapping[tuple[Any, Any], _Result],
    allow_partial_rollouts: bool,
) -> None:
    """NeMo Gym's ``align_rows_and_results`` checks, in its order: ``ValueError`` for the first that fails."""
    if inputs.duplicate_row_key is not None:
        raise ValueError(f"Duplicate materialized input row for rollout key {inputs.duplicate_row_key}")
    if duplicate_result_key is not None:
        raise ValueError(f"Duplicate result row for rollout key {duplicate_result_key}")
    extra = sorted(results.keys() - inputs.row_keys)
    if extra:
        raise ValueError(
            "Rollout results contain rows with no matching materialized input rows. "
            f"Found {len(extra)} extra rollout rows. Extra rollout keys: {extra[:10]}"
        )
    missing = sorted(inputs.row_keys - results.keys())
    if missing and not allow_partial_rollouts:
        raise ValueError(
            "Materialized input rows and rollout results do not have matching rollout keys. "
            f"Missing rollout results for {len(missing)} materialized input rows. "
            f"Missing rollout keys: {missing[:10]}.\n\n"
            "Pass allow_partial_rollouts=True (NeMo Gym: ++allow_partial_rollouts=True) to profile "
            "completed rollouts from a partial collection."
        )


def _completion_summary(inputs: _Inputs, results: Mapping[tuple[Any, Any], _Result]) -> dict[str, Any]:
    """NeMo Gym's ``profile_completion_summary``: all rows and results, masked ones included
    (``completed_all`` was counted with the rows, every result having its row by now)."""
    complete_inputs = partial_inputs = missing_inputs = 0
    for group, expected_count in inputs.expected_all.items():
        done = inputs.completed_all[group]
        if done == expected_count:
            complete_inputs += 1
        elif done > 0:
            partial_inputs += 1
        else:
            missing_inputs += 1
    expected_rows = len(inputs.row_keys)
    return {
        "expected_rollout_rows": expected_rows,
        "completed_rollout_rows": len(results),
        "missing_rollout_rows": expected_rows - len(results),
        "extra_rollout_rows": 0,
        "reward_profile_completion_pct": 100.0 if expected_rows == 0 else 100.0 * len(results) / expected_rows,
        "total_input_rows": len(inputs.expected_all),
        "complete_input_rows": complete_inputs,
        "partial_input_rows": partial_inputs,
        "missing_input_rows": missing_inputs,
    }


def _coverage(
    results: Mapping[tuple[Any, Any], _Result], agent_name_of: Mapping[tuple[Any, Any], Any]
) -> dict[str, dict[str, Any]]:
    """NeMo Gym's ``coverage_by_agent``: ``coverage/*`` counts per agent with masked rollouts."""
    coverage: dict[str, dict[str, Any]] = {}
    per_agent_results: dict[str, list[_Result]] = defaultdict(list)
    for key in sorted(results):
        name = agent_name_of.get(key)
        if name is not None:
            per_agent_results[name].append(results[key])
    for name, records in per_agent_results.items():
        masked_records = [r for r in records if r.masked]
        if not masked_records:
            continue
        scored = [r for r in records if not r.masked]
        tasks_total = {r.task_for_coverage for r in records}
        tasks_measured = {r.task_for_coverage for r in scored}
        coverage[name] = {
            "coverage/measured_rollouts": len(scored),
            "coverage/masked_rollouts": len(masked_records),
            "coverage/measured_tasks": len(tasks_measured),
            "coverage/fully_masked_tasks": len(tasks_total - tasks_measured),
        }
    return coverage


def _merge_coverage(agent_metrics: list[dict[str, Any]], coverage: dict[str, dict[str, Any]]) -> None:
    """Coverage entries (nemo_gym/cli/eval.py): merged into the agent's entry, else appended."""
    for entry in agent_metrics:
        name = (entry.get(AGENT_REF_KEY_NAME) or {}).get("name")
        if name in coverage:
            entry.update(coverage.pop(name))
    for name, entry_coverage in coverage.items():
        agent_metrics.append({AGENT_REF_KEY_NAME: {"name": name}, **entry_coverage})


_by_rollout_index = operator.itemgetter(ROLLOUT_INDEX_KEY_NAME)


class _Frame(NamedTuple):
    """The aligned, measured rollouts as pandas' frame of them: ``values`` (float64, rows × columns,
    NaN where a row lacks the column) and, per row, its task, rollout index, agent label and info."""

    values: np.ndarray
    tasks: list[Any]
    rollouts: list[Any]
    agents: list[Any]
    infos: list[dict[str, Any]]
    all_int: bool  # every profiled column is an integer column (pandas' common dtype)


def _profile_aligned(
    profile: ProfileResult,
    aligned: list[tuple[Any, Any]],
    results: dict[tuple[Any, Any], _Result],
    inputs: _Inputs,
    label_of,
    per_agent: bool,
) -> None:
    col_index, columns = _columns(aligned, results)
    frame = _frame(aligned, results, col_index, columns, inputs.run_key_of, label_of)
    describe_into = _describer(columns, frame.all_int)
    _group_level(profile, frame, describe_into, inputs, label_of, per_agent)
    by_agent, agent_entries = _agent_level(profile, frame, describe_into)
    repeat_entries = _repeat_level(frame, columns, by_agent)
    incomplete = [e for e in repeat_entries if e["missing_count"] > 0]
    if incomplete:
        warnings.warn(
            f"{len(incomplete)} repeat(s) are missing rollouts for some tasks "
            f"(e.g. agent={incomplete[0][AGENT_REF_KEY_NAME]['name']!r}, "
            f"{ROLLOUT_INDEX_KEY_NAME}={incomplete[0][ROLLOUT_INDEX_KEY_NAME]}, "
            f"missing_count={incomplete[0]['missing_count']}). "
            "repeat_level_metrics statistics were computed from unequal sample sizes across "
            "repeats and may not be directly comparable, and agent_level_metrics may be biased "
            "toward whichever tasks happened to complete. Consider obtaining the missing rollouts "
            "before drawing conclusions from these metrics.",
            stacklevel=3,
        )
    profile.repeat_level_metrics = repeat_entries
    _add_across_repeats(agent_entries, repeat_entries)


def _columns(
    aligned: list[tuple[Any, Any]], results: Mapping[tuple[Any, Any], _Result]
) -> tuple[dict[str, int], list[str]]:
    """The profiled columns in order of first appearance (DataFrame.from_records), and each one's position."""
    col_index: dict[str, int] = {}
    columns: list[str] = []
    previous = None
    for key in aligned:
        names = results[key].names
        if names is previous:  # rows share their layout tuple (profile_rows interns it)
            continue
        previous = names
        for name in names:
            if name not in col_index:
                col_index[name] = len(columns)
                columns.append(name)
    return col_index, columns


def _frame(
    aligned: list[tuple[Any, Any]],
    results: dict[tuple[Any, Any], _Result],
    col_index: Mapping[str, int],
    columns: list[str],
    run_key_of: Mapping[tuple[Any, Any], Any],
    label_of,
) -> _Frame:
    """The ``_Frame`` of the aligned rollouts, taking (popping) each one's ``_Result``."""
    ncols = len(columns)
    matrix: list[list[float | None]] = []
    tasks: list[Any] = []
    rollouts: list[Any] = []
    agents: list[Any] = []
    infos: list[dict[str, Any]] = []
    # Each layout's column positions; None for the layout that is all the columns in order.
    full_layout = tuple(columns)
    positions: dict[tuple, list[int] | None] = {full_layout: None}
    label_by_run_key: dict[Any, Any] = {}
    for key in aligned:
        r = results.pop(key)
        names = r.names
        if names in positions:
            where = positions[names]
        else:
            where = positions[names] = [col_index[name] for name in names]
        if where is None:
            vec: list[float | None] = list(r.values)
        else:
            vec = [None] * ncols
            for c, v in zip(where, r.values):
                vec[c] = v
        matrix.append(vec)
        tasks.append(key[0])
        rollouts.append(key[1])
        run_key = run_key_of[key]
        if run_key in label_by_run_key:
            agents.append(label_by_run_key[run_key])
        else:
            agents.append(label_by_run_key.setdefault(run_key, label_of(run_key)))
        infos.append(r.info)
    all_int = _all_int_columns(matrix, ncols)
    # float64, NaN where a row lacks the column (None -> NaN), like pandas' frame of the records.
    values = np.array(matrix, dtype=np.float64).reshape(len(matrix), ncols)
    return _Frame(values, tasks, rollouts, agents, infos, all_int)


def _all_int_columns(matrix: list[list[float | None]], ncols: int) -> bool:
    """Whether every column holds an int in every row (pandas' int64 dtype for all of them)."""
    col_is_int = [True] * ncols
    for c in range(ncols):
        for vec in matrix:
            v = vec[c]
            if v is None or not isinstance(v, int):
                col_is_int[c] = False
                break
    return all(col_is_int)


def _describer(columns: list[str], all_int: bool):
    """``describe_into(entry, stats)``: a group's ``describe_dataframe`` statistics written into
    ``entry`` as ``<stat>/<column>``, undefined ones left out."""
    stat_names = [[f"{s}/{col}" for col in columns] for s in _GROUP_STATS]
    # max/min keep pandas' common dtype: ints only when every profiled column is an integer column.
    convert = (lambda v: int(v)) if all_int else (lambda v: v)

    def describe_into(entry: dict[str, Any], stats: Sequence[list[float]]) -> None:
        for s, (names, row) in enumerate(zip(stat_names, stats)):
            for name, v in zip(names, row):
                if v == v:  # NaN: undefined, left out like NeMo Gym's notna filter
                    entry[name] = convert(v) if s in (1, 2) else v

    return describe_into


def _group_level(
    profile: ProfileResult, frame: _Frame, describe_into, inputs: _Inputs, label_of, per_agent: bool
) -> None:
    """The ``*_reward_profiling.jsonl`` lines: one per task, or per (task, agent) under fan-out."""
    groups = _group_members(frame, per_agent)
    # group key -> (task, run_key) groups it is made of, for samples and expected counts
    parts: dict[Any, list[tuple[Any, Any]]] = defaultdict(list)
    for task, run_key in inputs.expected_measured:
        gk = (task, label_of(run_key)) if per_agent else task
        parts[gk].append((task, run_key))

    ordered_groups = sorted(groups)
    group_stats = _describe_groups(frame.values, [groups[gk] for gk in ordered_groups])
    for g, gk in enumerate(ordered_groups):
        members = groups[gk]
        entry: dict[str, Any] = {TASK_INDEX_KEY_NAME: gk[0] if per_agent else gk}
        describe_into(entry, [stat[g] for stat in group_stats])
        if per_agent:
            entry[AGENT_REF_KEY_NAME] = {"name": gk[1]}
        best, expected = _sample_and_expected(parts[gk], inputs)
        entry["sample"] = dict(best[1]) if best is not None else {}
        num_rollouts = len(members)
        entry["num_rollouts"] = num_rollouts
        entry["expected_num_rollouts"] = expected
        entry["missing_num_rollouts"] = expected - num_rollouts
        entry["reward_profile_completion_pct"] = 100.0 if expected == 0 else 100.0 * num_rollouts / expected
        entry["rollout_infos"] = sorted([frame.infos[i] for i in members], key=_by_rollout_index)
        profile.reward_profiling.append(entry)


def _group_members(frame: _Frame, per_agent: bool) -> dict[Any, list[int]]:
    """The frame's rows by task, or by (task, agent) under fan-out (rows without an agent left out,
    as pandas' groupby drops a NaN key)."""
    tasks, agents = frame.tasks, frame.agents
    groups: dict[Any, list[int]] = defaultdict(list)
    for i in range(len(tasks)):
        if per_agent:
            if agents[i] is None:
                continue  # pandas' groupby drops a NaN key
            groups[(tasks[i], agents[i])].append(i)
        else:
            groups[tasks[i]].append(i)
    return groups


def _sample_and_expected(
    parts: list[tuple[Any, Any]], inputs: _Inputs
) -> tuple[tuple[Any, dict[str, Any]] | None, int]:
    """A group's sample (the lowest rollout index's row over its (task, run key) parts) and its
    expected rollouts."""
    best = None
    expected = 0
    for part in parts:
        expected += inputs.expected_measured[part]
        candidate = inputs.samples.get(part)
        if candidate is not None and (best is None or candidate[0] < best[0]):
            best = candidate
    return best, expected


def _agent_level(
    profile: ProfileResult, frame: _Frame, describe_into
) -> tuple[dict[Any, list[int]], dict[Any, dict[str, Any]]]:
    """The ``*_agent_metrics.json`` entries, sorted by agent label; returns the frame's rows by agent
    and the entries by agent."""
    by_agent: dict[Any, list[int]] = defaultdict(list)
    for i, agent in enumerate(frame.agents):
        if agent is not None:
            by_agent[agent].append(i)
    agent_order = sorted(by_agent)
    agent_stats = _describe_groups(frame.values, [by_agent[agent] for agent in agent_order])
    agent_entries: dict[Any, dict[str, Any]] = {}
    for a, agent in enumerate(agent_order):
        entry: dict[str, Any] = {}
        describe_into(entry, [stat[a] for stat in agent_stats])
        entry[AGENT_REF_KEY_NAME] = {"name": agent}
        agent_entries[agent] = entry
        profile.agent_metrics.append(entry)
    return by_agent, agent_entries


def _repeat_level(frame: _Frame, columns: list[str], by_agent: Mapping[Any, list[int]]) -> list[dict[str, Any]]:
    """The ``*_repeat_level_metrics.json`` entries: per (agent, rollout index), for the agents with
    at least two rollout indices (agents sorted)."""
    tasks, rollouts = frame.tasks, frame.rollouts
    repeat_cols = sorted(range(len(columns)), key=lambda c: columns[c])
    multi = [a for a in sorted(by_agent) if len({rollouts[i] for i in by_agent[a]}) > 1]
    repeat_entries: list[dict[str, Any]] = []
    for agent in multi:
        members = by_agent[agent]
        total_tasks = len({tasks[i] for i in members})
        by_rollout: dict[Any, list[int]] = defaultdict(list)
        for i in members:
            by_rollout[rollouts[i]].append(i)
        for rollout_idx in sorted(by_rollout):
            group = by_rollout[rollout_idx]
            present_tasks = len({tasks[i] for i in group})
            entry = {
                AGENT_REF_KEY_NAME: {"name": agent},
                ROLLOUT_INDEX_KEY_NAME: int(rollout_idx),
                "sample_count": present_tasks,
                "missing_count": total_tasks - present_tasks,
            }
            rows = frame.values[np.array(group, dtype=np.intp)]
            for c in repeat_cols:
                _add_repeat_stats(entry, columns[c], rows[:, c])
            repeat_entries.append(entry)
    return repeat_entries


def _add_repeat_stats(entry: dict[str, Any], col: str, column: np.ndarray) -> None:
    """One column's statistics of one repeat (``RewardProfiler``'s repeat level), over its present values."""
    present = column[~np.isnan(column)]  # Series.dropna(): a new contiguous array
    n = present.shape[0]
    if n == 0:
        return
    mean, median, std, low, high = _series_stats(present)
    sem = std / n**0.5
    p25, p75 = np.percentile(present, (25.0, 75.0)).tolist()  # Series.quantile, linear
    entry[f"mean/{col}"] = mean
    entry[f"median/{col}"] = median
    entry[f"std/{col}"] = std
    entry[f"sem/{col}"] = sem
    entry[f"min/{col}"] = low
    entry[f"max/{col}"] = high
    entry[f"p25/{col}"] = p25
    entry[f"p75/{col}"] = p75
    ci = _confidence_interval(mean, sem, n)
    if ci:
        entry[f"ci_low_95/{col}"], entry[f"ci_high_95/{col}"] = ci


def _add_across_repeats(agent_entries: Mapping[Any, dict[str, Any]], repeat_entries: list[dict[str, Any]]) -> None:
    """NeMo Gym's ``_aggregate_repeat_level_metrics`` merged into the agent entries: each repeat's
    statistic (``mean/reward``, ...) is one observation, summarised across the agent's repeats as
    ``{mean,median,std,min,max,se}_across_repeats/<name>`` and the Student-t 95% interval
    ``ci_{low,high}_95_across_repeats/<name>`` (df = repeats - 1). Statistics of statistics
    (``std/``, ``p25/``, ...) are left out (``metrics_config.is_primary_metric``)."""
    if not repeat_entries:
        return
    across_cols: list[str] = []
    seen = set()
    for e in repeat_entries:
        for k, v in e.items():
            if k in seen:
                continue
            seen.add(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and is_primary_metric(k):
                across_cols.append(k)
    per_agent_entries: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in repeat_entries:
        per_agent_entries[e[AGENT_REF_KEY_NAME]["name"]].append(e)
    for agent in sorted(per_agent_entries):
        target = agent_entries.get(agent)
        if target is None:
            continue
        for col in across_cols:
            observed = [e[col] for e in per_agent_entries[agent] if col in e and e[col] == e[col]]
            n = len(observed)
            if n == 0:
                continue
            mean, median, std, low, high = _series_stats(np.array(observed, dtype=np.float64))
            se = std / n**0.5
            target[f"mean_across_repeats/{col}"] = mean
            target[f"median_across_repeats/{col}"] = median
            target[f"std_across_repeats/{col}"] = std
            target[f"min_across_repeats/{col}"] = low
            target[f"max_across_repeats/{col}"] = high
            target[f"se_across_repeats/{col}"] = se
            ci = _confidence_interval(mean, se, n)
            if ci:
                target[f"ci_low_95_across_repeats/{col}"], target[f"ci_high_95_across_repeats/{col}"] = ci


def profile_files(
    materialized_inputs_path: str | Path,
    rollouts_path: str | Path,
    *,
    allow_partial_rollouts: bool = False,
) -> ProfileResult:
    """``gym eval profile --inputs <materialized_inputs_path> --rollouts <rollouts_path>`` without writing:
    streams both JSONL files through ``profile_rows``."""
    return profile_rows(
        iter_jsonl(materialized_inputs_path),
        iter_jsonl(rollouts_path),
        allow_partial_rollouts=allow_partial_rollouts,
    )


def stem_path(output_stem: str | Path, tail: str, suffix: str) -> Path:
    p = Path(output_stem)
    if p.suffix == ".jsonl":
        # NeMo Gym: base_output_fpath.with_stem(stem + tail).with_suffix(suffix), base = rollouts.jsonl
        return p.with_stem(p.stem + tail).with_suffix(suffix)
    return p.with_name(p.name + tail + suffix)


def profile_file_paths(output_stem: str | Path) -> tuple[Path, Path, Path]:
    """The three NeMo Gym file paths for a stem: ``out/rollouts`` (or ``out/rollouts.jsonl``, as NeMo
    Gym takes it) gives ``out/rollouts_reward_profiling.jsonl``, ``out/rollouts_agent_metrics.json``,
    ``out/rollouts_repeat_level_metrics.json``."""
    return (
        stem_path(output_stem, "_reward_profiling", ".jsonl"),
        stem_path(output_stem, "_agent_metrics", ".json"),
        stem_path(output_stem, "_repeat_level_metrics", ".json"),
    )


def write_profile_files(
    result: ProfileResult, output_stem: str | Path, *, overwrite: bool = False
) -> tuple[Path, Path, Path]:
    """Write NeMo Gym's three profile files exactly as ``RewardProfiler.write_to_disk`` does.

    ``<stem>_reward_profiling.jsonl``: one compact JSON object per line, each line ending in ``\\n``.
    ``<stem>_agent_metrics.json`` and ``<stem>_repeat_level_metrics.json``: one compact JSON array, no
    trailing newline. Serialised with ``orjson.dumps``, as NeMo Gym does (``outputs.dumps``: NaN and
    infinities as ``null``).

    An existing file is never replaced unless ``overwrite`` (``outputs.OutputExists`` is raised
    before anything is written). Returns the three paths (reward profiling, agent metrics,
    repeat-level metrics).
    """
    paths = profile_file_paths(output_stem)
    check_outputs(paths, overwrite)
    reward_path, agent_path, repeat_path = paths
    write_bytes(reward_path, b"".join(dumps(row) + b"\n" for row in result.reward_profiling))
    write_bytes(agent_path, dumps(result.agent_metrics))
    write_bytes(repeat_path, dumps(result.repeat_level_metrics))
    return reward_path, agent_path, repeat_path
