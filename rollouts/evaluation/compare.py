"""Comparing two stored runs on the same tasks: per-task reward, regressions, improvements (the
compare page). NeMo Gym's ``gym eval compare`` report is ``rollouts.evaluation.compare_report``.

Definitions (DESIGN.md, "Aggregates": reward with failures counted as 0):

- Tasks are paired by ``_ng_task_index`` (``Task.task_index``) and are **matched** (the same task)
  only when their task rows match (``task_difference``): ``responses_create_params`` (the prompt,
  tools and model parameters, as NeMo Gym's request model materialises them, so a dataset row and
  the echoed row of a result match; an input message's ``"type": "message"`` is its default) and
  every other task field both rows hold, compared as canonical JSON (keys sorted, a null field the
  same as an absent one). Never compared:
  bookkeeping keys (``_ng_*``, ``_gymweb_*``, ``agent_ref``), result fields (``reward``,
  ``response``, …), a field only one row holds (a result row may lack a field its env dropped),
  and, when a run's task rows were taken from its result rows (an import without the materialised
  inputs, where the env's verify fields sit beside the task's), every field but the prompt.
  A paired task whose rows differ is **mismatched**: listed with its first differing field, never
  counted as a regression or an improvement, and left out of every paired statistic.
- A (task, rollout) key counts when it finished: its success reward when it has a succeeded attempt,
  else 0.0 when it has a failed one (a success is always its key's latest attempt: no attempt
  follows a success). Keys with only pending, running, cancelled or interrupted rows do not count.
- A task's **mean reward** is the sum of its success rewards over its counted keys; ``None`` when no
  key of the task finished (the task is then **unfinished** in that run).
- ``delta = mean_b - mean_a``. Regressions (b < a) and improvements (b > a) are sorted by ``|delta|``,
  largest first, then by task index. Differences within ``TOLERANCE`` are unchanged.

Everything per task comes from one SQL aggregate per run (``values("task_index").annotate(...)``);
no Python loop ever walks the rollouts. The input check reads each task's row once (one row per
task, not per rollout).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db.models import Count, F, Q, Sum

from rollouts.collection.datasets import RESULT_FIELDS
from rollouts.engine.nemo_request import materialize
from rollouts.models import Rollout, Run, Task

__all__ = [
    "Comparison",
    "Pair",
    "TaskDelta",
    "TOLERANCE",
    "compare_runs",
    "matched_tasks",
    "task_difference",
    "pick_pair",
    "task_means",
]

S = Rollout.Status
FINISHED = (S.SUCCEEDED, S.FAILED)
TOLERANCE = 1e-12


@dataclass
class TaskDelta:
    """One task seen in both runs. Means are fractions of reward (failures as 0) over the counted
    keys (``keys_a``/``keys_b``); ``succeeded_*`` counts keys with a success."""

    task_index: int
    mean_a: float | None = None
    mean_b: float | None = None
    keys_a: int = 0
    keys_b: int = 0
    succeeded_a: int = 0
    succeeded_b: int = 0
    mismatched: bool = False
    difference: str = ""

    @property
    def delta(self) -> float | None:
        """``mean_b - mean_a``, or None when either side has no finished key."""
        if self.mean_a is None or self.mean_b is None:
            return None
        return self.mean_b - self.mean_a


@dataclass
class Comparison:
    """The outcome of ``compare_runs``. Lists hold ``TaskDelta`` objects (task indices for
    ``only_in_a``/``only_in_b``).

    ``tasks``: every task present in both runs, by task index. ``regressions`` / ``improvements`` /
    ``unchanged``: the comparable ones (both finished, inputs equal). ``unfinished``: in both runs,
    but without a finished key in at least one. ``mismatched``: the inputs differ. ``mean_a`` /
    ``mean_b``: mean of the per-task means over the comparable tasks (None when there are none).
    """

    run_a_id: int
    run_b_id: int
    tasks: list[TaskDelta] = field(default_factory=list)
    regressions: list[TaskDelta] = field(default_factory=list)
    improvements: list[TaskDelta] = field(default_factory=list)
    unchanged: list[TaskDelta] = field(default_factory=list)
    unfinished: list[TaskDelta] = field(default_factory=list)
    mismatched: list[TaskDelta] = field(default_factory=list)
    only_in_a: list[int] = field(default_factory=list)
    only_in_b: list[int] = field(default_factory=list)
    mean_a: float | None = None
    mean_b: float | None = None
    prompt_only: bool = False

    @property
    def matched(self) -> int:
        """How many paired tasks are the same task in both runs (their task rows match)."""
        return len(self.tasks) - len(self.mismatched)

    @property
    def comparable(self) -> int:
        """How many tasks entered ``mean_a``/``mean_b`` and the three delta lists."""
        return len(self.regressions) + len(self.improvements) + len(self.unchanged)

    @property
    def delta(self) -> float | None:
        """``mean_b - mean_a`` over the comparable tasks, or None."""
        if self.mean_a is None or self.mean_b is None:
            return None
        return self.mean_b - self.mean_a


def task_means(run: Run) -> dict[int, dict[str, Any]]:
    """Per task of ``run``: ``{"mean": float, "keys": n, "succeeded": n}`` over its finished keys
    (see the module docstring), from one SQL aggregate. Tasks without a finished key are absent."""
    rows = (
        Rollout.objects.filter(run=run, status__in=FINISHED)
        .values("task_index")
        .annotate(
            reward_sum=Sum("reward", filter=Q(status=S.SUCCEEDED)),
            succeeded=Count("id", filter=Q(status=S.SUCCEEDED)),
            keys=Count("rollout_index", distinct=True),
        )
        .order_by("task_index")
    )
    return {
        r["task_index"]: {
            "mean": float(r["reward_sum"] or 0.0) / r["keys"],
            "keys": r["keys"],
            "succeeded": r["succeeded"],
        }
        for r in rows
    }


def _inputs(run: Run) -> Iterator[tuple[int, str]]:
    """``(task_index, row_json)`` of the run's tasks, in task order, streamed."""
    return (
        Task.objects.filter(run=run)
        .order_by("task_index")
        .values_list("task_index", "row_json")
        .iterator(chunk_size=500)
    )


