"""``manage.py profile`` and ``rollouts.evaluation.profile_report``: NeMo Gym's ``gym eval profile`` for files and runs.

The reference output is NeMo Gym 0.7.0's own files for a known input (tests/data/profile_fixture, a
copy of ../shared/data/nemo_gym/profile_fixture).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.evaluation.profile_report import (
    failures_as_zero_rows,
    merge_failures_as_zero,
    profile_run,
    write_run_profile,
)
from rollouts.models import Rollout, Run
from tests.run_factories import finish, key, make_run, new_attempt

FIXTURE = Path(__file__).resolve().parent / "data" / "profile_fixture"
NEMO_FILES = ("rollouts_reward_profiling.jsonl", "rollouts_agent_metrics.json", "rollouts_repeat_level_metrics.json")
FOUR_FILES = (*NEMO_FILES, "rollouts_gymweb_pass_at_k.json")

S = Rollout.Status


def same(expected, actual, path="$"):
    """Same keys (in order), same types, floats equal to 1e-9, recursively."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        assert list(actual) == list(expected), f"{path}: keys differ: {list(actual)} != {list(expected)}"
        for k in expected:
            same(expected[k], actual[k], f"{path}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            same(e, a, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert isinstance(actual, float) and math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-12), (
            f"{path}: {actual!r} != {expected!r}"
        )
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def load(path: Path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture
def fixture_inputs(tmp_path) -> Path:
    """The fixture's two input files, alone in a fresh directory."""
    work = tmp_path / "in"
    work.mkdir()
    for name in ("rollouts_materialized_inputs.jsonl", "rollouts.jsonl"):
        shutil.copy(FIXTURE / name, work / name)
    return work


# --- files from anywhere ------------------------------------------------------------------------


def test_profiling_the_fixture_files_reproduces_nemo_gyms_outputs_beside_the_rollouts(fixture_inputs, capsys):
    call_command(
        "profile",
        "--inputs",
        str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(fixture_inputs / "rollouts.jsonl"),
    )
    for name in NEMO_FILES:
        assert (fixture_inputs / name).read_bytes() == (FIXTURE / name).read_bytes(), name
    extras = load(fixture_inputs / "rollouts_gymweb_pass_at_k.json")
    assert [t["num_passed"] for t in extras["per_task"]] == [4, 3, 1, 0, 2]
    assert extras["overall"][0]["pass@4"] == pytest.approx(4 / 5)
    out = capsys.readouterr().out
    assert "20 of 20 rollout(s) have a success row" in out
    for name in FOUR_FILES:
        assert f"wrote {fixture_inputs / name}" in out


def test_nemo_gyms_own_files_beside_the_rollouts_are_never_replaced_without_overwrite(fixture_inputs):
    """The issue's case: profiling NeMo Gym's output where it lies, without --output-dir, once
    replaced the profile NeMo Gym had written there."""
    theirs = fixture_inputs / "rollouts_agent_metrics.json"
    theirs.write_bytes(b"NeMo Gym's own file")
    args = [
        "--inputs",
        str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(fixture_inputs / "rollouts.jsonl"),
    ]
    with pytest.raises(CommandError, match=r"rollouts_agent_metrics.json\. Nothing was written; pass --overwrite"):
        call_command("profile", *args)
    assert theirs.read_bytes() == b"NeMo Gym's own file"
    assert not (fixture_inputs / "rollouts_reward_profiling.jsonl").exists(), "not one of the files is written"
    call_command("profile", *args, "--overwrite")
    assert theirs.read_bytes() == (FIXTURE / "rollouts_agent_metrics.json").read_bytes()


@pytest.mark.django_db
def test_a_runs_profile_is_never_written_over_an_earlier_one_without_overwrite(tmp_path):
    run = make_run(2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    call_command("profile", str(run.pk), "--output-dir", str(tmp_path))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CommandError, match="already exist.*--overwrite"):
        call_command("profile", str(run.pk), "--output-dir", str(tmp_path))
    call_command("profile", str(run.pk), "--output-dir", str(tmp_path), "--overwrite")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_output_dir_puts_the_files_there_named_after_the_rollouts_file_stem(fixture_inputs, tmp_path):
    (fixture_inputs / "rollouts.jsonl").rename(fixture_inputs / "eval_a.jsonl")
    out = tmp_path / "profiles" / "deep"
    call_command(
        "profile",
        "--inputs",
        str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(fixture_inputs / "eval_a.jsonl"),
        "--output-dir",
        str(out),
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(n.replace("rollouts", "eval_a") for n in FOUR_FILES)
    same(load(FIXTURE / "rollouts_agent_metrics.json"), load(out / "eval_a_agent_metrics.json"))
    assert not (fixture_inputs / "eval_a_agent_metrics.json").exists()


def test_a_failures_sidecar_beside_the_rollouts_counts_as_zero_in_pass_at_k_only(fixture_inputs, capsys):
    rows = load(fixture_inputs / "rollouts.jsonl")
    kept = [r for r in rows if not (r["_ng_task_index"] == 0 and r["_ng_rollout_index"] == 0)]
    (fixture_inputs / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    failure = {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 0.0,
        "agent_ref": rows[0]["agent_ref"],
        "_ng_failure_class": "remote_agent_error",
        "error": "boom",
    }
    (fixture_inputs / "rollouts_failures.jsonl").write_text(json.dumps(failure) + "\n" + json.dumps(failure) + "\n")
    call_command(
        "profile",
        "--inputs",
        str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(fixture_inputs / "rollouts.jsonl"),
        "--allow-partial-rollouts",
    )
    extras = load(fixture_inputs / "rollouts_gymweb_pass_at_k.json")
    task0 = extras["per_task"][0]
    assert task0["num_rollouts"] == 4 and task0["num_passed"] == 3  # the failed key counts once, as 0
    assert "failures" in extras["estimator"]
    profiling = load(fixture_inputs / "rollouts_reward_profiling.jsonl")
    assert profiling[0]["num_rollouts"] == 3 and profiling[0]["missing_num_rollouts"] == 1
    assert "counts the failures in" in capsys.readouterr().out


def test_missing_rollouts_are_an_error_that_names_the_flag_unless_partial_is_allowed(fixture_inputs):
    rows = load(fixture_inputs / "rollouts.jsonl")[:-1]
    (fixture_inputs / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "profile",
        "--inputs",
        str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(fixture_inputs / "rollouts.jsonl"),
    ]
    with pytest.raises(CommandError, match="--allow-partial-rollouts"):
        call_command(*args)
    call_command(*args, "--allow-partial-rollouts")
    assert (fixture_inputs / "rollouts_agent_metrics.json").is_file()


def test_a_malformed_line_is_reported_with_its_file_and_line_number(fixture_inputs):
    path = fixture_inputs / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = '{"reward": 1.0,'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=r"rollouts\.jsonl, line 3: not valid JSON"):
        call_command(
            "profile", "--inputs", str(fixture_inputs / "rollouts_materialized_inputs.jsonl"), "--rollouts", str(path)
        )
    assert not (fixture_inputs / "rollouts_agent_metrics.json").exists()


def test_a_line_that_is_not_an_object_is_reported_with_its_file_and_line_number(fixture_inputs):
    path = fixture_inputs / "rollouts_materialized_inputs.jsonl"
    path.write_text(path.read_text() + "\n[1, 2]\n")
    with pytest.raises(CommandError, match=r"materialized_inputs\.jsonl, line 22: expected a JSON object, got list"):
        call_command("profile", "--inputs", str(path), "--rollouts", str(fixture_inputs / "rollouts.jsonl"))


def test_a_row_without_the_two_indices_is_reported_with_its_file_and_line_number(fixture_inputs):
    path = fixture_inputs / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[4])
    del row["_ng_rollout_index"]
    lines[4] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match=r"rollouts\.jsonl, line 5: the row has no _ng_task_index/_ng_rollout_index"):
        call_command(
            "profile", "--inputs", str(fixture_inputs / "rollouts_materialized_inputs.jsonl"), "--rollouts", str(path)
        )


