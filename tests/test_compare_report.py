"""``manage.py compare``: NeMo Gym's ``gym eval compare`` numbers reproduced on its own reference runs
(imported, or read as files), up to four candidates, and gymweb's paired interval."""

from __future__ import annotations

import json
import math

import pytest
from django.core.management import CommandError, call_command

from rollouts.evaluation import compare_report, compare_sides
from rollouts.models import Run

pytestmark = pytest.mark.django_db


def _import(src, name):
    call_command(
        "import_rollouts",
        str(src / "rollouts.jsonl"),
        "--failures",
        str(src / "rollouts_failures.jsonl"),
        "--name",
        name,
        "--no-health-check",
    )
    return Run.objects.get(name=name)


def _close(ours, nemo, path="$"):
    """Every number of ``nemo`` equals ``ours`` to 1e-12; every other value exactly."""
    if isinstance(nemo, dict):
        assert isinstance(ours, dict) and set(nemo) <= set(ours), path
        for k in nemo:
            _close(ours[k], nemo[k], f"{path}.{k}")
    elif isinstance(nemo, list):
        assert isinstance(ours, list) and len(ours) == len(nemo), path
        for i, (a, b) in enumerate(zip(ours, nemo)):
            _close(a, b, f"{path}[{i}]")
    elif isinstance(nemo, float):
        assert isinstance(ours, (int, float)) and math.isclose(ours, nemo, rel_tol=0, abs_tol=1e-12), (path, ours, nemo)
    else:
        assert ours == nemo, (path, ours, nemo)


def test_imported_reference_runs_reproduce_nemo_gyms_compare_report(shared_data, tmp_path):
    ref_dir = shared_data / "eval_0.7.0"
    a, b = _import(ref_dir / "runA", "runA"), _import(ref_dir / "runB", "runB")
    call_command("compare", "--baseline", str(a.pk), "--candidates", str(b.pk), "--output-dir", str(tmp_path))
    ours = json.loads((tmp_path / "compare_report.json").read_text())
    nemo = json.loads((ref_dir / "compare_A_vs_B" / "compare_report.json").read_text())
    assert ours["schema_version"] == "1"
    _close(ours["comparisons"], nemo["comparisons"])
    reward = ours["comparisons"][0]["metrics"][0]["candidates"][0]
    assert reward["delta_ci_low"] == pytest.approx(-0.3674129943671307, abs=1e-12)
    md = (tmp_path / "compare_report.md").read_text()
    assert (
        "| `mean/reward` | -0.2156 (-24.3%) | [-0.3674, -0.0638] | 0.8875 | [0.7924, 0.9826] | 0.6719 | [0.5458, 0.7980] |"
        in md
    )
    assert "**4 common tasks · 0 pass→fail · 0 fail→pass · net +0 · 4 unchanged · 0 tied**" in md


def test_nemo_gym_files_compare_exactly_too(shared_data, tmp_path):
    ref_dir = shared_data / "eval_0.7.0"
    baseline = compare_sides.resolve_side(str(ref_dir / "runA" / "rollouts.jsonl"), "baseline")
    candidate = compare_sides.resolve_side(str(ref_dir / "runB" / "rollouts.jsonl"), "candidate")
    ours = compare_report.compare_sides(baseline, [candidate])
    nemo = json.loads((ref_dir / "compare_A_vs_B" / "compare_report.json").read_text())
    assert ours["comparisons"] == nemo["comparisons"]
    assert ours["baseline"]["label"] == "runA" and ours["baseline"]["agent_names"] == ["remote_agent"]


def test_the_paired_interval_is_seeded_and_says_which_interval_is_tighter(shared_data):
    ref_dir = shared_data / "eval_0.7.0"
    sides = [
        compare_sides.resolve_side(str(ref_dir / r / "rollouts.jsonl"), role)
        for r, role in (("runA", "baseline"), ("runB", "candidate"))
    ]
    first = compare_report.compare_sides(sides[0], [sides[1]])["gymweb"]["paired_intervals"][0]["candidates"][0]
    again = compare_report.compare_sides(sides[0], [sides[1]])["gymweb"]["paired_intervals"][0]["candidates"][0]
    assert first == again
    assert first["tasks"] == 4 and first["ci_low"] < first["delta"] < first["ci_high"]
    assert first["tighter"] == "paired" and first["width"] < first["welch_width"]


def _entry(task_rewards: dict[int, list[float]]) -> dict:
    rows = [
        {"_ng_task_index": t, "_ng_rollout_index": i, "reward": r, "response": {}}
        for t, rs in task_rewards.items()
        for i, r in enumerate(rs)
    ]
    return compare_sides.aggregate_entry_from_rows(rows, "agent")


