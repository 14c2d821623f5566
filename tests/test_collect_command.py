"""``manage.py collect``: the headless path, end to end against the example env and agent."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from rollouts.models import Rollout, Run

pytestmark = pytest.mark.django_db(transaction=True)


def _io(tasks, out) -> list[str]:
    """``collect``'s input, output and quiet flags."""
    return ["--input", str(tasks), "--output", str(out), "--no-progress"]


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_it_collects_the_counter_tasks_with_reward_one(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path, capsys
):
    out = tmp_path / "results" / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        *_io(counter_tasks_path, out),
    )
    rows = _read(out)
    assert len(rows) == 5
    assert all(r["reward"] == 1.0 for r in rows)
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2, 3, 4]
    assert all(r["_ng_rollout_index"] == 0 and r["agent_ref"] == {"name": "remote_agent"} for r in rows)
    for row in rows:
        kinds = [item["type"] for item in row["response"]["output"]]
        assert kinds[0] == "function_call" and kinds[-1] == "message"
        assert "function_call_output" in kinds
    assert _read(tmp_path / "results" / "rollouts_failures.jsonl") == []
    materialized = _read(tmp_path / "results" / "rollouts_materialized_inputs.jsonl")
    assert [(m["_ng_task_index"], m["_ng_rollout_index"]) for m in materialized] == [(i, 0) for i in range(5)]
    summary = capsys.readouterr().out
    assert "5 succeeded" in summary and "mean/reward (successes): 1.0000" in summary


def test_env_max_in_flight_is_kept_on_the_run_and_a_negative_one_refused(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    flags = ["--agent-url", counter_agent_url, "--env-url", counter_env_url]
    call_command("collect", *flags, "--env-max-in-flight", "2", *_io(counter_tasks_path, out))
    assert len(_read(out)) == 5
    assert Run.objects.get().env_max_in_flight == 2
    with pytest.raises(CommandError, match="env-max-in-flight"):
        call_command("collect", *flags, "--env-max-in-flight", "-1", *_io(counter_tasks_path, tmp_path / "o2.jsonl"))


def test_it_writes_a_failure_row_per_attempt_when_the_agent_is_down(tmp_path, counter_env_url, counter_tasks_path):
    out = tmp_path / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        "http://127.0.0.1:9",
        "--env-url",
        counter_env_url,
        *_io(counter_tasks_path, out),
        "--limit",
        "2",
    )
    failures = _read(tmp_path / "rollouts_failures.jsonl")
    assert len(failures) == 2
    for row in failures:
        assert row["reward"] == 0.0
        assert row["_ng_failure_class"] == "remote_agent_error"
        assert "_gymweb_failure_kind" not in row and row["failure_kind"] is None  # NeMo Gym's row
        assert "Is your service running at http://127.0.0.1:9" in row["error"]
        assert "_ng_failure_terminal" not in row
    assert _read(out) == []