def test_a_missing_file_is_a_clear_error(fixture_inputs):
    with pytest.raises(CommandError, match=r"--rollouts .*nope\.jsonl: no such file"):
        call_command(
            "profile",
            "--inputs",
            str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
            "--rollouts",
            str(fixture_inputs / "nope.jsonl"),
        )
    with pytest.raises(CommandError, match="--failures .*: no such file"):
        call_command(
            "profile",
            "--inputs",
            str(fixture_inputs / "rollouts_materialized_inputs.jsonl"),
            "--rollouts",
            str(fixture_inputs / "rollouts.jsonl"),
            "--failures",
            str(fixture_inputs / "f.jsonl"),
        )


def test_inputs_without_rollouts_and_no_arguments_at_all_are_usage_errors(fixture_inputs):
    with pytest.raises(CommandError, match="go together"):
        call_command("profile", "--inputs", str(fixture_inputs / "rollouts_materialized_inputs.jsonl"))
    with pytest.raises(CommandError, match="give a run id"):
        call_command("profile")


# --- a stored run --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_unknown_run_a_bad_id_and_a_missing_output_dir_are_clear_errors(tmp_path):
    with pytest.raises(CommandError, match="no run #999"):
        call_command("profile", "999", "--output-dir", str(tmp_path))
    with pytest.raises(CommandError, match="RUN must be a run id"):
        call_command("profile", "first", "--output-dir", str(tmp_path))
    run = make_run(1)
    with pytest.raises(CommandError, match="--output-dir DIR is required"):
        call_command("profile", str(run.pk))
    with pytest.raises(CommandError, match="not both"):
        call_command("profile", str(run.pk), "--output-dir", str(tmp_path), "--inputs", "x.jsonl")


