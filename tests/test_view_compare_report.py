"""The compare page's NeMo Gym report: baseline against up to four candidates, the Welch interval of
each delta, gymweb's paired interval, flips with per-repeat rewards and their side-by-side links."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts.models import Rollout, Run
from tests.run_factories import finish, key, make_run

pytestmark = pytest.mark.django_db


def _run(name, rewards_by_task):
    run = make_run(len(rewards_by_task), name=name, num_repeats=len(rewards_by_task[0]))
    for t, rewards in enumerate(rewards_by_task):
        for i, reward in enumerate(rewards):
            finish(key(run, t, i), Rollout.Status.SUCCEEDED, reward)
    return run


def test_the_reference_runs_show_nemo_gyms_numbers(signed_in, shared_data):
    for name in ("runA", "runB"):
        src = shared_data / "eval_0.7.0" / name
        call_command(
            "import_rollouts",
            str(src / "rollouts.jsonl"),
            "--failures",
            str(src / "rollouts_failures.jsonl"),
            "--name",
            name,
            "--no-health-check",
        )
    a, b = Run.objects.get(name="runA"), Run.objects.get(name="runB")
    page = signed_in.get(reverse("compare"), {"a": a.pk, "b": b.pk}).content.decode()
    table = page[page.index('id="compare-key-metrics"') :]
    assert "-0.2156 (-24.3%)" in table and "[-0.3674, -0.0638]" in table and "[0.7924, 0.9826]" in table
    assert "The paired interval is narrower (width " in page and "is tighter" not in page
    report = json.loads(b"".join(signed_in.get(reverse("compare_report_file", args=["json"]), {"a": a.pk, "b": b.pk})))
    assert report["comparisons"][0]["metrics"][0]["candidates"][0]["delta_ci_low"] == pytest.approx(
        -0.3674129943671307, abs=1e-12
    )
    md = b"".join(signed_in.get(reverse("compare_report_file", args=["md"]), {"a": a.pk, "b": b.pk})).decode()
    assert md.startswith("# gym eval compare")


def test_four_candidates_each_get_their_flips_and_side_by_side_links(signed_in):
    base = _run("base", [[1, 1], [0, 0], [1, 1]])
    cands = [_run(f"cand{i}", [[0, 0], [1, 1], [1, 1]]) for i in range(4)]
    query = {"a": base.pk, "b": cands[0].pk, "c": cands[1].pk, "d": cands[2].pk, "e": cands[3].pk}
    page = signed_in.get(reverse("compare"), query).content.decode()
    for name in ("b", "c", "d", "e"):
        block = page[page.index(f'id="flips-{name}"') :]
        block = block[: block.index("</table>")]
        assert "1 pass→fail" in block and "1 fail→pass" in block
        assert f"vs={name}" in block and "task=0" in block
    # the side-by-side of a flipped task against candidate D
    side = signed_in.get(reverse("compare"), {**query, "task": 0, "vs": "d"}).content.decode()
    section = side[side.index('id="side-by-side"') :]
    assert "Task 0 side by side" in section
    assert f"/runs/{cands[2].pk}/rollouts/" in section and f"/runs/{cands[0].pk}/rollouts/" not in section


def test_a_run_without_successes_explains_why_there_is_no_report(signed_in):
    a = _run("a", [[1]])
    empty = make_run(1, name="empty")
    finish(key(empty, 0), Rollout.Status.FAILED)
    page = signed_in.get(reverse("compare"), {"a": a.pk, "b": empty.pk}).content.decode()
    assert 'id="compare-report-error"' in page and "no successful rollouts" in page
