"""gymweb's pass@k: per task and per agent, for k = 1..n, written to ``<stem>_gymweb_pass_at_k.json``
(never inside NeMo Gym's files). Fractions in [0, 1].

* ``pass_at_k``: the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` for binary rewards; for continuous
  ones the expected maximum of k rewards drawn without replacement (or NeMo Gym's max of the first k).
* ``pass_at_1_avg_of_k``: the mean reward of the first k rollouts.
* ``gymweb_extras``: both for every task and k, and their means per agent, from a ``ProfileResult``
  or rollout rows (``{"estimator", "per_task", "overall"}``). No Django.
"""

from __future__ import annotations

import math
import operator
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Mapping as _MappingABC
from pathlib import Path
from typing import Any

from rollouts.evaluation.outputs import check_outputs, dumps, write_bytes
from rollouts.evaluation.reward_profile import ProfileResult, agent_ref_name, row_key, stem_path
from rollouts.nemo.keys import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "pass_at_k",
    "pass_at_1_avg_of_k",
    "gymweb_extras",
    "gymweb_extras_path",
    "write_gymweb_extras",
]


def _check_rewards(rewards: Sequence[Any], k: int, what: str) -> list[float]:
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"{what}: k must be an integer, got {k!r}")
    values: list[float] = []
    for r in rewards:
        if isinstance(r, bool):
            values.append(float(r))
        elif isinstance(r, (int, float)) and math.isfinite(r):
            values.append(float(r))
        else:
            raise ValueError(f"{what}: rewards must be finite numbers, got {r!r}")
    n = len(values)
    if k < 1:
        raise ValueError(f"{what}: k must be >= 1, got k={k}")
    if n == 0:
        raise ValueError(f"{what}: no rewards (n=0)")
    if k > n:
        raise ValueError(f"{what}: k={k} is larger than the number of rollouts n={n}; it needs k <= n")
    return values


def _is_binary(values: Sequence[float]) -> bool:
    return all(v == 0.0 or v == 1.0 for v in values)


def pass_at_k(rewards: Sequence[float], k: int, *, continuous: str = "expected_max") -> float:
    """pass@k of one task from its n rollout rewards, as a fraction in [0, 1].

    * Binary rewards (every value 0 or 1, bools allowed): the unbiased combinatorial estimator
      ``1 - C(n-c, k) / C(n, k)`` with c = number of 1s (Chen et al. 2021; the same formula as NeMo Gym's
      ``compute_pass_majority_metrics``, which reports it in percent).
    * Continuous rewards, ``continuous="expected_max"`` (default, gymweb's choice): the expected maximum
      of k rewards drawn without replacement, ``sum_i r_(i) * C(i-1, k-1) / C(n, k)`` over the rewards
      sorted ascending. It does not depend on rollout order and equals the binary estimator on 0/1 data.
    * ``continuous="first_k"``: max of the first k rewards, NeMo Gym's convention for non-binary scores
      (order-dependent: pass the rewards in ``_ng_rollout_index`` order).

    Raises:
        ValueError: k < 1, k > n (``k=5 is larger than the number of rollouts n=4``), no rewards, a
            non-numeric or non-finite reward, or an unknown ``continuous`` mode.
    """
    values = _check_rewards(rewards, k, "pass_at_k")
    binary = _is_binary(values)
    return _pass_at_k_of(values, k, continuous, binary, sum(1 for v in values if v == 1.0) if binary else 0)


def _pass_at_k_of(values: Sequence[float], k: int, continuous: str, binary: bool, passed: int) -> float:
    """``pass_at_k`` of checked rewards (floats, 1 <= k <= n), given ``_is_binary(values)`` and, when
    binary, the number of 1s: computed once per task by ``gymweb_extras`` for every k."""
    n = len(values)
    if binary:
        if n - passed < k:
            return 1.0
        return 1.0 - math.comb(n - passed, k) / math.comb(n, k)
    if continuous == "first_k":
        return max(values[:k])
    if continuous != "expected_max":
        raise ValueError(f"pass_at_k: continuous must be 'expected_max' or 'first_k', got {continuous!r}")
    ordered = sorted(values)
    total = math.comb(n, k)
    return math.fsum(v * (math.comb(i, k - 1) / total) for i, v in enumerate(ordered) if i >= k - 1)


