"""``manage.py aggregate`` (``rollouts.evaluation.shards``): NeMo Gym's ``gym eval aggregate`` over
shards with their sidecars: merged files, the aggregate metrics file, NeMo Gym's rules for failed and
missing rollouts, and never replacing a file unless ``--overwrite``."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from gymweb.examples._serve import BackgroundServer
from gymweb.examples.counter_env import make_app
from rollouts.evaluation.shards import expand_input_glob, merge_shards


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def success(task, rollout, reward, **extra):
    return {
        "responses_create_params": {"input": f"task {task}"},
        "response": {"output": [], "usage": {"input_tokens": 2 + task}},
        "reward": reward,
        **extra,
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": "remote_agent"},
    }


def failure(task, rollout, error="agent down", **extra):
    return {
        "responses_create_params": {"input": f"task {task}"},
        "difficulty": "hard",
        "agent_ref": {"name": "remote_agent"},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "response": {"id": "remote_agent_failure", "output": []},
        "reward": 0.0,
        "_ng_failure_class": "remote_agent_error",
        "error": error,
        **extra,
    }


def materialized(task, rollout):
    return {
        "responses_create_params": {"input": f"task {task}"},
        "difficulty": "hard",
        "agent_ref": {"name": "remote_agent"},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


@pytest.fixture
def shards(tmp_path):
    """Two shards of one run (tasks 0-1 and 2-3, 2 repeats). Shard a: (1, 1) failed twice and never
    landed; (0, 1) failed once, then landed. Shard b has no sidecar, and its (3, 1) left no row at all."""
    d = tmp_path / "shards"
    d.mkdir()
    jsonl(d / "a.jsonl", [success(0, 0, 1.0), success(0, 1, 0.0, difficulty="hard"), success(1, 0, 1.0)])
    jsonl(d / "a_failures.jsonl", [failure(1, 1, "first"), failure(1, 1, "second"), failure(0, 1, "then it passed")])
    jsonl(d / "a_materialized_inputs.jsonl", [materialized(t, r) for t in (0, 1) for r in (0, 1)])
    jsonl(d / "b.jsonl", [success(3, 0, 1.0), success(2, 1, 1.0), success(2, 0, 0.0)])
    jsonl(d / "b_materialized_inputs.jsonl", [materialized(t, r) for t in (2, 3) for r in (0, 1)])
    return d


def run(*args):
    call_command("aggregate", *args)


def test_it_merges_shards_and_their_sidecars_and_writes_the_metrics(shards, tmp_path, capsys):
    out = tmp_path / "merged.jsonl"
    run("--input-glob", str(shards / "*.jsonl"), "--output", str(out))
    merged = read_rows(out)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in merged] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 0),
        (2, 1),
        (3, 0),
    ]
    assert (
        out.read_bytes().splitlines()[0] == json.dumps(merged[0], separators=(",", ":")).encode()
    )  # orjson's compact bytes
    assert [r["error"] for r in read_rows(tmp_path / "merged_failures.jsonl")] == ["first", "second", "then it passed"]
    assert len(read_rows(tmp_path / "merged_materialized_inputs.jsonl")) == 8
    (entry,) = json.loads((tmp_path / "merged_aggregate_metrics.json").read_bytes())
    assert (
        entry["agent_ref"] == {"name": "remote_agent"}
        and entry["_ng_environment_server"] == "remote_agent_environment_server"
    )
    assert entry["agent_metrics"]["mean/reward"] == 4 / 6 and len(entry["group_level_metrics"]) == 4
    out_text = capsys.readouterr()
    assert (
        "Aggregated 2 shard(s)" in out_text.out
        and "3 failure row(s)" in out_text.out
        and "no failures sidecar" in out_text.out
    )
    assert "Rollouts missing from the score: 1 of 7 materialized (1 remote_agent_error" in out_text.out
    assert "computed by gymweb" in out_text.err


def test_failed_and_missing_rollouts_count_as_zero_only_when_asked_and_as_nemo_gym_picks_them(shards):
    paths = expand_input_glob(str(shards / "*.jsonl"))
    assert [p.name for p in paths] == ["a.jsonl", "b.jsonl"]  # the sidecars match the glob but are not shards
    plain = merge_shards(paths)
    counted = merge_shards(
        paths, count_failure_classes_as_zero=["remote_agent_error"], count_missing_rollouts_as_zero=True
    )
    assert counted.counted == {"failures": 1, "missing": 1}  # (1, 1) once, its last attempt; not (0, 1), which landed
    (entry,) = counted.aggregate.entries
    assert (
        entry["agent_metrics"]["mean/reward"] == 4 / 8
        and plain.aggregate.entries[0]["agent_metrics"]["mean/reward"] == 4 / 6
    )
    task1 = next(g for g in entry["group_level_metrics"] if g["_ng_task_index"] == 1)
    assert [i["reward"] for i in task1["rollout_infos"]] == [1.0, 0.0]
    # the failure diagnostics (an HTTP status would be a number) never reach the metrics
    assert not any("failure" in name or "error" in name for name in entry["agent_metrics"])
    assert counted.coverage_lines() == ["Scored as zero because they left no row: 1 of 8 rollouts"]
    assert len(counted.success_lines) == 6, "counted zeros go into the metrics only, never into the merged rollouts"


def test_it_never_replaces_existing_files_unless_asked(shards, tmp_path):
    out = tmp_path / "merged.jsonl"
    (tmp_path / "merged_aggregate_metrics.json").write_text("mine")
    with pytest.raises(CommandError, match=r"already exists.*merged_aggregate_metrics.json.*--overwrite"):
        run("--input-glob", str(shards / "*.jsonl"), "--output", str(out))
    assert not out.exists() and (tmp_path / "merged_aggregate_metrics.json").read_text() == "mine"
    run("--input-glob", str(shards / "*.jsonl"), "--output", str(out), "--overwrite")
    assert json.loads((tmp_path / "merged_aggregate_metrics.json").read_bytes())[0]["agent_metrics"]


def test_an_earlier_merged_file_matching_the_glob_is_not_read_as_a_shard(shards, capsys):
    out = shards / "merged.jsonl"
    run("--input-glob", str(shards / "*.jsonl"), "--output", str(out))
    run("--input-glob", str(shards / "*.jsonl"), "--output", str(out), "--overwrite")
    assert "merged.jsonl is one of this command's outputs; not read as a shard" in capsys.readouterr().err
    assert len(read_rows(out)) == 6


def test_overlapping_shards_are_refused_with_both_places(shards, tmp_path):
    jsonl(shards / "c.jsonl", [success(2, 1, 0.0)])
    with pytest.raises(
        CommandError, match=r"c.jsonl, line 1: a second success row for task 2, rollout 1 .*b.jsonl, line 2"
    ):
        run("--input-glob", str(shards / "*.jsonl"), "--output", str(tmp_path / "m.jsonl"))
    assert list(tmp_path.glob("m*")) == []


def test_shards_of_two_environment_servers_may_reuse_task_indices(tmp_path):
    jsonl(tmp_path / "math.jsonl", [success(0, 0, 1.0, _ng_environment_server="math_environment_server")])
    jsonl(tmp_path / "code.jsonl", [success(0, 0, 0.0, _ng_environment_server="code_environment_server")])
    result = merge_shards([tmp_path / "math.jsonl", tmp_path / "code.jsonl"])
    assert [e["_ng_environment_server"] for e in result.aggregate.entries] == [
        "math_environment_server",
        "code_environment_server",
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json\n", r"bad.jsonl, line 1: not valid JSON"),
        ("[1]\n", r"bad.jsonl, line 1: expected a JSON object"),
        ('{"reward": 1}\n', r"bad.jsonl, line 1: the row has no _ng_task_index"),
    ],
)
def test_bad_shards_are_reported_with_file_and_line(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(CommandError, match=message):
        run("--input-glob", str(tmp_path / "*.jsonl"), "--output", str(tmp_path / "out" / "m.jsonl"))
    assert not (tmp_path / "out").exists()


def test_no_match_is_an_error(tmp_path):
    with pytest.raises(CommandError, match="no shards matched"):
        run("--input-glob", str(tmp_path / "nothing-*.jsonl"), "--output", str(tmp_path / "m.jsonl"))


def test_without_merging_only_the_metrics_are_written(shards, tmp_path):
    run(
        "--input-glob",
        f"{shards / 'a.jsonl'}, {shards / 'b.jsonl'}",
        "--output",
        str(tmp_path / "m.jsonl"),
        "--no-merge-shards",
    )
    assert sorted(p.name for p in tmp_path.glob("m*")) == ["m_aggregate_metrics.json"]


def test_the_env_at_env_url_answers_the_metrics(shards, tmp_path, capsys):
    with BackgroundServer(make_app()) as env:
        run("--input-glob", str(shards / "*.jsonl"), "--output", str(tmp_path / "m.jsonl"), "--env-url", env.url)
    assert "computed by gymweb" not in capsys.readouterr().err
    assert json.loads((tmp_path / "m_aggregate_metrics.json").read_bytes())[0]["key_metrics"]["mean/reward"] == 4 / 6


def test_shards_of_nemo_gyms_run_b_merge_back_into_its_files(shared_data, tmp_path):
    source = shared_data / "eval_0.7.0" / "runB"
    for name in ("rollouts", "rollouts_failures", "rollouts_materialized_inputs"):
        rows = (source / f"{name}.jsonl").read_bytes().splitlines()
        for part in range(3):
            mine = [line for line in rows if json.loads(line)["_ng_task_index"] % 3 == part]
            (tmp_path / f"part{part}{name[len('rollouts') :]}.jsonl").write_bytes(
                b"".join(line + b"\n" for line in mine)
            )
    out = tmp_path / "out" / "rollouts.jsonl"
    run("--input-glob", str(tmp_path / "part*.jsonl"), "--output", str(out))
    assert (out.parent / "rollouts_aggregate_metrics.json").read_bytes() == (
        source / "rollouts_aggregate_metrics.json"
    ).read_bytes()
    key = lambda line: (json.loads(line)["_ng_task_index"], json.loads(line)["_ng_rollout_index"])  # noqa: E731
    assert out.read_bytes().splitlines() == sorted((source / "rollouts.jsonl").read_bytes().splitlines(), key=key)
    assert sorted(read_rows(out.parent / "rollouts_failures.jsonl"), key=lambda r: r["_ng_rollout_index"]) == sorted(
        read_rows(source / "rollouts_failures.jsonl"), key=lambda r: r["_ng_rollout_index"]
    )
