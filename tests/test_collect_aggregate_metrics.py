"""``collect`` writes NeMo Gym's artifacts for the counter work: the same files, keys and shapes as
NeMo Gym 0.7.0's ``eval_0.7.0/runA`` (same 20 counter rows × 4 repeats, NeMo Gym's counter server
replies), with everything ``gym eval compare`` reads; the stamps on every row; the aggregate metrics
file from the env, or computed locally when the env has no ``/aggregate_metrics``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from django.core.management import call_command

from gymweb.examples._serve import BackgroundServer
from gymweb.examples.counter_env import make_app
from rollouts.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

STAMPS = ["_ng_task_index", "_ng_rollout_index", "agent_ref", "_ng_environment_server", "_ng_result_type"]


def read_rows(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shape(value):
    """The value with every number, string and bool replaced by its kind: two files of the same
    shape have the same keys in the same order and lists of the same lengths."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def assert_compare_can_read(path: Path) -> None:
    """Everything NeMo Gym 0.7.0's ``gym eval compare`` reads from an aggregate metrics file
    (``comparison/loading.py`` and ``diff.py``), with the types it needs, for a run of 2+ repeats."""
    entries = json.loads(path.read_bytes())
    assert isinstance(entries, list) and entries, "a non-empty JSON list of per-agent entries"
    names = [(e.get("agent_ref") or {}).get("name") for e in entries]
    assert all(names) and len(set(names)) == len(names), "each entry names its agent once"
    for entry in entries:
        agent, key = entry["agent_metrics"], entry["key_metrics"]
        assert isinstance(agent, dict) and isinstance(key, dict)
        assert "repeat_level_metrics" in entry, "else compare recomputes it with a warning"
        assert key, "at least one key metric"
        for name in key:  # each key metric: a point value, its repeat spread and Student-t interval
            assert isinstance(agent[name], (int, float))
            for prefix in (
                "mean_across_repeats/",
                "se_across_repeats/",
                "ci_low_95_across_repeats/",
                "ci_high_95_across_repeats/",
            ):
                assert isinstance(agent[prefix + name], (int, float)), prefix + name
        repeats = entry["repeat_level_metrics"]
        assert len(repeats) >= 2, "Welch's interval needs two repeat-level observations a side"
        for repeat in repeats:
            assert isinstance(repeat["sample_count"], int) and isinstance(repeat["missing_count"], int)
            for name in key:
                assert math.isfinite(repeat[name])
        assert entry["group_level_metrics"], "a group per task"
        for group in entry["group_level_metrics"]:
            assert isinstance(group["_ng_task_index"], int) and isinstance(group["expected_num_rollouts"], int)
            for stat in ("mean/reward", "min/reward", "max/reward"):
                assert isinstance(group[stat], (int, float)), stat
            assert group["rollout_infos"] and all(
                isinstance(info["_ng_rollout_index"], int) and isinstance(info["reward"], (int, float))
                for info in group["rollout_infos"]
            )


@pytest.fixture
def nemo_gym_like_env():
    """The counter env answering /verify with NeMo Gym's reply fields, as NeMo Gym's counter server does."""
    with BackgroundServer(make_app(verify_reply="nemo_gym")) as server:
        yield server.url


@pytest.fixture
def env_without_aggregate_metrics():
    with BackgroundServer(make_app(aggregate_metrics_route=False)) as server:
        yield server.url


@pytest.fixture
def run_a_input(tmp_path, counter_tasks_path):
    """runA's input: the 5 counter tasks cycled to 20 rows (NeMo Gym numbers identical lines as one task)."""
    lines = [line for line in counter_tasks_path.read_text().splitlines() if line.strip()]
    path = tmp_path / "counter_20.jsonl"
    path.write_text("\n".join(lines * 4) + "\n")
    return path


def collect(agent_url, env_url, input_path, output, *extra):
    call_command(
        "collect",
        "--agent-url",
        agent_url,
        "--env-url",
        env_url,
        "--input",
        str(input_path),
        "--output",
        str(output),
        "--no-progress",
        *extra,
    )


def test_collect_writes_run_a_s_artifacts_with_its_keys_and_shapes(
    shared_data, tmp_path, run_a_input, nemo_gym_like_env, counter_agent_url
):
    run_a = shared_data / "eval_0.7.0" / "runA"
    out = tmp_path / "results" / "rollouts.jsonl"
    collect(counter_agent_url, nemo_gym_like_env, run_a_input, out, "--num-repeats", "4", "--concurrency", "8")

    # every artifact NeMo Gym wrote for runA (its health check's two files included), and no other
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in run_a.iterdir())
    ours, theirs = read_rows(out), read_rows(run_a / "rollouts.jsonl")
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in ours} == {
        (r["_ng_task_index"], r["_ng_rollout_index"]) for r in theirs
    }
    assert all(list(r) == list(theirs[0]) for r in ours), "the same keys in the same order as NeMo Gym's rows"
    assert {(r["_ng_environment_server"], r["_ng_result_type"]) for r in ours} == {
        ("remote_agent_environment_server", "legacy_agent")
    }
    # The same materialised rows (gymweb lists them by key; NeMo Gym by input row: order is not data).
    materialized = read_rows(out.parent / "rollouts_materialized_inputs.jsonl")
    by_key = lambda rows: sorted(((r["_ng_task_index"], r["_ng_rollout_index"]), list(r)) for r in rows)  # noqa: E731
    assert by_key(materialized) == by_key(read_rows(run_a / "rollouts_materialized_inputs.jsonl"))

    aggregate = out.parent / "rollouts_aggregate_metrics.json"
    assert shape(json.loads(aggregate.read_bytes())) == shape(
        json.loads((run_a / "rollouts_aggregate_metrics.json").read_bytes())
    )
    assert aggregate.read_bytes().startswith(
        b'[\n  {\n    "agent_ref": {\n      "name": "remote_agent"\n    },'
    )  # orjson, indent 2
    assert_compare_can_read(aggregate)
    run = Run.objects.get()
    assert run.aggregate_metrics_error == "" and [run.aggregate_metrics] == json.loads(aggregate.read_bytes())