def test_flips_go_both_ways_with_per_repeat_rewards():
    base = _entry({0: [1, 1, 1], 1: [0, 0, 0], 2: [1, 0, 1], 3: [1, 1, 0]})
    cand = _entry({0: [0, 0, 1], 1: [1, 1, 0], 2: [1, 1, 1], 3: [1, 0, 1]})
    s = compare_report.flip_summary(base, cand)
    assert s["mode"] == "binary"
    assert [(f["task_index"], f["direction"]) for f in s["flips"]] == [(0, "pass_to_fail"), (1, "fail_to_pass")]
    assert s["flips"][0]["baseline_rewards"] == [1.0, 1.0, 1.0] and s["flips"][0]["candidate_rewards"] == [
        0.0,
        0.0,
        1.0,
    ]
    assert (s["pass_to_fail_count"], s["fail_to_pass_count"], s["net"], s["unchanged_count"]) == (1, 1, 0, 2)


def test_non_binary_rewards_list_the_largest_changes():
    s = compare_report.flip_summary(_entry({0: [0.2, 0.4], 1: [0.5, 0.5]}), _entry({0: [0.9, 0.9], 1: [0.5, 0.5]}))
    assert s["mode"] == "continuous" and [f["task_index"] for f in s["flips"]] == [0] and s["unchanged_count"] == 1


def test_up_to_four_candidates_each_get_a_column(shared_data, tmp_path):
    a = str(shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl")
    b = str(shared_data / "eval_0.7.0" / "runB" / "rollouts.jsonl")
    call_command("compare", "--baseline", a, "--candidates", ",".join([b, a, b, a]), "--output-dir", str(tmp_path))
    report = json.loads((tmp_path / "compare_report.json").read_text())
    assert len(report["candidates"]) == 4 and len(report["comparisons"][0]["flips"]) == 4
    assert report["comparisons"][0]["metrics"][0]["candidates"][1]["delta"] == 0.0
    assert "Candidate 4 95% CI" in (tmp_path / "compare_report.md").read_text()
    with pytest.raises(CommandError, match="at most 4"):
        call_command("compare", "--baseline", a, "--candidates", ",".join([b] * 5), "--output-dir", str(tmp_path / "x"))


def test_it_never_overwrites_a_report_without_overwrite(shared_data, tmp_path):
    a = str(shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl")
    (tmp_path / "compare_report.md").write_text("keep me")
    with pytest.raises(CommandError, match="--overwrite"):
        call_command("compare", "--baseline", a, "--candidates", a, "--output-dir", str(tmp_path))
    assert (tmp_path / "compare_report.md").read_text() == "keep me"
    assert not (tmp_path / "compare_report.json").exists()
    call_command("compare", "--baseline", a, "--candidates", a, "--output-dir", str(tmp_path), "--overwrite")
    assert (tmp_path / "compare_report.json").exists()


def test_a_missing_side_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="no run #999"):
        call_command("compare", "--baseline", "999", "--candidates", "998", "--output-dir", str(tmp_path))
    with pytest.raises(CommandError, match="no such file"):
        call_command(
            "compare", "--baseline", str(tmp_path / "nope.jsonl"), "--candidates", "1", "--output-dir", str(tmp_path)
        )


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"reward": 1.0, "agent_ref": {"name": "caf\xe9"}}\n', r"side\.jsonl, line 1: not UTF-8 text"),
        (
            b'[\n  {"agent_ref": {"name": "a"}}\n]\n',
            r"side\.jsonl, line 1: not valid JSON \(Expecting value\); give a rollouts\.jsonl",
        ),
        (b'{"reward": 1.0}\n[1, 2]\n', r"side\.jsonl, line 2: a rollout row must be a JSON object, got list"),
    ],
)
def test_a_side_that_is_not_a_rollouts_file_is_a_clear_error_naming_its_line(tmp_path, content, message):
    # Before: a UnicodeDecodeError, a ValueError or an AttributeError traceback, and no report.
    side = tmp_path / "side.jsonl"
    side.write_bytes(content)
    with pytest.raises(CommandError, match=message):
        call_command(
            "compare", "--baseline", str(side), "--candidates", str(side), "--output-dir", str(tmp_path / "out")
        )
    assert not (tmp_path / "out").exists()


def test_a_side_with_a_byte_order_mark_compares_like_the_import_reads_it(shared_data, tmp_path):
    a = shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl"
    bom = tmp_path / "bom" / "rollouts.jsonl"
    bom.parent.mkdir()
    bom.write_bytes(b"\xef\xbb\xbf" + a.read_bytes())
    call_command("compare", "--baseline", str(a), "--candidates", str(bom), "--output-dir", str(tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "compare_report.json").read_text())
    assert report["comparisons"][0]["metrics"][0]["candidates"][0]["delta"] == 0.0