def pass_at_1_avg_of_k(rewards: Sequence[float], k: int) -> float:
    """pass@1[avg-of-k]: the mean reward of the first k rollouts (pass them in ``_ng_rollout_index``
    order), as in NeMo Gym's ``compute_pass_majority_metrics`` (which reports percent; this is a
    fraction). Raises ValueError for k < 1 or k > n, like ``pass_at_k``."""
    values = _check_rewards(rewards, k, "pass_at_1_avg_of_k")
    return math.fsum(values[:k]) / k


def _extras_groups(
    source: ProfileResult | Iterable[Mapping[str, Any]],
) -> list[tuple[Any, str | None, list[Any]]]:
    """(task, agent name, rewards in rollout-index order) per task."""
    groups: list[tuple[Any, str | None, list[Any]]] = []
    row: Mapping[str, Any]
    if isinstance(source, ProfileResult):
        for row in source.reward_profiling:
            agent = (row.get(AGENT_REF_KEY_NAME) or {}).get("name")
            if agent is None:
                agent = agent_ref_name(row.get("sample") or {})
            infos = sorted(row.get("rollout_infos") or [], key=lambda r: r[ROLLOUT_INDEX_KEY_NAME])
            groups.append((row[TASK_INDEX_KEY_NAME], agent, [info.get("reward") for info in infos]))
        return groups
    collected: dict[tuple[Any, str | None], list[tuple[Any, Any]]] = defaultdict(list)
    for position, row in enumerate(source, 1):
        try:
            task_idx, rollout_idx = row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]
        except (KeyError, TypeError):
            task_idx, rollout_idx = row_key(row, "rollout row", position)  # raises
        ref = row.get(AGENT_REF_KEY_NAME)  # agent_ref_name, inlined
        agent = ref.get("name") if isinstance(ref, (dict, _MappingABC)) else None
        collected[(task_idx, agent)].append((rollout_idx, row.get("reward")))
    first = operator.itemgetter(0)
    for task_idx, agent in sorted(collected, key=lambda g: (g[0], "" if g[1] is None else g[1])):
        pairs = sorted(collected[(task_idx, agent)], key=first)
        groups.append((task_idx, agent, [r for _, r in pairs]))
    return groups


_PASS_AT_LABELS: list[tuple[str, str]] = []  # k - 1 -> ("pass@k", "pass@1[avg-of-k]")


def _pass_at_labels(n: int) -> list[tuple[str, str]]:
    while len(_PASS_AT_LABELS) < n:
        k = len(_PASS_AT_LABELS) + 1
        _PASS_AT_LABELS.append((f"pass@{k}", f"pass@1[avg-of-{k}]"))
    return _PASS_AT_LABELS