def test_resume_retries_failed_keys_and_keeps_successes(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    args = ["--env-url", counter_env_url, "--input", str(counter_tasks_path), "--output", str(out), "--no-progress"]
    call_command("collect", "--agent-url", "http://127.0.0.1:9", *args)
    call_command("collect", "--agent-url", counter_agent_url, "--resume", "--allow-url-change", *args)
    assert len(_read(out)) == 5
    assert len(_read(tmp_path / "rollouts_failures.jsonl")) == 5  # the first attempts stay on record
    run = Run.objects.get()
    assert set(Rollout.objects.filter(run=run).values_list("attempt", flat=True)) == {1, 2}


def test_a_resume_with_another_agent_url_is_refused_and_changes_nothing(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    args = [
        "--env-url",
        counter_env_url,
        *_io(counter_tasks_path, out),
        "--limit",
        "2",
    ]
    call_command("collect", "--agent-url", "http://127.0.0.1:9", *args)
    run = Run.objects.get()
    before = Rollout.objects.filter(run=run).count()
    with pytest.raises(CommandError) as info:
        call_command("collect", "--agent-url", counter_agent_url, "--resume", *args)
    text = str(info.value)
    assert f"--agent-url {counter_agent_url}" in text and "http://127.0.0.1:9" in text and "--allow-url-change" in text
    run.refresh_from_db()
    assert run.agent_url == "http://127.0.0.1:9" and run.url_changes == []
    assert Rollout.objects.filter(run=run).count() == before, "a refused resume adds no attempt"
    assert _read(out) == []


def test_a_resume_with_another_env_url_is_refused_too(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path):
    out = tmp_path / "rollouts.jsonl"
    common = [
        "--agent-url",
        "http://127.0.0.1:9",
        *_io(counter_tasks_path, out),
        "--limit",
        "1",
    ]
    call_command("collect", "--env-url", counter_env_url, *common)
    with pytest.raises(CommandError, match="--env-url http://127.0.0.1:8"):
        call_command("collect", "--env-url", "http://127.0.0.1:8", "--resume", *common)


def test_allow_url_change_records_the_change_and_each_attempt_keeps_its_urls(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path, capsys
):
    out = tmp_path / "rollouts.jsonl"
    args = [
        "--env-url",
        counter_env_url,
        *_io(counter_tasks_path, out),
        "--limit",
        "2",
    ]
    call_command("collect", "--agent-url", "http://127.0.0.1:9", *args)
    call_command("collect", "--agent-url", counter_agent_url, "--resume", "--allow-url-change", *args)
    run = Run.objects.get()
    assert run.agent_url == counter_agent_url
    (change,) = run.url_changes
    assert change["agent_url"] == ["http://127.0.0.1:9", counter_agent_url] and "env_url" not in change and change["at"]
    urls = dict(Rollout.objects.filter(run=run).values_list("attempt", "agent_url").distinct())
    assert urls == {1: "http://127.0.0.1:9", 2: counter_agent_url}
    assert set(Rollout.objects.filter(run=run).values_list("env_url", flat=True)) == {counter_env_url}
    assert "changes from http://127.0.0.1:9" in capsys.readouterr().err


def test_allow_url_change_without_resume_is_refused(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path):
    with pytest.raises(CommandError, match="only with --resume"):
        call_command(
            "collect",
            "--agent-url",
            counter_agent_url,
            "--env-url",
            counter_env_url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(tmp_path / "r.jsonl"),
            "--allow-url-change",
        )


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no rows"),
        ('{"responses_create_params": {"input": "hi"}}\n{not json\n', "line 2: not valid JSON"),
        ('{"foo": 1}\n', "line 1: the row has no 'responses_create_params'"),
    ],
)
def test_it_rejects_bad_jsonl_and_creates_no_run(tmp_path, content, message):
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command(
            "collect",
            "--agent-url",
            "http://127.0.0.1:1",
            "--env-url",
            "http://127.0.0.1:2",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "o.jsonl"),
        )
    assert Run.objects.count() == 0


def test_it_never_echoes_credentials_of_a_bad_agent_url(tmp_path, counter_tasks_path):
    with pytest.raises(CommandError) as exc:
        call_command(
            "collect",
            "--agent-url",
            "http://bob:hunter2@127.0.0.1:1",
            "--env-url",
            "http://127.0.0.1:2",
            "--input",
            str(counter_tasks_path),
            "--output",
            str(tmp_path / "o.jsonl"),
        )
    assert "credentials" in str(exc.value) and "hunter2" not in str(exc.value)
    assert Run.objects.count() == 0


def test_it_stores_the_envs_aggregate_metrics_when_the_run_completes(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        *_io(counter_tasks_path, tmp_path / "o.jsonl"),
    )
    run = Run.objects.get()
    assert run.aggregate_metrics_error == ""
    assert run.aggregate_metrics["agent_metrics"]["mean/reward"] == 1.0
    assert len(run.aggregate_metrics["group_level_metrics"]) == 5
