"""``manage.py export_atif``: a run's stored steps as ATIF v1.7 (NeMo Gym's ``gym eval export``),
validated against the schema in the repo, and against NeMo Gym's own models when installed."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.core.management import CommandError, call_command

from rollouts.evaluation import atif
from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem
from tests.run_factories import finish, key, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def _collect(tmp_path, env, agent, tasks, *extra):
    out = tmp_path / "col" / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        agent,
        "--env-url",
        env,
        "--input",
        str(tasks),
        "--output",
        str(out),
        "--no-progress",
        "--no-health-check",
        *extra,
    )
    return Run.objects.latest("id")


def _read(folder):
    manifest = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
    return manifest, {m["trajectory_path"]: json.loads((folder / m["trajectory_path"]).read_text()) for m in manifest}


def test_a_collected_run_exports_every_step_as_valid_atif(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    run = _collect(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path)
    out = tmp_path / "atif"
    call_command("export_atif", str(run.pk), "--output-dir", str(out), "--agent-version", "1.0")
    manifest, docs = _read(out)
    assert [m["trajectory_path"] for m in manifest] == [f"{t}-0.json" for t in range(5)]
    for m in manifest:
        data = (out / m["trajectory_path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == m["expected_sha256"]
        assert set(m) == {"trajectory_path", "_ng_task_index", "_ng_rollout_index", "expected_sha256"}
    doc = docs["0-0.json"]
    assert doc["schema_version"] == "ATIF-v1.7" and doc["agent"] == {
        **doc["agent"],
        "name": "remote_agent",
        "version": "1.0",
    }
    assert doc["trajectory_id"] == f"gymweb-run-{run.pk}:0:0"
    sources = [s["source"] for s in doc["steps"]]
    assert sources[0] == "user" and set(sources[1:]) == {"agent"}
    rollout = Rollout.objects.get(run=run, task_index=0)
    assert len([s for s in doc["steps"] if s["source"] == "agent"]) == AgentCall.objects.filter(rollout=rollout).count()
    # every tool call the agent asked for is there with the env's output as its observation
    calls = [c for s in doc["steps"] for c in s.get("tool_calls", [])]
    results = [r for s in doc["steps"] for r in (s.get("observation") or {}).get("results", [])]
    gym_outputs = TrajectoryItem.objects.filter(rollout=rollout, kind="function_call_output")
    assert len(results) == gym_outputs.count() > 0 and {r["source_call_id"] for r in results} == {
        c["tool_call_id"] for c in calls
    }
    assert [r["content"] for r in results] == [i.payload["output"] for i in gym_outputs.order_by("seq")]
    assert doc["steps"][-1]["message"]  # the final answer
    assert doc["final_metrics"]["total_steps"] == len(doc["steps"])
    assert doc["extra"]["gymweb"]["source"]["reward"] == 1.0


def test_it_never_replaces_a_folder_without_overwrite(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path):
    run = _collect(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path, "--limit", "1")
    out = tmp_path / "atif"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CommandError, match="--overwrite"):
        call_command("export_atif", str(run.pk), "--output-dir", str(out))
    assert (out / "keep.txt").read_text() == "mine"
    call_command("export_atif", str(run.pk), "--output-dir", str(out), "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["0-0.json", "manifest.jsonl"]


def test_failed_keys_are_exported_on_request_with_their_error():
    run = make_run(2)
    finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    bad = finish(key(run, 1), Rollout.Status.FAILED, kind="agent_http_error", error="agent answered HTTP 500")
    AgentCall.objects.create(
        rollout=bad, index=0, started=bad.finished, latency_ms=4.0, http_status=500, error="HTTP 500: boom"
    )
    only_successes = [r.task_index for r, _ in atif.iter_trajectories(run)]
    assert only_successes == [0]
    docs = dict((r.task_index, d) for r, d in atif.iter_trajectories(run, include_failures=True))
    step = docs[1]["steps"][-1]
    assert step["source"] == "agent" and step["extra"]["gymweb"]["error"] == "HTTP 500: boom"
    assert docs[1]["extra"]["gymweb"]["source"]["failure_kind"] == "agent_http_error"


def test_the_schema_rejects_what_nemo_gyms_models_reject():
    good = {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "a", "version": "1"},
        "steps": [{"step_id": 1, "source": "user", "message": "hi"}],
    }
    atif.validate(good)
    for broken, message in [
        ({**good, "surprise": 1}, "Additional properties"),
        ({**good, "steps": [{"step_id": 2, "source": "user", "message": "hi"}]}, "sequential"),
        (
            {**good, "steps": [{"step_id": 1, "source": "user", "message": "hi", "model_name": "m"}]},
            "only valid for agent",
        ),
        (
            {
                **good,
                "steps": [
                    {
                        "step_id": 1,
                        "source": "agent",
                        "message": "",
                        "observation": {"results": [{"source_call_id": "x"}]},
                    }
                ],
            },
            "unknown tool call",
        ),
        ({**good, "steps": []}, "should be non-empty"),
    ]:
        with pytest.raises(atif.AtifError, match=message):
            atif.validate(broken)


def test_an_imported_nemo_gym_run_exports_too(shared_data, tmp_path):
    src = shared_data / "example_tool_call_multireward" / "example_rollouts.jsonl"
    call_command("import_rollouts", str(src), "--no-health-check")
    run = Run.objects.get()
    out, count = atif.export_run(run, tmp_path / "atif")
    assert count == 5 and (out / "manifest.jsonl").exists()


def test_nemo_gyms_own_models_accept_the_export(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path):
    models = pytest.importorskip("nemo_gym.atif_v1_7", reason="nemo-gym (Python >= 3.13) is not installed")
    run = _collect(tmp_path, counter_env_url, counter_agent_url, counter_tasks_path)
    out, _ = atif.export_run(run, tmp_path / "atif")
    for path in out.glob("*-*.json"):
        models.AtifTrajectoryV1_7.model_validate_json(path.read_text())
