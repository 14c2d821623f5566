"""Comparing two stored runs on the same tasks: per-task reward, regressions, improvements (the
compare page). NeMo Gym's ``gym eval compare`` report is ``rollouts.evaluation.compare_report``.

Definitions (DESIGN.md, "Aggregates": reward with failures counted as 0):

- Tasks are matched by ``_ng_task_index`` (``Task.task_index``). A task whose
  ``responses_create_params.input`` differs between the runs is **mismatched**: it is listed, but
  not counted as a regression or improvement, since the two runs did not solve the same task.
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

from rollouts.models import Rollout, Run, Task

__all__ = [
    "Comparison",
    "Pair",
    "TaskDelta",
    "TOLERANCE",
    "compare_runs",
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


def _input_of(row_json: str) -> Any:
    row = json.loads(row_json)
    params = row.get("responses_create_params")
    return params.get("input") if isinstance(params, dict) else None


def _walk_tasks(run_a: Run, run_b: Run) -> tuple[list[int], list[int], list[int], set[int]]:
    """Merge the two runs' task lists (both sorted): (common, only_in_a, only_in_b, mismatched)."""
    common: list[int] = []
    only_a: list[int] = []
    only_b: list[int] = []
    mismatched: set[int] = set()
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
            if a[1] != b[1] and _input_of(a[1]) != _input_of(b[1]):
                mismatched.add(a[0])
            a, b = next(it_a, None), next(it_b, None)
    return common, only_a, only_b, mismatched


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compare_runs(run_a: Run, run_b: Run) -> Comparison:
    """Compare ``run_b`` against ``run_a`` task by task (see the module docstring for every rule).

    Returns a ``Comparison``. Two SQL aggregates (one per run) plus one streamed pass over each
    run's task rows; never loads a rollout.
    """
    common, only_a, only_b, mismatched = _walk_tasks(run_a, run_b)
    means_a, means_b = task_means(run_a), task_means(run_b)
    out = Comparison(run_a_id=run_a.pk, run_b_id=run_b.pk, only_in_a=only_a, only_in_b=only_b)
    for task_index in common:
        a, b = means_a.get(task_index), means_b.get(task_index)
        t = TaskDelta(task_index=task_index, mismatched=task_index in mismatched)
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
