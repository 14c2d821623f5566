"""rollouts.evaluation.compare: two runs on the same tasks, built directly in the database (no HTTP)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from rollouts.evaluation.compare import compare_runs, pick_pair, task_means
from rollouts.models import Rollout, Run, Task

pytestmark = pytest.mark.django_db
S = Rollout.Status


def build_run(name: str, tasks: dict, agent: str = "remote_agent") -> Run:
    """A run from ``{task_index: (input_text, [[attempt, ...] per rollout index])}``.

    An attempt is ``("s", reward)`` succeeded, ``("f",)`` failed, ``("p",)`` pending, ``("c",)``
    cancelled; attempts of a key are created in order (ids and ``finished`` increase).
    """
    run = Run.objects.create(name=name, status=Run.Status.COMPLETED, agent_name=agent)
    clock = timezone.now() - timedelta(hours=1)
    for task_index, (text, keys) in tasks.items():
        row = {
            "responses_create_params": {"input": [{"role": "user", "content": text}]},
            "_ng_task_index": task_index,
            "agent_ref": {"name": agent},
        }
        task = Task.objects.create(run=run, task_index=task_index, row_json=json.dumps(row))
        for rollout_index, attempts in enumerate(keys):
            number = 1
            for attempt in attempts:
                clock += timedelta(seconds=1)
                status = {"s": S.SUCCEEDED, "f": S.FAILED, "p": S.PENDING, "c": S.CANCELLED}[attempt[0]]
                Rollout.objects.create(
                    run=run,
                    task=task,
                    task_index=task_index,
                    rollout_index=rollout_index,
                    attempt=number,
                    status=status,
                    reward=attempt[1] if status == S.SUCCEEDED else (0.0 if status == S.FAILED else None),
                    finished=clock if status != S.PENDING else None,
                    failure_kind="agent_http_error" if status == S.FAILED else "",
                )
                number += status == S.FAILED
    run.num_tasks = len(tasks)
    run.save()
    return run


def ok(reward=1.0):
    return [("s", reward)]


FAIL = [("f",)]


@pytest.fixture
def runs_ab():
    a = build_run(
        "a",
        {
            0: ("add 1 then get the count", [ok(), ok()]),  # 1.0
            1: ("add 2 then get the count", [ok(), FAIL]),  # 0.5
            2: ("add 3 then get the count", [ok(), ok()]),  # 1.0
            3: ("add 4 then get the count", [FAIL, FAIL]),  # 0.0
            4: ("add 5 then get the count", [ok(), ok()]),  # 1.0
            5: ("only in a", [ok()]),
        },
    )
    b = build_run(
        "b",
        {
            0: ("add 1 then get the count", [ok(), ok()]),  # 1.0  unchanged
            1: ("add 2 then get the count", [FAIL, FAIL]),  # 0.0  regression -0.5
            2: ("add 3 then get the count", [[("f",), ("s", 1.0)], FAIL]),  # 0.5  regression -0.5 (retry succeeded)
            3: ("add 4 then get the count", [ok(0.25), ok()]),  # 0.625 improvement
            4: ("a different task", [FAIL, FAIL]),  # mismatched
            6: ("only in b", [ok()]),
        },
    )
    return a, b


def test_task_means_count_failures_as_zero_and_a_retried_success_once():
    run = build_run("r", {0: ("t", [[("f",), ("f",), ("s", 0.5)], FAIL, ok(1.0)])})
    assert task_means(run) == {0: {"mean": 0.5, "keys": 3, "succeeded": 2}}


def test_keys_that_never_finished_do_not_count_and_a_task_without_any_is_absent():
    run = build_run("r", {0: ("t", [ok(1.0), [("p",)], [("c",)]]), 1: ("u", [[("p",)]])})
    assert task_means(run) == {0: {"mean": 1.0, "keys": 1, "succeeded": 1}}


def test_regressions_are_listed_largest_drop_first(runs_ab):
    cmp = compare_runs(*runs_ab)
    assert [(t.task_index, t.delta) for t in cmp.regressions] == [(1, -0.5), (2, -0.5)]
    assert cmp.regressions[1].mean_a == 1.0 and cmp.regressions[1].mean_b == 0.5
    assert cmp.regressions[1].keys_b == 2 and cmp.regressions[1].succeeded_b == 1


def test_improvements_and_unchanged_tasks_are_separated(runs_ab):
    cmp = compare_runs(*runs_ab)
    assert [(t.task_index, t.delta) for t in cmp.improvements] == [(3, 0.625)]
    assert [t.task_index for t in cmp.unchanged] == [0]


def test_tasks_only_in_one_run_are_reported_on_their_side(runs_ab):
    cmp = compare_runs(*runs_ab)
    assert cmp.only_in_a == [5] and cmp.only_in_b == [6]
    assert [t.task_index for t in cmp.tasks] == [0, 1, 2, 3, 4]


def test_a_task_whose_input_differs_is_mismatched_and_not_a_regression(runs_ab):
    cmp = compare_runs(*runs_ab)
    assert [t.task_index for t in cmp.mismatched] == [4]
    assert cmp.mismatched[0].mismatched and cmp.mismatched[0].delta == -1.0
    assert 4 not in [t.task_index for t in cmp.regressions]


def test_the_overall_means_cover_only_the_comparable_tasks(runs_ab):
    cmp = compare_runs(*runs_ab)
    assert cmp.comparable == 4
    assert cmp.mean_a == pytest.approx((1.0 + 0.5 + 1.0 + 0.0) / 4)
    assert cmp.mean_b == pytest.approx((1.0 + 0.0 + 0.5 + 0.625) / 4)
    assert cmp.delta == pytest.approx(cmp.mean_b - cmp.mean_a)


def test_a_task_unfinished_in_one_run_is_neither_better_nor_worse():
    a = build_run("a", {0: ("t", [ok()])})
    b = build_run("b", {0: ("t", [[("p",)]])})
    cmp = compare_runs(a, b)
    assert [t.task_index for t in cmp.unfinished] == [0]
    assert cmp.unfinished[0].delta is None and cmp.unfinished[0].mean_b is None
    assert cmp.regressions == [] and cmp.mean_a is None


def test_the_same_input_written_with_other_keys_or_agent_is_not_a_mismatch():
    a = build_run("a", {0: ("t", [ok()])}, agent="one")
    b = build_run("b", {0: ("t", [FAIL])}, agent="two")
    cmp = compare_runs(a, b)
    assert cmp.mismatched == [] and [t.task_index for t in cmp.regressions] == [0]


def test_it_runs_a_fixed_number_of_queries_however_many_rollouts_there_are():
    def queries(repeats: int) -> int:
        a = build_run("a", {i: (f"t{i}", [ok()] * repeats) for i in range(3)})
        b = build_run("b", {i: (f"t{i}", [FAIL] * repeats) for i in range(3)})
        with CaptureQueriesContext(connection) as ctx:
            compare_runs(a, b)
        return len(ctx.captured_queries)

    assert queries(1) == queries(12)


def test_pick_pair_prefers_the_first_success_by_rollout_index():
    a = build_run("a", {0: ("t", [FAIL, ok(0.5), ok(1.0)])})
    b = build_run("b", {0: ("t", [[("f",), ("s", 0.75)], ok(1.0)])})
    pair = pick_pair(a, b, 0)
    assert (pair.a.rollout_index, pair.a.reward) == (1, 0.5)
    assert (pair.b.rollout_index, pair.b.attempt, pair.b.status) == (0, 2, S.SUCCEEDED)


def test_pick_pair_falls_back_to_the_latest_failure_and_to_none():
    a = build_run("a", {0: ("t", [[("f",), ("f",)], FAIL])})
    b = build_run("b", {0: ("t", [[("p",)]])})
    pair = pick_pair(a, b, 0)
    latest = Rollout.objects.filter(run=a, status=S.FAILED).order_by("-finished").first()
    assert pair.a == latest and pair.a.rollout_index == 1
    assert pair.b is None
    assert pick_pair(a, b, 99) == (None, None)
