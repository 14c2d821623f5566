"""``collect`` ends with a health check (NeMo Gym's ``gym eval run`` does too): the two files beside
its output and the verdicts on the run; ``--no-health-check`` skips it."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from rollouts.models import RolloutHealth, Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_collect_writes_the_health_files_beside_its_output(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path, capsys
):
    out = tmp_path / "results" / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--no-progress",
    )
    summary = json.loads((tmp_path / "results" / "quality_summary.json").read_text())
    verdicts = [json.loads(line) for line in (tmp_path / "results" / "rollout_verdicts.jsonl").read_text().splitlines()]
    assert summary["run"]["artifacts"]["records"] == 5 == len(verdicts)
    # gymweb saw every agent call: the trajectory checks are evaluated, not "unobserved"
    assert summary["run"]["artifacts"]["coverage"]["agent_turn_hollow"]["evaluated"] == 5
    assert summary["run"]["artifacts"]["coverage"]["model_call_failed"]["evaluated"] == 5
    assert RolloutHealth.objects.filter(run=Run.objects.get()).count() == 5
    assert "Rollout health: 5 checked" in capsys.readouterr().out


def test_collect_can_skip_the_health_check(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path):
    out = tmp_path / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        "--limit",
        "1",
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--no-progress",
        "--no-health-check",
    )
    assert not (tmp_path / "quality_summary.json").exists()
    assert not RolloutHealth.objects.exists()
