"""The health check: NeMo Gym's files reproduced byte for byte, and the checks gymweb evaluates from
the agent calls it stores (NeMo Gym leaves them ``unobserved`` for remote agents)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from rollouts.evaluation import health, health_checks, health_report
from rollouts.models import AgentCall, Rollout, RolloutHealth, Run, TrajectoryItem
from tests.run_factories import finish, key, make_run, new_attempt

pytestmark = pytest.mark.django_db


def _calls(rollout, *specs):
    """AgentCall rows (and the agent's items of each step) from ``(usage, items, error, http, incomplete)``."""
    start = timezone.now() - timedelta(seconds=30)
    seq = 0
    for i, (usage, items, error, http, incomplete) in enumerate(specs):
        AgentCall.objects.create(
            rollout=rollout,
            index=i,
            started=start + timedelta(seconds=i),
            latency_ms=5.0,
            http_status=http,
            response_id="" if error else f"resp_{rollout.pk}_{i}",
            usage=usage,
            incomplete_details=incomplete,
            error=error,
        )
        for item in items:
            TrajectoryItem.objects.create(
                rollout=rollout, seq=seq, step=i, kind=item["type"], origin="agent", payload=item
            )
            seq += 1


U = {
    "input_tokens": 10,
    "output_tokens": 5,
    "total_tokens": 15,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}
MSG = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "the count is 3"}]}
CALL = {"type": "function_call", "name": "add", "arguments": "{}", "call_id": "c1"}


def _success_with_usage(rollout, usage_total):
    finish(rollout, Rollout.Status.SUCCEEDED, 1.0)
    verify = json.loads(rollout.verify_json)
    verify["response"]["usage"] = usage_total
    rollout.verify_json = json.dumps(verify)
    rollout.save()


def test_the_files_of_nemo_gyms_own_runs_come_out_byte_for_byte(shared_data, tmp_path):
    for name in ("runA", "runB"):
        src = shared_data / "eval_0.7.0" / name
        call_command("health_check", "--rollouts", str(src / "rollouts.jsonl"), "--output-dir", str(tmp_path / name))
        for f in ("quality_summary.json", "rollout_verdicts.jsonl"):
            assert (tmp_path / name / f).read_bytes() == (src / f).read_bytes(), (name, f)


def test_it_never_overwrites_reports_without_overwrite(shared_data, tmp_path):
    src = shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl"
    (tmp_path / "quality_summary.json").write_text("mine")
    with pytest.raises(CommandError, match="--overwrite"):
        call_command("health_check", "--rollouts", str(src), "--output-dir", str(tmp_path))
    assert (tmp_path / "quality_summary.json").read_text() == "mine"
    assert not (tmp_path / "rollout_verdicts.jsonl").exists()
    call_command("health_check", "--rollouts", str(src), "--output-dir", str(tmp_path), "--overwrite")
    assert json.loads((tmp_path / "quality_summary.json").read_text())["run"]["artifacts"]["records"] == 80


