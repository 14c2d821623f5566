"""Importing several shards of one run as one run (``importer.import_shards``): ``manage.py
import_rollouts FILE...`` / ``--input-glob`` (each shard's ``_failures.jsonl`` beside it) and several
files on the import page."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.collection import export
from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import import_rollouts, import_shards
from rollouts.models import Rollout, Run

pytestmark = pytest.mark.django_db


def split_run_b(shared_data, folder):
    """NeMo Gym's runB split into 3 shards by task (rows, sidecars, materialised inputs)."""
    source = shared_data / "eval_0.7.0" / "runB"
    for name in ("rollouts", "rollouts_failures", "rollouts_materialized_inputs"):
        rows = (source / f"{name}.jsonl").read_bytes().splitlines()
        for part in range(3):
            mine = [line for line in rows if json.loads(line)["_ng_task_index"] % 3 == part]
            (folder / f"part{part}{name[len('rollouts') :]}.jsonl").write_bytes(b"".join(line + b"\n" for line in mine))
    return source


def summary_of(run):
    rollouts = Rollout.objects.filter(run=run)
    return (
        run.num_tasks,
        run.num_keys,
        rollouts.filter(status="succeeded").count(),
        rollouts.filter(status="failed").count(),
        sorted(export.iter_successes(run)),
        sorted(export.iter_failures(run)),
    )


def test_the_shards_of_a_run_import_as_that_run(shared_data, tmp_path, capsys):
    source = split_run_b(shared_data, tmp_path)
    call_command("import_rollouts", "--input-glob", str(tmp_path / "part*.jsonl"))
    sharded = Run.objects.get()
    assert "from 3 shard(s) and 3 failures sidecar(s)" in capsys.readouterr().out
    with (source / "rollouts.jsonl").open("rb") as fh, (source / "rollouts_failures.jsonl").open("rb") as failures:
        whole = import_rollouts(fh, failures=failures).run
    assert summary_of(sharded) == summary_of(whole)
    assert (sharded.num_keys, sharded.status) == (80, Run.Status.IMPORTED)
    assert sharded.name == "part0.jsonl + 5 more file(s)"  # file names, not paths


def test_several_files_on_the_command_line_are_shards_too(shared_data, tmp_path):
    split_run_b(shared_data, tmp_path)
    call_command(
        "import_rollouts", str(tmp_path / "part0.jsonl"), str(tmp_path / "part1.jsonl"), "--name", "two of three"
    )
    run = Run.objects.get()
    assert run.name == "two of three"
    assert Rollout.objects.filter(run=run, status="failed").count() == 16  # part1's sidecar came along
    assert set(Rollout.objects.filter(run=run).values_list("task_index", flat=True)) == {0, 1, 3, 4}


def test_overlapping_shards_are_refused_and_nothing_is_stored(tmp_path):
    row = {
        "responses_create_params": {"input": "x"},
        "response": {"output": []},
        "reward": 1.0,
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
    }
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text(json.dumps(row) + "\n")
    with pytest.raises(
        CommandError,
        match=r"b.jsonl.*line 1.*second result for task 0, rollout 0 \(the first is at .*a.jsonl, line 1\)",
    ):
        call_command("import_rollouts", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))
    assert Run.objects.count() == 0


def test_failures_goes_with_a_single_file_and_an_empty_glob_is_an_error(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    with pytest.raises(CommandError, match="--failures goes with a single FILE"):
        call_command(
            "import_rollouts",
            str(tmp_path / "a.jsonl"),
            str(tmp_path / "a.jsonl"),
            "--failures",
            str(tmp_path / "a.jsonl"),
        )
    with pytest.raises(CommandError, match="no shards matched"):
        call_command("import_rollouts", "--input-glob", str(tmp_path / "none*.jsonl"))
    with pytest.raises(CommandError, match="give a rollouts.jsonl, a --failures file, both, or several shards"):
        call_command("import_rollouts")


def test_rows_without_indices_are_numbered_on_across_shards(tmp_path):
    row = {"responses_create_params": {"input": "x"}, "response": {"output": []}, "reward": 1.0}
    summary = import_shards([([json.dumps(row), json.dumps(row)], "a"), ([json.dumps(row)], "b")])
    assert sorted(Rollout.objects.filter(run=summary.run).values_list("task_index", flat=True)) == [0, 1, 2]
    with pytest.raises(DatasetError, match="the files have no rows"):
        import_shards([([], "a"), ([""], "b")])


def test_the_import_page_takes_several_shards_and_their_sidecars(signed_in, shared_data, tmp_path):
    split_run_b(shared_data, tmp_path)
    files = lambda pattern: [SimpleUploadedFile(p.name, p.read_bytes()) for p in sorted(tmp_path.glob(pattern))]  # noqa: E731
    response = signed_in.post(
        reverse("import"), {"rollouts": files("part?.jsonl"), "failures": files("part?_failures.jsonl")}
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[run.pk])
    assert (run.num_keys, Rollout.objects.filter(run=run, status="failed").count()) == (80, 16)
    page = signed_in.get(response["Location"]).content.decode()
    assert "from 3 shards" in page
    assert "multiple" in signed_in.get(reverse("import")).content.decode()


def test_a_bad_line_in_one_shard_names_that_shard_on_the_page(signed_in):
    good = json.dumps({"responses_create_params": {"input": "x"}, "response": {"output": []}, "reward": 1.0})
    response = signed_in.post(
        reverse("import"),
        {"rollouts": [SimpleUploadedFile("good.jsonl", good.encode()), SimpleUploadedFile("bad.jsonl", b"{nope\n")]},
    )
    assert response.status_code == 400
    assert "bad.jsonl" in response.content.decode() and "line 1" in response.content.decode()
    assert Run.objects.count() == 0
