"""gymweb writes NeMo Gym 0.7.0's files byte for byte, and every NeMo Gym file survives import and
download unchanged (the recorded outputs in ``../shared/data/nemo_gym/``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollouts.collection import export
from rollouts.collection.importer import import_rollouts
from rollouts.engine.nemo_request import as_sent, materialize, materialize_response
from rollouts.models import Rollout

DATA = Path(__file__).parent / "data"
RUN_DIRS = ("eval_0.7.0/runA", "eval_0.7.0/runB", "collect_outputs/mixed", "collect_outputs/agent_down")


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def _materialized_rows(run_dir: Path) -> dict[tuple[int, int], dict]:
    rows = {}
    for line in _lines(run_dir / "rollouts_materialized_inputs.jsonl"):
        row = json.loads(line)
        rows[(row["_ng_task_index"], row["_ng_rollout_index"])] = row
    return rows


def test_the_request_model_dumps_params_as_nemo_gyms_model_does():
    cases = json.loads((DATA / "nemo_request_dumps.json").read_text())["cases"]
    checked = [c for c in cases if not c.get("nemo_gym_refuses")]
    assert len(checked) > 20
    for case in checked:
        assert json.dumps(materialize(case["params"])) == json.dumps(case["materialized"]), case["source"]
        assert json.dumps(as_sent(case["params"])) == json.dumps(case["sent"]), case["source"]
    refused = [c for c in cases if c.get("nemo_gym_refuses")]
    assert refused and all(materialize(c["params"]) == c["params"] for c in refused)


def test_the_response_model_dumps_replies_as_nemo_gyms_model_does():
    cases = json.loads((DATA / "nemo_request_dumps.json").read_text())["responses"]
    assert len(cases) > 10
    for case in cases:
        assert json.dumps(materialize_response(case["response"])) == json.dumps(case["materialized"]), case["source"]


def test_failure_rows_are_nemo_gyms_bytes(shared_data):
    """The materialised row of each recorded failure through gymweb's failure-row writer gives the
    recorded sidecar line, byte for byte (runB's terminal failures, agent_down's unreachable ones)."""
    compared = 0
    for run_dir in RUN_DIRS:
        folder = shared_data / run_dir
        inputs = _materialized_rows(folder)
        for line in _lines(folder / "rollouts_failures.jsonl"):
            recorded = json.loads(line)
            task_row = dict(inputs[(recorded["_ng_task_index"], recorded["_ng_rollout_index"])])
            rollout_index = task_row.pop("_ng_rollout_index")
            row = export.failure_row(
                task_row, rollout_index, recorded["error"], recorded.get("_ng_failure_terminal", False)
            )
            assert export.row_line(row).encode() == line, f"{run_dir}: task {recorded['_ng_task_index']}"
            assert "_gymweb_failure_kind" not in row and row["mask_sample"] is False and row["failure_kind"] is None
            compared += 1
    assert compared == 16 + 1 + 5


def test_success_rows_are_nemo_gyms_bytes(shared_data):
    """The env's /verify reply (a recorded row without the collector's keys) through gymweb's
    success-row writer gives the recorded line, byte for byte."""
    compared = 0
    for run_dir in RUN_DIRS:
        path = shared_data / run_dir / "rollouts.jsonl"
        if not path.exists():
            continue
        for line in _lines(path):
            recorded = json.loads(line)
            verify = {k: v for k, v in recorded.items() if not k.startswith("_ng_") and k != "agent_ref"}
            row = export.success_row(
                json.dumps(verify), recorded["_ng_task_index"], recorded["_ng_rollout_index"], recorded["agent_ref"]
            )
            assert export.row_line(row).encode() == line
            compared += 1
    assert compared == 80 + 64 + 4


@pytest.mark.django_db
@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_import_then_download_gives_every_file_back_byte_for_byte(shared_data, run_dir):
    folder = shared_data / run_dir
    names = {
        "rollouts": "rollouts.jsonl",
        "failures": "rollouts_failures.jsonl",
        "materialized": "rollouts_materialized_inputs.jsonl",
    }
    files = {kind: folder / name for kind, name in names.items() if (folder / name).exists()}
    with files["materialized"].open("rb") as materialized, files["failures"].open("rb") as failures:
        rollouts = files["rollouts"].open("rb") if "rollouts" in files else None
        try:
            summary = import_rollouts(rollouts, failures=failures, materialized=materialized)
        finally:
            if rollouts:
                rollouts.close()
    run = summary.run
    downloads = {
        "rollouts": export.iter_successes(run),
        "failures": export.iter_failures(run),
        "materialized": export.iter_materialized(run),
    }
    for kind, path in files.items():
        got = "".join(line + "\n" for line in downloads[kind]).encode()
        assert got == path.read_bytes(), f"{run_dir}/{path.name}"
    # NeMo Gym's success and input lines are what gymweb writes anyway: none had to be kept as it
    # came (a failure line is, when the stamps it carries are not on its task's materialised row).
    rollouts = Rollout.objects.filter(run=run)
    assert rollouts.exists()
    assert not rollouts.exclude(input_text="").exists()
    assert not rollouts.filter(status=Rollout.Status.SUCCEEDED).exclude(source_text="").exists()


@pytest.mark.django_db
def test_a_line_the_export_would_write_otherwise_is_kept_as_it_came(shared_data):
    folder = shared_data / "collect_outputs/mixed"
    spaced = [json.dumps(json.loads(line)).encode() for line in _lines(folder / "rollouts_failures.jsonl")]
    text = b"\n".join(spaced) + b"\n"
    summary = import_rollouts(
        None, failures=[text.decode()], materialized=(folder / "rollouts_materialized_inputs.jsonl").open("rb")
    )
    assert "".join(line + "\n" for line in export.iter_failures(summary.run)).encode() == text


@pytest.mark.django_db
def test_reverifying_nemo_gyms_run_a_from_its_files_sends_every_task_field(
    shared_data, counter_env_url, tmp_path, capsys
):
    """``reverify --inputs --rollouts --output`` on runA's files: every /verify carries the task
    fields NeMo Gym's env left out of the results (``expected_count``, ``initial_count``, taken from
    the materialised inputs), so all 80 are verified (before, all 80 failed with HTTP 422). The
    counter env scores a verify without the rollout's session 0.0, which is what NeMo Gym's
    reverify (it sends no session either) gets from the same env for the same rows."""
    from django.core.management import call_command

    from rollouts.models import Run

    folder = shared_data / "eval_0.7.0/runA"
    out = tmp_path / "reverified.jsonl"
    call_command(
        "reverify",
        "--inputs",
        str(folder / "rollouts_materialized_inputs.jsonl"),
        "--rollouts",
        str(folder / "rollouts.jsonl"),
        "--output",
        str(out),
        "--env-url",
        counter_env_url,
        "--force",
    )
    assert "80 reverified, 0 /verify failure(s)" in capsys.readouterr().out
    new = Run.objects.get(reverified_from__isnull=False)
    assert new.name.startswith("unsafe_")
    inputs = _materialized_rows(folder)
    rows = [json.loads(line) for line in _lines(tmp_path / "unsafe_reverified.jsonl")]
    assert len(rows) == 80
    for row in rows:
        task = inputs[(row["_ng_task_index"], row["_ng_rollout_index"])]
        assert (row["expected_count"], row["initial_count"]) == (task["expected_count"], task["initial_count"])
        assert row["reward"] == 0.0


@pytest.mark.django_db
def test_the_raw_row_of_an_imported_failure_is_its_line(shared_data):
    from rollouts.web.trajectory_views import raw_row

    folder = shared_data / "collect_outputs/mixed"
    with (
        (folder / "rollouts_failures.jsonl").open("rb") as failures,
        (folder / "rollouts_materialized_inputs.jsonl").open("rb") as inputs,
    ):
        run = import_rollouts(None, failures=failures, materialized=inputs).run
    failed = Rollout.objects.get(run=run, status=Rollout.Status.FAILED)
    assert raw_row(failed) == json.loads(_lines(folder / "rollouts_failures.jsonl")[0])


def _other_rollouts_files(root: Path) -> list[Path]:
    """Every other NeMo Gym rollouts file in the shared data (examples, tau2, coding agents, ...)."""
    run_dirs = {root / d for d in RUN_DIRS}
    return sorted(p for p in root.rglob("*rollouts.jsonl") if p.parent not in run_dirs)


@pytest.mark.django_db
def test_every_other_nemo_gym_rollouts_file_downloads_unchanged(shared_data):
    files = _other_rollouts_files(shared_data)
    assert len(files) >= 8
    for path in files:
        inputs = export.output_stems(path)["materialized"]
        with path.open("rb") as fh:
            materialized = inputs.open("rb") if inputs.exists() else None
            try:
                run = import_rollouts(fh, source=str(path), materialized=materialized).run
            finally:
                if materialized:
                    materialized.close()
        got = "".join(line + "\n" for line in export.iter_successes(run)).encode()
        content = path.read_bytes()  # one of them lacks the final newline: every downloaded line ends with one
        assert got == content + (b"" if content.endswith(b"\n") else b"\n"), path
        if inputs.exists():
            assert "".join(line + "\n" for line in export.iter_materialized(run)).encode() == inputs.read_bytes(), (
                inputs
            )