def gymweb_extras(
    source: ProfileResult | Iterable[Mapping[str, Any]], *, continuous: str = "expected_max"
) -> dict[str, Any]:
    """gymweb's own per-task and overall pass@k, for k = 1..n (fractions in [0, 1]).

    Args:
        source: a ``ProfileResult`` (successful rollouts, from their ``rollout_infos``) or rollout rows
            (dicts with ``_ng_task_index``, ``_ng_rollout_index``, ``reward`` and optionally ``agent_ref``).
            Pass the failures sidecar rows too (reward 0.0) to count failures as 0.
        continuous: how non-binary rewards are scored (see ``pass_at_k``).

    Returns:
        ``{"estimator": {...}, "per_task": [...], "overall": [...]}``. Each per-task entry has
        ``_ng_task_index``, ``agent_ref`` (when known), ``num_rollouts``, ``binary``, ``num_passed``
        (binary only), ``skipped_rewards`` (non-numeric rewards left out), ``pass@k`` and
        ``pass@1[avg-of-k]`` for k = 1..num_rollouts. Each overall entry (one per agent) has ``num_tasks``
        and, for each k, the mean over the tasks with at least k rollouts (``pass@k``,
        ``pass@1[avg-of-k]``) and how many tasks that was (``num_tasks@k``).
    """
    per_task: list[dict[str, Any]] = []
    sums: dict[str | None, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    avg_sums: dict[str | None, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    task_counts: Counter = Counter()
    agent_order: list[str | None] = []
    for task_idx, agent, raw in _extras_groups(source):
        rewards = [float(r) for r in raw if isinstance(r, (int, float)) and (isinstance(r, bool) or math.isfinite(r))]
        entry: dict[str, Any] = {TASK_INDEX_KEY_NAME: task_idx}
        if agent is not None:
            entry[AGENT_REF_KEY_NAME] = {"name": agent}
        n = len(rewards)
        binary = n > 0 and _is_binary(rewards)
        entry["num_rollouts"] = n
        entry["binary"] = binary
        passed = sum(1 for r in rewards if r == 1.0) if binary else 0
        if binary:
            entry["num_passed"] = passed
        entry["skipped_rewards"] = len(raw) - n
        if agent not in task_counts:
            agent_order.append(agent)
        task_counts[agent] += 1
        # rewards are finite floats and 1 <= k <= n: pass_at_k's and pass_at_1_avg_of_k's checks hold
        labels = _pass_at_labels(n)
        agent_sums = sums[agent]
        for k in range(1, n + 1):
            value = _pass_at_k_of(rewards, k, continuous, binary, passed)
            entry[labels[k - 1][0]] = value
            agent_sums[k].append(value)
        agent_avg_sums = avg_sums[agent]
        for k in range(1, n + 1):
            value = math.fsum(rewards[:k]) / k
            entry[labels[k - 1][1]] = value
            agent_avg_sums[k].append(value)
        per_task.append(entry)
    overall: list[dict[str, Any]] = []
    for agent in sorted(agent_order, key=lambda a: "" if a is None else a):
        entry = {}
        if agent is not None:
            entry[AGENT_REF_KEY_NAME] = {"name": agent}
        entry["num_tasks"] = task_counts[agent]
        for k in sorted(sums[agent]):
            values = sums[agent][k]
            entry[f"pass@{k}"] = math.fsum(values) / len(values)
        for k in sorted(avg_sums[agent]):
            values = avg_sums[agent][k]
            entry[f"pass@1[avg-of-{k}]"] = math.fsum(values) / len(values)
        for k in sorted(sums[agent]):
            entry[f"num_tasks@{k}"] = len(sums[agent][k])
        overall.append(entry)
    return {
        "estimator": {
            "binary": "unbiased 1 - C(n-c,k)/C(n,k)",
            "continuous": (
                "expected max of k rewards drawn without replacement"
                if continuous == "expected_max"
                else "max of the first k rewards (NeMo Gym's convention)"
            ),
            "pass@1[avg-of-k]": "mean reward of the first k rollouts",
            "units": "fraction in [0, 1]",
            "overall": "mean over the tasks with at least k rollouts",
        },
        "per_task": per_task,
        "overall": overall,
    }


def write_gymweb_extras(
    source: ProfileResult | Iterable[Mapping[str, Any]] | dict[str, Any],
    output_stem: str | Path,
    *,
    continuous: str = "expected_max",
    overwrite: bool = False,
) -> Path:
    """Write gymweb's pass@k extras to ``gymweb_extras_path(output_stem)`` (same stem rules and
    compact layout as ``write_profile_files``; never over an existing file unless ``overwrite``).
    ``source`` is whatever ``gymweb_extras`` takes, or its result."""
    if isinstance(source, dict) and "per_task" in source and "overall" in source:
        extras = source
    else:
        extras = gymweb_extras(source, continuous=continuous)  # type: ignore[arg-type]
    (path,) = check_outputs([gymweb_extras_path(output_stem)], overwrite)
    return write_bytes(path, dumps(extras))


def gymweb_extras_path(output_stem: str | Path) -> Path:
    """``<stem>_gymweb_pass_at_k.json`` (stem rules of ``profile_file_paths``)."""
    return stem_path(output_stem, "_gymweb_pass_at_k", ".json")