@pytest.mark.django_db(transaction=True)
def test_profiling_a_run_collected_in_process_writes_four_files_with_reward_one(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path, capsys
):
    from rollouts.workers.process import run_in_process

    with counter_tasks_path.open("rb") as fh:
        run = runs.create_run(
            read_jsonl(fh), name="counter", agent_url=counter_agent_url, env_url=counter_env_url, num_repeats=3
        )
    runs.launch(run)
    run_in_process(run.pk)
    assert Rollout.objects.filter(run=run, status=S.SUCCEEDED).count() == 15

    out = tmp_path / "profile"
    call_command("profile", str(run.pk), "--output-dir", str(out))
    assert sorted(p.name for p in out.iterdir()) == sorted(FOUR_FILES)
    profiling = load(out / "rollouts_reward_profiling.jsonl")
    assert [r["_ng_task_index"] for r in profiling] == [0, 1, 2, 3, 4]
    assert all(r["num_rollouts"] == 3 and r["mean/reward"] == 1.0 for r in profiling)
    (agent,) = load(out / "rollouts_agent_metrics.json")
    assert agent["agent_ref"] == {"name": "remote_agent"}
    assert agent["mean/reward"] == 1.0
    assert agent["mean_across_repeats/mean/reward"] == 1.0
    assert len(load(out / "rollouts_repeat_level_metrics.json")) == 3
    extras = load(out / "rollouts_gymweb_pass_at_k.json")
    assert extras["overall"][0]["num_tasks"] == 5
    assert extras["overall"][0]["pass@1"] == 1.0 and extras["overall"][0]["pass@3"] == 1.0
    printed = capsys.readouterr().out
    assert "mean/reward (successes) 1.0000" in printed and "pass@3 1.0000" in printed


def _mixed_run():
    """2 tasks × 2 repeats: task 0 succeeds twice (1.0, 0.5); task 1 key 0 fails then succeeds (1.0),
    key 1 fails twice (no success)."""
    run = make_run(2, num_repeats=2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 0, 1), S.SUCCEEDED, 0.5)
    finish(key(run, 1, 0), S.FAILED)
    finish(new_attempt(run, 1, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1, 1), S.FAILED)
    finish(new_attempt(run, 1, 1), S.FAILED)
    return run


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore::UserWarning")  # NeMo Gym's warnings about unequal repeats
def test_a_run_with_failures_profiles_its_successes_and_counts_failed_keys_once_as_zero_in_pass_at_k():
    run = _mixed_run()
    result, extras = profile_run(run)
    task0, task1 = result.reward_profiling
    assert task0["num_rollouts"] == 2 and task0["mean/reward"] == 0.75
    assert task1["num_rollouts"] == 1 and task1["missing_num_rollouts"] == 1 and task1["mean/reward"] == 1.0
    rows = list(failures_as_zero_rows(run))
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in rows] == [
        (0, 0, 1.0),
        (0, 1, 0.5),
        (1, 0, 1.0),
        (1, 1, 0.0),
    ]
    per_task = {t["_ng_task_index"]: t for t in extras["per_task"]}
    assert per_task[1]["num_rollouts"] == 2 and per_task[1]["num_passed"] == 1
    assert per_task[1]["pass@1"] == 0.5 and per_task[1]["pass@2"] == 1.0
    assert extras["overall"][0]["agent_ref"] == {"name": "remote_agent"}


@pytest.mark.django_db
def test_keys_that_never_finished_are_left_out_of_the_failures_as_zero_rows():
    run = make_run(2)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.CANCELLED)
    assert [(r["_ng_task_index"], r["reward"]) for r in failures_as_zero_rows(run)] == [(0, 1.0)]


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_write_run_profile_returns_the_four_paths_in_order(tmp_path):
    run = _mixed_run()
    paths = write_run_profile(run, tmp_path / "p")
    assert [p.name for p in paths] == list(FOUR_FILES)
    assert all(p.is_file() for p in paths)


@pytest.mark.django_db
def test_a_run_with_nothing_finished_still_writes_empty_files(tmp_path):
    run = make_run(2, status=Run.Status.RUNNING)
    paths = write_run_profile(run, tmp_path)
    assert load(paths[0]) == [] and load(paths[1]) == []
    assert load(paths[3])["per_task"] == []


def test_merge_failures_as_zero_prefers_a_success_whatever_the_order_of_the_files():
    successes = [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}]
    failures = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 0.0},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0},
    ]
    merged = merge_failures_as_zero(successes, failures)
    assert sorted((r["_ng_rollout_index"], r["reward"]) for r in merged) == [(0, 1.0), (1, 0.0)]