PROMPT_KEY = "responses_create_params"


def _bookkeeping(key: str) -> bool:
    return key.startswith(("_ng_", "_gymweb_")) or key == "agent_ref" or key in RESULT_FIELDS


def _canonical(value: Any) -> Any:
    """``value`` with null-valued object fields dropped, recursively (key order is left to
    ``json.dumps(sort_keys=True)``)."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _first_difference(a: Any, b: Any, path: str) -> str | None:
    """The dotted path of the first place ``a`` and ``b`` (canonical JSON values) differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}"
            found = _first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None if len(a) == len(b) else f"{path}[{min(len(a), len(b))}]"
    return None if a == b and type(a) is type(b) else path


def _strings(value: Any) -> list[str]:
    """The string leaves of a JSON value, in order (what materialising never changes in an input)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k in sorted(value) for s in _strings(value[k])]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _texts(params: Any) -> list[str]:
    items = params.get("input") if isinstance(params, dict) else None
    items = [items] if isinstance(items, str) else items if isinstance(items, list) else []
    return [s for item in items for s in _strings(item.get("content") if isinstance(item, dict) else item)]


def _canonical_prompt(params: Any) -> Any:
    """``_canonical(params)`` with each input message's default ``"type": "message"`` left out."""
    out = _canonical(params)
    if isinstance(out, dict) and isinstance(out.get("input"), list):
        out["input"] = [
            {k: v for k, v in i.items() if k != "type"}
            if isinstance(i, dict) and "role" in i and i.get("type") == "message"
            else i
            for i in out["input"]
        ]
    return out


def _prompt_difference(a: Any, b: Any) -> str | None:
    ca, cb = _canonical_prompt(a), _canonical_prompt(b)
    if ca == cb:
        return None
    if _texts(a) != _texts(b):  # the input's texts differ: no need to materialise to know it
        return _first_difference(ca, cb, PROMPT_KEY) or PROMPT_KEY
    ma, mb = _canonical_prompt(materialize(a)), _canonical_prompt(materialize(b))
    if ma == mb:
        return None
    return _first_difference(ma, mb, PROMPT_KEY) or PROMPT_KEY


def task_difference(row_a: dict[str, Any], row_b: dict[str, Any], prompt_only: bool = False) -> str | None:
    """Where two task rows differ as tasks (see the module docstring): None when they are the same
    task, else the first differing field as a dotted path (``responses_create_params.input[0].content``,
    ``expected_count``). ``prompt_only``: compare ``responses_create_params`` alone."""
    if PROMPT_KEY not in row_a or PROMPT_KEY not in row_b:
        if PROMPT_KEY in row_a or PROMPT_KEY in row_b:
            return PROMPT_KEY
    else:
        found = _prompt_difference(row_a[PROMPT_KEY], row_b[PROMPT_KEY])
        if found:
            return found
    if prompt_only:
        return None
    for key in sorted(set(row_a) & set(row_b)):
        if key == PROMPT_KEY or _bookkeeping(key):
            continue
        found = _first_difference(_canonical(row_a[key]), _canonical(row_b[key]), key)
        if found:
            return found
    return None


