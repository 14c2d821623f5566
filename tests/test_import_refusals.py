"""Imports that should not be accepted as they are: a dataset given as rollouts, the
rollouts and failures files swapped, a failures file in the rollouts slot, a rollouts file in the
failures slot; and an imported run's header, which must count tasks × repeats from the file's keys.
Command and web page alike; nothing is stored when a file is refused."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.collection.importer import LooksLikeDatasetError, WrongFileError, import_rollouts
from rollouts.models import Dataset, Rollout, Run

pytestmark = pytest.mark.django_db


def upload(path_or_name, text=None):
    if text is None:
        return SimpleUploadedFile(path_or_name.name, path_or_name.read_bytes(), content_type="application/jsonl")
    return SimpleUploadedFile(path_or_name, text.encode(), content_type="application/jsonl")


def _nothing_stored():
    return Run.objects.count() == 0 and Rollout.objects.count() == 0


# -- a dataset given as rollouts ---------------------------------------------------------------
def test_a_task_file_is_recognised_as_a_dataset_and_nothing_is_imported(shared_data):
    path = shared_data / "workplace_assistant" / "example.jsonl"
    with path.open("rb") as fh, pytest.raises(LooksLikeDatasetError) as caught:
        import_rollouts(fh, source=path.name)
    assert str(caught.value).startswith(
        "example.jsonl: this is a dataset, not rollouts: its 5 rows have 'responses_create_params'"
    )
    assert _nothing_stored()


def test_a_dataset_file_is_told_apart_before_anything_is_written(monkeypatch):
    from django.db.models.signals import post_save

    from rollouts.collection import importer

    lines = [
        json.dumps({"responses_create_params": {"input": f"task {i}"}}) for i in range(3 * importer.ROWS_PER_BATCH)
    ]
    saved = []
    post_save.connect(lambda sender, **kw: saved.append(sender), weak=False, dispatch_uid="told-apart")
    monkeypatch.setattr(importer._Importer, "flush", lambda self: saved.append("a batch"))
    try:
        with pytest.raises(LooksLikeDatasetError, match=f"its {len(lines):,} rows"):
            import_rollouts(io.BytesIO(("\n".join(lines) + "\n").encode()), source="tasks.jsonl")
    finally:
        post_save.disconnect(dispatch_uid="told-apart")
    assert saved == []  # no run made, no batch written (and so none deleted again)


def test_the_import_page_offers_a_new_run_from_a_dataset_file(signed_in, shared_data, user):
    path = shared_data / "workplace_assistant" / "example.jsonl"
    response = signed_in.post(reverse("import"), {"rollouts": upload(path)})
    assert response.status_code == 400
    html = response.content.decode()
    assert "this is a dataset, not rollouts" in html and "Imported" not in html
    assert _nothing_stored()
    dataset = Dataset.objects.get()
    assert (dataset.name, dataset.num_rows, dataset.created_by) == ("example.jsonl", 5, user)
    link = re.search(r'id="start-run-from-dataset" href="([^"]+)"', html).group(1)
    assert link == reverse("run_new") + f"?dataset={dataset.pk}"
    form = signed_in.get(link).content.decode()
    assert re.search(rf'<option value="{dataset.pk}" selected>', form)
    # The same file again reuses the stored dataset instead of keeping a copy.
    again = signed_in.post(reverse("import"), {"rollouts": upload(path)})
    assert Dataset.objects.count() == 1 and "the same file as dataset" in again.content.decode()


def test_the_import_command_says_a_dataset_file_is_one_and_how_to_run_it(shared_data):
    path = shared_data / "workplace_assistant" / "example.jsonl"
    with pytest.raises(CommandError, match=r"this is a dataset, not rollouts.*gymweb collect --input .*example\.jsonl"):
        call_command("import_rollouts", str(path))
    assert _nothing_stored()


# -- files in the wrong slot -------------------------------------------------------------------------
def test_swapped_files_are_refused_with_what_was_found(shared_data):
    folder = shared_data / "collect_outputs" / "mixed"
    with (folder / "rollouts_failures.jsonl").open("rb") as main, (folder / "rollouts.jsonl").open("rb") as side:
        with pytest.raises(WrongFileError) as caught:
            import_rollouts(main, failures=side, source="rollouts_failures.jsonl", failures_source="rollouts.jsonl")
    message = str(caught.value)
    assert caught.value.swapped
    assert message.startswith(
        "rollouts.jsonl, line 1: this row has no '_ng_failure_class' ('reward' 1.0 and a 'response')"
    )
    assert "; the other file holds failure rows: the two files are swapped. Nothing was imported: swap them" in message
    assert _nothing_stored()


def test_the_import_page_refuses_swapped_files(signed_in, shared_data):
    folder = shared_data / "collect_outputs" / "mixed"
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": upload(folder / "rollouts_failures.jsonl"),
            "failures": upload(folder / "rollouts.jsonl"),
        },
    )
    assert response.status_code == 400
    assert "the two files are swapped" in response.context["form"].non_field_errors()[0]
    assert _nothing_stored()


def test_the_import_command_refuses_swapped_files(shared_data):
    folder = shared_data / "collect_outputs" / "mixed"
    with pytest.raises(CommandError, match="the two files are swapped"):
        call_command(
            "import_rollouts", str(folder / "rollouts_failures.jsonl"), "--failures", str(folder / "rollouts.jsonl")
        )
    assert _nothing_stored()


def test_a_failures_file_in_the_rollouts_slot_is_refused_and_the_failures_slot_takes_it(shared_data):
    path = shared_data / "collect_outputs" / "agent_down" / "rollouts_failures.jsonl"
    with pytest.raises(
        CommandError,
        match=r"line 1: this row is a failure row .*'_ng_failure_class' \"remote_agent_error\".*import it as the failures file",
    ):
        call_command("import_rollouts", str(path))
    assert _nothing_stored()
    call_command("import_rollouts", "--failures", str(path))
    assert Rollout.objects.filter(status=Rollout.Status.FAILED).count() == 5


def test_a_success_row_in_the_failures_slot_is_refused_on_that_field(signed_in):
    good = {"responses_create_params": {"input": "x"}, "response": {"id": "r", "output": []}, "reward": 1.0}
    response = signed_in.post(reverse("import"), {"failures": upload("side.jsonl", json.dumps(good) + "\n")})
    assert response.status_code == 400
    assert "side.jsonl, line 1: this row has no '_ng_failure_class'" in response.context["form"].errors["failures"][0]
    assert _nothing_stored()


def test_a_failure_row_late_in_a_rollouts_file_is_refused_with_its_line():
    good = {"responses_create_params": {"input": "x"}, "response": {"id": "r", "output": []}, "reward": 1.0}
    bad = {
        "responses_create_params": {"input": "y"},
        "reward": 0.0,
        "error": "boom",
        "_ng_failure_class": "remote_agent_error",
    }
    lines = io.BytesIO(("\n".join([json.dumps(good)] * 3 + [json.dumps(bad)]) + "\n").encode())
    with pytest.raises(WrongFileError, match="rollouts.jsonl, line 4: this row is a failure row") as caught:
        import_rollouts(lines)
    assert not caught.value.swapped and _nothing_stored()


# -- the imported run's header ------------------------------------------------------------------------
def _five_by_four(shared_data, tmp_path):
    rows = [
        json.loads(line) for line in (shared_data / "eval_0.7.0" / "runA" / "rollouts.jsonl").read_text().splitlines()
    ]
    kept = [r for r in rows if r["_ng_rollout_index"] < 4]
    assert len(kept) == 20
    path = tmp_path / "five_by_four.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return path


def test_an_imported_5_by_4_file_says_5_tasks_times_4(signed_in, shared_data, tmp_path):
    path = _five_by_four(shared_data, tmp_path)
    response = signed_in.post(reverse("import"), {"rollouts": upload(path)})
    run = Run.objects.get()
    assert (run.num_tasks, run.num_repeats, run.num_keys) == (5, 4, 20)
    page = signed_in.get(response["Location"]).content.decode()
    assert '<span id="run-shape">5 tasks × 4</span>' in page
    assert "<dt>tasks × repeats</dt><dd>5 × 4 " in page  # what the import counted, not collection settings


def test_tasks_with_different_numbers_of_rollouts_say_up_to(signed_in):
    rows = [
        {
            "responses_create_params": {"input": "x"},
            "response": {"id": "r", "output": []},
            "reward": 1.0,
            "_ng_task_index": t,
            "_ng_rollout_index": r,
        }
        for t, n in ((0, 3), (1, 1))
        for r in range(n)
    ]
    run = import_rollouts(io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())).run
    assert (run.num_tasks, run.num_repeats, run.num_keys) == (2, 3, 4)
    assert (
        '<span id="run-shape">2 tasks × up to 3 (4 rollouts)</span>'
        in signed_in.get(reverse("run", args=[run.pk])).content.decode()
    )


def test_imported_runs_are_named_by_file_name_not_path(shared_data):
    folder = shared_data / "collect_outputs" / "mixed"
    call_command(
        "import_rollouts",
        str(folder.resolve() / "rollouts.jsonl"),
        "--failures",
        str(folder.resolve() / "rollouts_failures.jsonl"),
    )
    run = Run.objects.get()
    assert run.name == "rollouts.jsonl + rollouts_failures.jsonl"
    # the materialised inputs beside the file are imported with it (and named in the source, not the name)
    assert run.source_file == (
        f"{folder.resolve() / 'rollouts.jsonl'} + {folder.resolve() / 'rollouts_failures.jsonl'}"
        f" + {folder.resolve() / 'rollouts_materialized_inputs.jsonl'}"
    )


def test_an_imported_run_with_rows_never_run_does_not_mention_retry(signed_in):
    rows = [
        {"responses_create_params": {"input": "x"}, "response": {"id": "r", "output": []}, "reward": 1.0},
        {"responses_create_params": {"input": "y"}},
    ]
    run = import_rollouts(io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())).run
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert "1 not run (rows of the file without a result)" in html
    assert "Retry" not in html
