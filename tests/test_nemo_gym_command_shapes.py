"""NeMo Gym's command shapes: ``health_check RUN_DIR``, compare's metrics-file, agent and format
flags, ``export_atif --rollouts FILE``, and NeMo Gym's ``+key=value`` spellings as aliases."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command

from rollouts.management.commands.collect import Command as Collect
from rollouts.management.commands.profile import Command as Profile
from rollouts.models import Run

pytestmark = pytest.mark.django_db


def test_health_check_takes_a_run_folder_as_gym_eval_health_check_does(shared_data, tmp_path, capsys):
    run_dir = tmp_path / "runB"
    run_dir.mkdir()
    shutil.copy(shared_data / "eval_0.7.0/runB/rollouts.jsonl", run_dir)
    call_command("health_check", str(run_dir), "--json")
    printed = json.loads(capsys.readouterr().out)
    recorded = json.loads((shared_data / "eval_0.7.0/runB/health_check_stdout.json").read_text())
    assert printed == recorded  # `gym eval health-check runB --json`, as NeMo Gym printed it
    assert (run_dir / "quality_summary.json").read_bytes() == (
        shared_data / "eval_0.7.0/runB/quality_summary.json"
    ).read_bytes()
    assert (run_dir / "rollout_verdicts.jsonl").is_file()
    assert not Run.objects.exists()
    with pytest.raises(CommandError, match="not a run id and no such folder"):
        call_command("health_check", str(tmp_path / "absent"))


def test_compare_reads_metrics_files_named_apart_and_writes_the_format_asked(shared_data, tmp_path):
    ref = shared_data / "eval_0.7.0"
    a, b = tmp_path / "a", tmp_path / "b"
    for side, run in ((a, "runA"), (b, "runB")):
        side.mkdir()
        shutil.copy(ref / run / "rollouts.jsonl", side)
        shutil.copy(ref / run / "rollouts_aggregate_metrics.json", tmp_path / f"{run}_metrics.json")
    out = tmp_path / "report"
    call_command(
        "compare",
        "--baseline",
        str(a / "rollouts.jsonl"),
        "--candidates",
        str(b / "rollouts.jsonl"),
        "--baseline-agg-metrics",
        str(tmp_path / "runA_metrics.json"),
        "--candidates-agg-metrics",
        str(tmp_path / "runB_metrics.json"),
        "--baseline-agent",
        "remote_agent",
        "--candidate-agents",
        "remote_agent",
        "--report-format",
        "json",
        "--output-dir",
        str(out),
    )
    assert sorted(p.name for p in out.iterdir()) == ["compare_report.json"]
    ours = json.loads((out / "compare_report.json").read_text())
    nemo = json.loads((ref / "compare_A_vs_B/compare_report.json").read_text())
    assert ours["comparisons"] == nemo["comparisons"]
    assert ours["baseline"]["aggregate_metrics_fpath"].endswith("runA_metrics.json")
    with pytest.raises(CommandError, match="agent 'nobody' is not in"):
        call_command(
            "compare",
            "--baseline",
            str(a / "rollouts.jsonl"),
            "--candidates",
            str(b / "rollouts.jsonl"),
            "--baseline-agg-metrics",
            str(tmp_path / "runA_metrics.json"),
            "--baseline-agent",
            "nobody",
            "--output-dir",
            str(tmp_path / "x"),
        )


def test_export_atif_takes_a_rollouts_file_and_stamps_only_recorded_times(shared_data, tmp_path):
    src = tmp_path / "runA"
    src.mkdir()
    for name in ("rollouts.jsonl", "rollouts_materialized_inputs.jsonl"):
        shutil.copy(shared_data / "eval_0.7.0/runA" / name, src)
    out = tmp_path / "atif"
    call_command("export_atif", "--rollouts", str(src / "rollouts.jsonl"), "--output-dir", str(out))
    assert not Run.objects.exists(), "a file export stores nothing"
    first = json.loads((src / "rollouts.jsonl").read_text().splitlines()[0])
    doc = json.loads((out / f"{first['_ng_task_index']}-{first['_ng_rollout_index']}.json").read_text())
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert len(agent_steps) > 1
    # The row records one time: its last reply's created_at. No other step gets an invented one.
    assert [s.get("timestamp") for s in agent_steps[:-1]] == [None] * (len(agent_steps) - 1)
    created = datetime.fromtimestamp(first["response"]["created_at"], tz=UTC)
    assert datetime.fromisoformat(agent_steps[-1]["timestamp"]) == created
    assert len(list(out.glob("*.json"))) == 80


def test_nemo_gyms_plus_spellings_are_aliases_of_the_flags():
    collect = Collect().create_parser("manage.py", "collect")
    base = ["--agent-url", "http://a", "--env-url", "http://e", "--input", "i.jsonl", "--output", "o.jsonl"]
    assert collect.parse_args([*base, "+resume_from_cache=true", "+num_repeats=4"]).resume is True
    opts = collect.parse_args([*base, "+resume_from_cache=false", "+num_repeats=4"])
    assert opts.resume is False and opts.num_repeats == 4
    profile = Profile().create_parser("manage.py", "profile")
    assert profile.parse_args(
        ["--inputs", "m.jsonl", "--rollouts", "r.jsonl", "++allow_partial_rollouts=True"]
    ).allow_partial_rollouts
    with pytest.raises(CommandError, match="does not know NeMo Gym's 'bogus'"):
        collect.parse_args([*base, "+bogus=1"])
    with pytest.raises(CommandError, match="takes true or false"):
        collect.parse_args([*base, "+resume_from_cache=maybe"])