def rows_from_results(run: Run) -> bool:
    """True when ``run``'s task rows were taken from its result rows: an import without the
    materialised inputs (no rollout carries a materialised input line)."""
    if run.status != Run.Status.IMPORTED:
        return False
    return not Rollout.objects.filter(run=run, input_ordinal__isnull=False).exists()


def _row(row_json: str) -> dict[str, Any]:
    try:
        row = json.loads(row_json)
    except ValueError:
        return {}
    return row if isinstance(row, dict) else {}


def _walk_tasks(
    run_a: Run, run_b: Run, prompt_only: bool = False
) -> tuple[list[int], list[int], list[int], dict[int, str]]:
    """Merge the two runs' task lists (both sorted): (paired, only_in_a, only_in_b, {mismatched
    task: its first differing field})."""
    common: list[int] = []
    only_a: list[int] = []
    only_b: list[int] = []
    mismatched: dict[int, str] = {}
    it_a, it_b = _inputs(run_a), _inputs(run_b)
    a, b = next(it_a, None), next(it_b, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            only_a.append(a[0])
            a = next(it_a, None)
        elif a is None or b[0] < a[0]:
            only_b.append(b[0])
            b = next(it_b, None)
        else:
            common.append(a[0])
            if a[1] != b[1]:
                try:
                    found = task_difference(_row(a[1]), _row(b[1]), prompt_only)
                except RecursionError:  # nested past Python's limit: the rows' texts differ
                    found = "(a row nested too deep to compare)"
                if found:
                    mismatched[a[0]] = found
            a, b = next(it_a, None), next(it_b, None)
    return common, only_a, only_b, mismatched


def matched_tasks(run_a: Run, run_b: Run) -> set[int]:
    """The task indices that are the same task in both runs (paired and their rows match)."""
    common, _, _, mismatched = _walk_tasks(run_a, run_b, rows_from_results(run_a) or rows_from_results(run_b))
    return set(common) - set(mismatched)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compare_runs(run_a: Run, run_b: Run) -> Comparison:
    """Compare ``run_b`` against ``run_a`` task by task (see the module docstring for every rule).

    Returns a ``Comparison``. Two SQL aggregates (one per run), one ``exists`` per imported run,
    plus one streamed pass over each run's task rows; never loads a rollout.
    """
    prompt_only = rows_from_results(run_a) or rows_from_results(run_b)
    common, only_a, only_b, mismatched = _walk_tasks(run_a, run_b, prompt_only)
    means_a, means_b = task_means(run_a), task_means(run_b)
    out = Comparison(run_a_id=run_a.pk, run_b_id=run_b.pk, only_in_a=only_a, only_in_b=only_b, prompt_only=prompt_only)
    for task_index in common:
        a, b = means_a.get(task_index), means_b.get(task_index)
        t = TaskDelta(
            task_index=task_index, mismatched=task_index in mismatched, difference=mismatched.get(task_index, "")
        )
        if a is not None:
            t.mean_a, t.keys_a, t.succeeded_a = a["mean"], a["keys"], a["succeeded"]
        if b is not None:
            t.mean_b, t.keys_b, t.succeeded_b = b["mean"], b["keys"], b["succeeded"]
        out.tasks.append(t)
        if t.mismatched:
            out.mismatched.append(t)
        elif t.delta is None:
            out.unfinished.append(t)
        elif t.delta < -TOLERANCE:
            out.regressions.append(t)
        elif t.delta > TOLERANCE:
            out.improvements.append(t)
        else:
            out.unchanged.append(t)
    by_size = lambda t: (-abs(t.delta), t.task_index)  # noqa: E731
    out.regressions.sort(key=by_size)
    out.improvements.sort(key=by_size)
    comparable = out.regressions + out.improvements + out.unchanged
    out.mean_a = _mean([t.mean_a for t in comparable])
    out.mean_b = _mean([t.mean_b for t in comparable])
    return out


class Pair(NamedTuple):
    """One representative rollout (attempt row) of a task in each run; None when a run has none."""

    a: Rollout | None
    b: Rollout | None


def _representative(run: Run, task_index: int) -> Rollout | None:
    rows = Rollout.objects.filter(run=run, task_index=task_index)
    success = rows.filter(status=S.SUCCEEDED).order_by("rollout_index", "id").first()
    if success is not None:
        return success
    return rows.filter(status=S.FAILED).order_by(F("finished").desc(nulls_last=True), "-id").first()


def pick_pair(run_a: Run, run_b: Run, task_index: int) -> Pair:
    """The rollouts to show side by side for one task: in each run the first succeeded attempt by
    ``rollout_index``, else the latest failed one (by ``finished``, then id), else None (the task
    is absent, or nothing of it finished). Two small indexed queries per run."""
    return Pair(_representative(run_a, task_index), _representative(run_b, task_index))
