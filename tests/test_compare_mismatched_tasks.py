"""Comparing runs of different datasets: tasks paired by index are the same task only when their
task rows match, and the deltas, the paired interval and gymweb's flips use only those."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts.evaluation import compare_report, compare_sides
from rollouts.evaluation.compare import compare_runs, task_difference
from rollouts.models import Run

pytestmark = pytest.mark.django_db


def _import(path, name):
    call_command("import_rollouts", str(path), "--name", name, "--no-health-check")
    return Run.objects.get(name=name)


def _report(a, b):
    report = compare_report.compare_sides(
        compare_sides.side_from_run(a, "baseline"), [compare_sides.side_from_run(b, "candidate")]
    )
    return report, report["gymweb"]["paired_intervals"][0]["candidates"][0]


def test_runs_of_two_different_datasets_have_no_common_task(signed_in, shared_data):
    a = _import(shared_data / "example_single_tool_call" / "example_rollouts.jsonl", "single")
    b = _import(shared_data / "example_multi_step" / "example_rollouts.jsonl", "multi")
    cmp = compare_runs(a, b)
    assert len(cmp.tasks) == 5 and cmp.matched == 0 and len(cmp.mismatched) == 5
    assert cmp.comparable == 0 and cmp.delta is None
    assert cmp.mismatched[0].difference.startswith("responses_create_params.input[0]")
    report, paired = _report(a, b)
    assert paired["tasks"] == 0 and paired["delta"] is None and paired["ci_low"] is None
    assert paired["matched_flips"]["common_task_count"] == 0
    # NeMo Gym's own flips still pair by index: unchanged
    assert report["comparisons"][0]["flips"][0]["common_task_count"] == 5
    page = signed_in.get(reverse("compare"), {"a": a.pk, "b": b.pk}).content.decode()
    matched = page[page.index('id="compare-matched"') :][:600]
    assert "0 <span" in matched and "of 5 paired by index" in matched and "5 with task rows that differ" in matched
    assert "responses_create_params.input[0]" in matched
    assert "resamples of the 0 matched tasks" in page
    assert "pair tasks by <code>_ng_task_index</code> alone (5 paired, 5 of them with task rows that differ)" in page


def test_a_partly_matching_pair_uses_only_the_matching_tasks(signed_in, shared_data, tmp_path):
    ref = shared_data / "eval_0.7.0"
    rows = [json.loads(line) for line in (ref / "runB" / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        if row["_ng_task_index"] == 2:
            row["responses_create_params"]["input"][0]["content"] = "add 100 then get the count"
    changed = tmp_path / "runB" / "rollouts.jsonl"
    changed.parent.mkdir()
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a = _import(ref / "runA" / "rollouts.jsonl", "runA")
    b_same = _import(ref / "runB" / "rollouts.jsonl", "runB")
    b = _import(changed, "runB changed")
    assert compare_runs(a, b_same).matched == 5  # task 4 never ran in runB: paired, no reward
    cmp = compare_runs(a, b)
    assert cmp.matched == 3 and [t.task_index for t in cmp.mismatched] == [2]
    assert cmp.mismatched[0].difference == "responses_create_params.input[0].content"
    _, same = _report(a, b_same)
    _, paired = _report(a, b)
    assert same["tasks"] == 4 and paired["tasks"] == 3 and paired["matched_only"]
    assert paired["ci_low"] is not None and paired["delta"] is not None
    page = signed_in.get(reverse("compare"), {"a": a.pk, "b": b.pk}).content.decode()
    assert "resamples of the 3 matched tasks" in page
    mismatched = page[page.index('aria-label="mismatched tasks"') :]
    assert "task=2#side-by-side" in mismatched and "<code>responses_create_params.input[0].content</code>" in mismatched


def test_a_dataset_row_and_its_echoed_result_row_are_the_same_task():
    dataset = {"responses_create_params": {"input": [{"role": "user", "content": "add 1"}]}, "expected_count": 6}
    echoed = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "add 1", "type": "message"}],
            "temperature": None,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        },
        "_ng_task_index": 0,
        "agent_ref": {"name": "other_agent"},
        "reward": 1.0,
    }
    assert task_difference(dataset, echoed) is None
    assert task_difference(dataset, {**dataset, "expected_count": 7}) == "expected_count"
    assert task_difference(dataset, {**dataset, "expected_count": 7}, prompt_only=True) is None
