"""Importing NeMo Gym's ``rollouts.jsonl`` (and its failures sidecar) into an ``imported`` run."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from rollouts.collection import export, importer
from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import (
    IMPORTED_FAILURE_KIND,
    NOT_RUN_ERROR,
    LooksLikeDatasetError,
    import_rollouts,
    infer_steps,
)
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

pytestmark = pytest.mark.django_db

COUNTER_PARAMS = {"input": [{"role": "user", "content": "add 1 then get the count"}], "tools": []}


def _lines(rows) -> io.BytesIO:
    return io.BytesIO("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode())


def _result_row(output=None, reward=1.0, **extra):
    return {
        "responses_create_params": COUNTER_PARAMS,
        "response": {"id": "resp_1", "model": "m", "object": "response", "output": output or [], "usage": None},
        "reward": reward,
        **extra,
    }


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _real_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/example_rollouts.jsonl")) + sorted(root.glob("collect_outputs/*/rollouts*.jsonl"))


# -- every real file ---------------------------------------------------------------------------
def test_every_real_nemo_gym_file_imports_with_one_rollout_per_row_and_every_item(shared_data):
    files = _real_files(shared_data)
    assert len(files) >= 12
    for path in files:
        rows = _read_rows(path)
        if path.name.endswith("_materialized_inputs.jsonl"):
            continue  # a dataset, not rollouts (test_a_materialized_inputs_file_is_recognised_as_a_dataset)
        with path.open("rb") as fh:
            if path.name.endswith("_failures.jsonl"):
                summary = import_rollouts(None, failures=fh, failures_source=path.name)
            else:
                summary = import_rollouts(fh, source=path.name)
        run = summary.run
        assert run.status == Run.Status.IMPORTED
        assert Rollout.objects.filter(run=run).count() == len(rows), path
        expected_items = 0
        for row in rows:
            if row.get("response") and row["response"].get("id") != "remote_agent_failure":
                expected_items += len(row["response"]["output"])
        assert TrajectoryItem.objects.filter(rollout__run=run).count() == expected_items == summary.items, path
        assert (
            not TrajectoryItem.objects.filter(rollout__run=run).exclude(origin=TrajectoryItem.Origin.IMPORTED).exists()
        )
        assert not TrajectoryItem.objects.filter(rollout__run=run, asked=True).exists()
        assert not AgentCall.objects.filter(rollout__run=run).exclude(latency_ms=0).exists()


def test_it_keeps_each_success_row_so_exporting_gives_the_file_back(shared_data):
    path = shared_data / "example_tool_call_multireward" / "example_rollouts.jsonl"
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    exported = sorted((json.loads(line) for line in export.iter_successes(run)), key=lambda r: r["_ng_task_index"])
    original = sorted(_read_rows(path), key=lambda r: r["_ng_task_index"])
    assert exported == original


def test_it_numbers_rows_without_indices_by_line_and_downloads_them_as_they_came(shared_data):
    path = shared_data / "example_single_tool_call" / "example_rollouts.jsonl"
    with path.open("rb") as fh:
        run = import_rollouts(fh, name="single").run
    keys = list(Rollout.objects.filter(run=run).order_by("id").values_list("task_index", "rollout_index", "attempt"))
    assert keys == [(i, 0, 1) for i in range(5)]
    assert run.name == "single" and run.num_tasks == 5 and run.num_keys == 5
    first = json.loads(Task.objects.get(run=run, task_index=0).row_json)
    assert first["_ng_task_index"] == 0 and "reward" not in first and "response" not in first
    # An imported file downloads byte for byte: no indices or agent_ref are added to its lines.
    assert [line + "\n" for line in export.iter_successes(run)] == path.read_text(encoding="utf-8").splitlines(
        keepends=True
    )
    assert run.agent_name == "remote_agent"


def test_it_infers_step_boundaries_from_the_merged_output_on_a_known_row(shared_data):
    path = shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl"
    first = _read_rows(path)[0]
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    rollout = Rollout.objects.get(run=run, task_index=first["_ng_task_index"], rollout_index=first["_ng_rollout_index"])
    items = list(rollout.items.order_by("seq").values_list("kind", "step"))
    # message, call, call, output, output | message, call, output | message, call, call, output ...
    assert items[:8] == [
        ("message", 0),
        ("function_call", 0),
        ("function_call", 0),
        ("function_call_output", 0),
        ("function_call_output", 0),
        ("message", 1),
        ("function_call", 1),
        ("function_call_output", 1),
    ]
    assert items[8][1] == 2
    steps = {step for _, step in items}
    assert rollout.num_agent_calls == len(steps) == AgentCall.objects.filter(rollout=rollout).count()
    assert list(rollout.agent_calls.order_by("index").values_list("index", flat=True)) == sorted(steps)


def test_infer_steps_starts_a_new_call_after_each_batch_of_outputs():
    kinds = [
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert infer_steps([{"type": k} for k in kinds]) == [0, 0, 0, 0, 0, 1, 1, 2]
    assert infer_steps([]) == []
    assert infer_steps([{"type": "message"}, {"type": "message"}]) == [0, 0]


def test_it_marks_answered_calls_paired_and_leaves_calls_without_output_unpaired(shared_data):
    path = shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl"
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    calls = TrajectoryItem.objects.filter(rollout__run=run, kind="function_call")
    outputs = TrajectoryItem.objects.filter(rollout__run=run, kind="function_call_output")
    assert calls.count() == 129 and outputs.count() == 124
    assert calls.filter(paired=False).count() == 5  # the data's calls left without an output
    assert calls.filter(paired=True).count() == 124
    assert outputs.filter(paired=True).count() == 124
    assert not outputs.filter(origin=TrajectoryItem.Origin.GYM).exists()


def test_failures_sidecar_rows_become_failed_attempts_with_their_terminal_flag(shared_data):
    folder = shared_data / "collect_outputs" / "mixed"
    with (folder / "rollouts.jsonl").open("rb") as main, (folder / "rollouts_failures.jsonl").open("rb") as side:
        summary = import_rollouts(
            main, failures=side, source="rollouts.jsonl", failures_source="rollouts_failures.jsonl"
        )
    run = summary.run
    assert (summary.succeeded, summary.failed, summary.not_run) == (4, 1, 0)
    failed = Rollout.objects.get(run=run, status=Rollout.Status.FAILED)
    assert failed.terminal is True
    assert failed.failure_kind == IMPORTED_FAILURE_KIND
    assert failed.reward == 0.0
    assert "not a Responses API object" in failed.error
    assert failed.items.count() == 0  # the placeholder response is not a trajectory
    assert run.num_tasks == 5 and run.num_keys == 5
    row = json.loads(next(export.iter_failures(run)))
    assert row["_ng_failure_terminal"] is True and row["error"] == failed.error


def test_a_failures_file_imported_alone_gives_non_terminal_failures(shared_data):
    path = shared_data / "collect_outputs" / "agent_down" / "rollouts_failures.jsonl"
    with path.open("rb") as fh:
        summary = import_rollouts(None, failures=fh, failures_source=path.name)
    assert summary.run.name == "rollouts_failures.jsonl"
    rollouts = Rollout.objects.filter(run=summary.run)
    assert rollouts.count() == 5 and set(rollouts.values_list("status", flat=True)) == {"failed"}
    assert not rollouts.filter(terminal=True).exists()
    assert all("Is your service running at" in e for e in rollouts.values_list("error", flat=True))


def test_a_materialized_inputs_file_is_recognised_as_a_dataset(shared_data):
    path = shared_data / "collect_outputs" / "mixed" / "rollouts_materialized_inputs.jsonl"
    with (
        path.open("rb") as fh,
        pytest.raises(
            LooksLikeDatasetError,
            match="this is NeMo Gym.s rollouts_materialized_inputs.jsonl, not rollouts: its 5 rows",
        ),
    ):
        import_rollouts(fh, source=path.name)
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0


def test_rows_without_a_result_among_results_are_kept_as_never_run_attempts():
    task = {"responses_create_params": COUNTER_PARAMS, "_ng_task_index": 1}
    summary = import_rollouts(_lines([_result_row(_ng_task_index=0), task]))
    assert (summary.succeeded, summary.not_run) == (1, 1)
    rollout = Rollout.objects.get(run=summary.run, task_index=1)
    assert rollout.status == Rollout.Status.CANCELLED and rollout.error == NOT_RUN_ERROR


def test_a_keys_failed_attempts_from_the_sidecar_come_before_its_success():
    row = _result_row(_ng_task_index=0, _ng_rollout_index=0)
    failure = {
        "responses_create_params": COUNTER_PARAMS,
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 0.0,
        "error": "boom",
        "_ng_failure_class": "remote_agent_error",
        "_gymweb_failure_kind": "agent_http_error",
    }
    summary = import_rollouts(_lines([row]), failures=_lines([failure, failure]))
    attempts = list(
        Rollout.objects.filter(run=summary.run).order_by("attempt").values_list("attempt", "status", "failure_kind")
    )
    assert attempts == [(1, "failed", "agent_http_error"), (2, "failed", "agent_http_error"), (3, "succeeded", "")]


def test_usage_is_taken_from_the_response_when_it_is_complete(shared_data):
    path = shared_data / "example_tool_call_multireward" / "example_rollouts.jsonl"
    row = _read_rows(path)[0]
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    rollout = Rollout.objects.get(run=run, task_index=row["_ng_task_index"])
    assert rollout.usage_reported
    assert (rollout.input_tokens, rollout.output_tokens, rollout.total_tokens) == (
        row["response"]["usage"]["input_tokens"],
        row["response"]["usage"]["output_tokens"],
        row["response"]["usage"]["total_tokens"],
    )


def test_partial_usage_is_not_reported_and_says_so():
    row = _result_row([{"type": "message", "role": "assistant", "content": []}])
    row["response"]["usage"] = {"input_tokens": 3}
    run = import_rollouts(_lines([row])).run
    rollout = Rollout.objects.get(run=run)
    assert not rollout.usage_reported and rollout.input_tokens is None
    assert rollout.warnings and "partial" in rollout.warnings[0]


def test_it_streams_in_batches_and_keeps_every_row(monkeypatch):
    monkeypatch.setattr(importer, "ROWS_PER_BATCH", 7)
    monkeypatch.setattr(importer, "ITEMS_PER_BATCH", 10)
    output = [
        {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    ]
    rows = [_result_row(output, reward=i % 2) for i in range(50)]
    summary = import_rollouts(_lines(rows))
    assert Rollout.objects.filter(run=summary.run).count() == 50
    assert TrajectoryItem.objects.filter(rollout__run=summary.run).count() == 150
    assert AgentCall.objects.filter(rollout__run=summary.run).count() == 100
    assert Task.objects.filter(run=summary.run).count() == 50
    assert set(
        Rollout.objects.filter(run=summary.run).values_list("num_agent_calls", "num_items", "num_tool_calls")
    ) == {(2, 3, 1)}


def test_a_tasks_rollouts_far_apart_in_the_file_import_as_with_every_task_row_kept(monkeypatch, shared_data):
    # A real file of `gym eval run`, its rows shuffled further so that a task's rollouts are far
    # apart: with 1 task row kept in memory, most rows read their task's row back from the
    # database, and the import stores exactly what it stores with every task row kept.
    path = shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl"  # 5 tasks × 16 rollouts
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[::2] + lines[1::2]
    monkeypatch.setattr(importer, "ROWS_PER_BATCH", 2)

    def imported(kept: int):
        monkeypatch.setattr(importer, "TASK_ROWS_KEPT", kept)
        run = import_rollouts(_lines(lines)).run
        stored = Rollout.objects.filter(run=run).order_by("id")
        return list(stored.values_list("task_index", "rollout_index", "source_text", "verify_json")), list(
            export.iter_successes(run)
        )

    read_back = []
    real_task_row = importer._Importer._task_row

    def spy(self, task_index):
        if task_index not in self.task_rows and task_index not in self.unwritten_rows:
            read_back.append(task_index)
        return real_task_row(self, task_index)

    monkeypatch.setattr(importer._Importer, "_task_row", spy)
    everything = imported(10**6)
    assert read_back == []
    assert imported(1) == everything
    assert read_back, "no task row was read back: the test does not cover it"
    assert everything[1] and sorted(everything[1]) == sorted(lines)


# -- bad input -------------------------------------------------------------------------------
GOOD = json.dumps(_result_row())


@pytest.mark.parametrize(
    "lines, message",
    [
        ([GOOD, "{not json"], "rollouts.jsonl, line 2: not valid JSON"),
        ([GOOD, "", "[1, 2]"], "rollouts.jsonl, line 3: each line must be a JSON object"),
        (['{"reward": 1}'], "rollouts.jsonl, line 1: the row has no 'responses_create_params'"),
        ([json.dumps(_result_row(reward="1"))], "line 1: 'reward' must be a number"),
        ([json.dumps({**_result_row(), "response": "text"})], "line 1: 'response' must be a JSON object"),
        ([json.dumps(_result_row(output=[1]))], "line 1: 'response.output[0]' must be a JSON object"),
        (
            [json.dumps({k: v for k, v in _result_row().items() if k != "reward"})],
            "line 1: the row has a 'response' but no 'reward'",
        ),
        ([json.dumps(_result_row(_ng_task_index="0"))], "line 1: '_ng_task_index' must be an integer"),
        (
            [GOOD, GOOD.replace('"reward"', '"_ng_task_index": 0, "reward"')],
            "line 2: a second result for task 0, rollout 0 (the first is at rollouts.jsonl, line 1)",
        ),
        ([], "rollouts.jsonl: the file has no rows"),
        ([GOOD.replace('"reward": 1.0', '"reward": NaN')], "line 1: not valid JSON (NaN is not a JSON value)"),
        ([json.dumps(_result_row(_ng_task_index=2**40))], "line 1: '_ng_task_index' must be between 0 and 2147483647"),
    ],
)
def test_bad_lines_are_rejected_with_the_file_and_line_and_nothing_is_stored(lines, message):
    with pytest.raises(DatasetError) as info:
        import_rollouts(io.BytesIO("\n".join(lines).encode()), source="rollouts.jsonl")
    assert message in str(info.value)
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0 and Task.objects.count() == 0
    assert TrajectoryItem.objects.count() == 0 and AgentCall.objects.count() == 0


def test_a_bad_line_late_in_a_big_file_stores_nothing(monkeypatch):
    monkeypatch.setattr(importer, "ROWS_PER_BATCH", 5)
    rows = [GOOD.replace('"reward"', f'"_ng_task_index": {i}, "reward"') for i in range(30)] + ["{oops"]
    with pytest.raises(DatasetError, match="line 31: not valid JSON"):
        import_rollouts(_lines(rows))
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0 and TrajectoryItem.objects.count() == 0


def test_a_bad_line_in_the_sidecar_names_the_sidecar():
    with pytest.raises(DatasetError, match=r"side\.jsonl, line 1: not valid UTF-8"):
        import_rollouts(_lines([GOOD]), failures=io.BytesIO(b"\xff\xfe\n"), failures_source="side.jsonl")
    assert Run.objects.count() == 0


# -- the management command ----------------------------------------------------------------------
def test_the_import_command_imports_a_file_and_its_sidecar(shared_data, capsys):
    folder = shared_data / "collect_outputs" / "mixed"
    call_command(
        "import_rollouts",
        str(folder / "rollouts.jsonl"),
        "--failures",
        str(folder / "rollouts_failures.jsonl"),
        "--name",
        "mixed",
    )
    run = Run.objects.get()
    assert run.name == "mixed" and run.status == Run.Status.IMPORTED
    assert "4 succeeded, 1 failed" in capsys.readouterr().out


def test_the_import_command_reports_a_bad_line_and_stores_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "\n{nope\n")
    with pytest.raises(CommandError, match=r"bad\.jsonl, line 2: not valid JSON"):
        call_command("import_rollouts", str(bad))
    assert Run.objects.count() == 0