def test_nemo_gyms_compare_reads_the_file_when_nemo_gym_is_installed(
    shared_data, tmp_path, run_a_input, nemo_gym_like_env, counter_agent_url
):
    loading = pytest.importorskip("nemo_gym.comparison.loading")
    diff = pytest.importorskip("nemo_gym.comparison.diff")
    out = tmp_path / "rollouts.jsonl"
    collect(counter_agent_url, nemo_gym_like_env, run_a_input, out, "--num-repeats", "4")
    baseline = loading.load_agg_metrics_file(
        str(shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl"), role="baseline"
    )
    candidate = loading.load_agg_metrics_file(str(out), role="candidate")
    comparison = diff.compare_runs(
        loading.build_loaded_run(baseline, "remote_agent"), [loading.build_loaded_run(candidate, "remote_agent")]
    )
    reward = next(row for row in comparison.metrics if row.metric == "mean/reward")
    assert reward.candidates[0].value == 1.0 and reward.candidates[0].delta_ci_low is not None
    assert comparison.flips[0].mode == "binary" and comparison.flips[0].common_task_count == 5


def test_the_sidecar_rows_carry_the_stamps_and_the_materialized_inputs_do_not(
    tmp_path, counter_env_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    collect("http://127.0.0.1:9", counter_env_url, counter_tasks_path, out, "--limit", "2")
    failures = read_rows(tmp_path / "rollouts_failures.jsonl")
    assert failures and all(list(r)[-2:] == ["_ng_environment_server", "_ng_result_type"] for r in failures)
    assert {r["_ng_environment_server"] for r in failures} == {"remote_agent_environment_server"}
    assert not any("_ng_environment_server" in r for r in read_rows(tmp_path / "rollouts_materialized_inputs.jsonl"))
    assert not (tmp_path / "rollouts_aggregate_metrics.json").exists(), "no successes, no file (as NeMo Gym)"


def test_an_env_without_aggregate_metrics_gets_the_file_computed_locally_and_a_note(
    tmp_path, counter_tasks_path, counter_agent_url, env_without_aggregate_metrics, capsys
):
    out = tmp_path / "rollouts.jsonl"
    collect(counter_agent_url, env_without_aggregate_metrics, counter_tasks_path, out, "--num-repeats", "2")
    err = capsys.readouterr().err
    assert "does not serve /aggregate_metrics" in err and "computed by gymweb" in err
    (entry,) = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_bytes())
    assert entry["agent_metrics"]["mean/reward"] == 1.0 and entry["agent_metrics"]["num_repeats"] == 2
    assert len(entry["repeat_level_metrics"]) == 2
    run = Run.objects.get()
    assert run.aggregate_metrics is None
    assert "does not serve /aggregate_metrics" in run.aggregate_metrics_error


def test_the_agent_name_names_the_environment_server(tmp_path, counter_tasks_path, counter_agent_url, counter_env_url):
    out = tmp_path / "rollouts.jsonl"
    collect(
        counter_agent_url, counter_env_url, counter_tasks_path, out, "--agent-name", "counter_agent", "--limit", "1"
    )
    (row,) = read_rows(out)
    assert row["agent_ref"] == {"name": "counter_agent"}
    assert list(row.items())[-2:] == [
        ("_ng_environment_server", "counter_environment_server"),
        ("_ng_result_type", "legacy_agent"),
    ]
    (entry,) = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_bytes())
    assert (
        entry["agent_ref"] == {"name": "counter_agent"}
        and entry["_ng_environment_server"] == "counter_environment_server"
    )


def test_an_aggregate_metrics_file_already_there_is_refused_unless_overwrite(
    tmp_path, counter_tasks_path, counter_agent_url, counter_env_url
):
    from django.core.management import CommandError

    out = tmp_path / "rollouts.jsonl"
    (tmp_path / "rollouts_aggregate_metrics.json").write_text("another run's")
    with pytest.raises(CommandError, match="rollouts_aggregate_metrics.json.*--overwrite"):
        collect(counter_agent_url, counter_env_url, counter_tasks_path, out, "--limit", "1")
    assert (tmp_path / "rollouts_aggregate_metrics.json").read_text() == "another run's" and not out.exists()
    collect(counter_agent_url, counter_env_url, counter_tasks_path, out, "--limit", "1", "--overwrite")
    assert (
        json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_bytes())[0]["agent_metrics"]["mean/reward"]
        == 1.0
    )