def test_an_unreadable_line_is_a_finding_not_an_error(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n{not json\n')
    result = health_report.check_files([path])
    bad = [d for d in result.digests if d.verdict == "unhealthy"]
    assert len(bad) == 1 and bad[0].findings[0]["check"] == "record_unreadable"
    assert bad[0].findings[0]["locator"] == {"source_file": str(path), "line": 2}
    assert bad[0].task_index == "__unreadable_record__:input-0:line-2"


def test_a_healthy_collected_rollout_is_evaluated_by_every_check():
    run = make_run(1)
    r = key(run, 0)
    _success_with_usage(r, {"input_tokens": 20, "output_tokens": 10})
    _calls(r, (U, [CALL], "", 200, None), (U, [MSG], "", 200, None))
    result, _ = health.run_health_check(run)
    assert [d.verdict for d in result.digests] == ["healthy"]
    assert result.digests[0].unobserved == []
    cov = result.summary["run"]["artifacts"]["coverage"]
    assert all(cov[c]["unobserved"] == 0 for c in health_checks.ROLLOUT_CHECK_IDS)


def test_agent_call_evidence_finds_hollow_turns_zero_and_missing_tokens_and_runaway_generation():
    run = make_run(1)
    r = key(run, 0)
    _success_with_usage(r, {"input_tokens": 10, "output_tokens": 0})
    zero = {**U, "output_tokens": 0}
    _calls(
        r,
        (zero, [{"type": "reasoning", "summary": []}], "", 200, None),  # hollow + zero completion
        (None, [CALL], "", 200, None),  # missing token counts
        (U, [], "", 200, {"reason": "max_output_tokens"}),
    )  # runaway (no content) + hollow
    digest = health.run_health_check(run)[0].digests[0]
    found = sorted((f["check"], step) for f, step in zip(digest.findings, digest.finding_steps))
    assert found == [
        ("agent_turn_hollow", 0),
        ("agent_turn_hollow", 2),
        ("model_call_missing_token_counts", 1),
        ("model_call_runaway_generation", 2),
        ("model_call_zero_completion_tokens", 0),
    ]
    assert digest.verdict == "unhealthy"
    # one call lacks token counts: the token comparison cannot be made
    assert "rollout_token_count_mismatch" in digest.unobserved
    missing = next(f for f in digest.findings if f["check"] == "model_call_missing_token_counts")
    assert missing["detail"] == {"missing": ["prompt_tokens", "completion_tokens"]}
    assert missing["locator"] == {"call_id": f"resp_{r.pk}_1"}


def test_a_row_whose_usage_differs_from_the_calls_is_a_token_count_mismatch():
    run = make_run(1)
    r = key(run, 0)
    _success_with_usage(r, {"input_tokens": 999, "output_tokens": 10})
    _calls(r, (U, [CALL], "", 200, None), (U, [MSG], "", 200, None))
    digest = health.run_health_check(run)[0].digests[0]
    assert [f["check"] for f in digest.findings] == ["rollout_token_count_mismatch"]
    assert digest.findings[0]["detail"] == {
        "transcript_prompt": 999,
        "transcript_completion": 10,
        "capture_prompt": 20,
        "capture_completion": 10,
    }


def test_a_failed_key_that_ended_on_a_failed_agent_call_is_unhealthy_and_so_is_its_task():
    run = make_run(1, num_repeats=2)
    for rollout_index in (0, 1):
        r = key(run, 0, rollout_index)
        finish(r, Rollout.Status.FAILED, kind="agent_http_error")
        _calls(r, (U, [CALL], "", 200, None), (None, [], "agent answered HTTP 500", 500, None))
    result, _ = health.run_health_check(run)
    digest = result.digests[0]
    checks = {f["check"] for f in digest.findings}
    assert checks == {"rollout_ended_on_failed_model_call", "model_call_failed"}
    ended = next(f for f in digest.findings if f["check"] == "rollout_ended_on_failed_model_call")
    assert (
        ended["detail"]["status"] == 500
        and ended["detail"]["observed_calls"] == 2
        and ended["detail"]["successful_calls"] == 1
    )
    assert result.summary["tasks"]["0"]["flags"] == ["task_consistently_unhealthy"]
    assert result.summary["run"]["stats"]["model_call_errors"] == {
        "total": 2,
        "by_status": {"500": 2},
        "rollouts_affected": 2,
        "ended_on_error": 2,
    }


def test_a_task_whose_every_repeat_never_got_a_reply_has_no_successful_agent_calls():
    run = make_run(1, num_repeats=2)
    for rollout_index in (0, 1):
        r = key(run, 0, rollout_index)
        finish(r, Rollout.Status.FAILED, kind="agent_invalid_response", terminal=True)
        _calls(r, (None, [], "the reply is not a Responses object", 200, None))
    result, _ = health.run_health_check(run)
    assert "task_no_successful_model_calls" in result.summary["tasks"]["0"]["flags"]
    assert {f["check"] for f in result.digests[0].findings} >= {"rollout_missing_agent_turns", "model_call_failed"}


def test_a_retried_key_is_checked_once_on_its_success():
    run = make_run(1)
    first = key(run, 0)
    finish(first, Rollout.Status.FAILED)
    second = new_attempt(run, 0)
    _success_with_usage(second, {"input_tokens": 10, "output_tokens": 5})
    _calls(second, (U, [MSG], "", 200, None))
    result, _ = health.run_health_check(run)
    assert [d.rollout_pk for d in result.digests] == [second.pk]
    assert RolloutHealth.objects.get().rollout_id == second.pk


def test_verdicts_are_stored_and_a_second_check_replaces_them():
    run = make_run(2)
    for t in (0, 1):
        r = key(run, t)
        _success_with_usage(r, {"input_tokens": 10, "output_tokens": 5})
        _calls(r, (U, [MSG] if t == 0 else [], "", 200, None))
    health.run_health_check(run)
    health.run_health_check(run)
    rows = list(RolloutHealth.objects.filter(run=run).order_by("task_index"))
    assert [h.verdict for h in rows] == ["healthy", "unhealthy"]
    assert rows[1].checks == ",agent_turn_hollow," and rows[1].finding_steps == [0]
    run.refresh_from_db()
    assert run.health_summary["run"]["verdicts"] == {"healthy": 1, "unhealthy": 1, "unobserved": 0}


def test_an_imported_nemo_gym_run_gets_nemo_gyms_verdicts(shared_data):
    src = shared_data / "eval_0.7.0" / "runB"
    call_command("import_rollouts", str(src / "rollouts.jsonl"), "--failures", str(src / "rollouts_failures.jsonl"))
    run = Run.objects.get()
    assert run.health_summary is not None
    nemo = json.loads((src / "quality_summary.json").read_text())
    ours = health.check_run(run, successes_only=True).summary
    assert ours == nemo
    # every finished key (failures too) is stored, all unobserved: a file has no per-call evidence
    assert RolloutHealth.objects.filter(run=run).count() == 80
    assert set(RolloutHealth.objects.filter(run=run).values_list("verdict", flat=True)) == {"unobserved"}


def test_import_can_skip_the_check(shared_data):
    src = shared_data / "eval_0.7.0" / "runA"
    call_command("import_rollouts", str(src / "rollouts.jsonl"), "--no-health-check")
    assert Run.objects.get().health_summary is None and not RolloutHealth.objects.exists()


def test_unknown_check_ids_are_refused():
    with pytest.raises(CommandError, match="Unknown rollout health check"):
        call_command("health_check", "1", "--ignore-checks", "no_such_check")


def test_ignored_checks_are_counted_as_ignored():
    run = make_run(1)
    r = key(run, 0)
    _success_with_usage(r, {"input_tokens": 10, "output_tokens": 5})
    _calls(r, (U, [], "", 200, None))
    result, _ = health.run_health_check(run, ignored=health_checks.normalize_ignored("agent_turn_hollow"))
    assert result.digests[0].verdict == "healthy"
    assert result.summary["run"]["artifacts"]["coverage"]["agent_turn_hollow"] == {
        "evaluated": 0,
        "unobserved": 0,
        "ignored": 1,
    }
