"""Each of NeMo Gym's files given in the wrong import slot is recognised by its rows and the error says
which slot it belongs in (or that it is no import file), on the import page and in the import
command, with NeMo Gym 0.7.0's real ``gym eval`` outputs. Nothing is stored when a file is refused."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.models import Rollout, Run
from rollouts.nemo import file_shapes
from rollouts.nemo.jsonl import iter_objects

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_b(shared_data):
    return shared_data / "eval_0.7.0" / "runB"


def _upload(path):
    return SimpleUploadedFile(path.name, path.read_bytes(), content_type="application/jsonl")


def _nothing_stored():
    return Run.objects.count() == 0 and Rollout.objects.count() == 0


def _first_row(path):
    return next(iter_objects(path))[2]


def test_every_file_of_a_real_gym_eval_run_is_told_apart_by_its_rows(run_b):
    shapes = {
        name: file_shapes.shape_of_row(_first_row(run_b / name))
        for name in (
            "rollouts.jsonl",
            "rollouts_failures.jsonl",
            "rollouts_materialized_inputs.jsonl",
            "rollout_verdicts.jsonl",
        )
    }
    assert shapes == {
        "rollouts.jsonl": file_shapes.SUCCESS_ROWS,
        "rollouts_failures.jsonl": file_shapes.FAILURE_ROWS,
        "rollouts_materialized_inputs.jsonl": file_shapes.MATERIALIZED_ROWS,
        "rollout_verdicts.jsonl": file_shapes.VERDICT_ROWS,
    }


def test_a_profile_and_a_task_file_are_told_apart_too(shared_data):
    profile = _first_row(shared_data / "profile_fixture" / "rollouts_reward_profiling.jsonl")
    tasks = _first_row(shared_data / "workplace_assistant" / "example.jsonl")
    assert file_shapes.shape_of_row(profile) is file_shapes.PROFILE_ROWS
    assert file_shapes.shape_of_row(tasks) is file_shapes.TASK_ROWS


def test_the_materialised_inputs_in_the_failures_slot_are_sent_to_their_own_slot_on_the_page(signed_in, run_b):
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": _upload(run_b / "rollouts.jsonl"),
            "failures": _upload(run_b / "rollouts_materialized_inputs.jsonl"),
        },
    )
    assert response.status_code == 400
    error = response.context["form"].errors["failures"][0]
    assert error.startswith(
        "rollouts_materialized_inputs.jsonl, line 1: "
        "this row looks like one of NeMo Gym's rollouts_materialized_inputs.jsonl"
    )
    assert error.endswith("Nothing was imported: give it in the materialised inputs field (--materialized-inputs)")
    assert "swap" not in error and "looks like a rollouts.jsonl" not in error
    assert _nothing_stored()


def test_the_materialised_inputs_in_the_failures_slot_are_sent_to_their_own_slot_by_the_command(run_b):
    with pytest.raises(CommandError) as caught:
        call_command(
            "import_rollouts",
            str(run_b / "rollouts.jsonl"),
            "--failures",
            str(run_b / "rollouts_materialized_inputs.jsonl"),
            "--materialized-inputs",
            str(run_b / "rollouts_materialized_inputs.jsonl"),
        )
    assert "give it in the materialised inputs field (--materialized-inputs)" in str(caught.value)
    assert _nothing_stored()


def test_the_materialised_inputs_in_the_rollouts_slot_say_where_they_go(signed_in, run_b):
    response = signed_in.post(reverse("import"), {"rollouts": _upload(run_b / "rollouts_materialized_inputs.jsonl")})
    assert response.status_code == 400
    error = response.context["form"].errors["rollouts"][0]
    assert "this is NeMo Gym's rollouts_materialized_inputs.jsonl, not rollouts" in error
    assert "give it in the materialised inputs field (--materialized-inputs) beside its rollouts.jsonl" in error
    html = response.content.decode()
    assert "is NeMo Gym's materialised inputs (the task rows of a run), not rollouts" in html
    assert _nothing_stored()


def test_the_command_says_the_same_for_materialised_inputs_given_as_the_file(run_b):
    with pytest.raises(CommandError, match=r"rollouts_materialized_inputs\.jsonl, not rollouts.*--materialized-inputs"):
        call_command("import_rollouts", str(run_b / "rollouts_materialized_inputs.jsonl"))
    assert _nothing_stored()


def test_a_failures_sidecar_in_the_materialised_slot_is_sent_to_the_failures_slot(signed_in, run_b):
    response = signed_in.post(
        reverse("import"),
        {"rollouts": _upload(run_b / "rollouts.jsonl"), "materialized": _upload(run_b / "rollouts_failures.jsonl")},
    )
    assert response.status_code == 400
    error = response.context["form"].errors["materialized"][0]
    assert "NeMo Gym's rollouts_failures.jsonl" in error
    assert error.endswith("give it in the failures sidecars field (--failures)")
    assert _nothing_stored()


def test_a_rollouts_file_in_the_materialised_slot_is_sent_to_the_rollouts_slot(run_b):
    with pytest.raises(CommandError) as caught:
        call_command(
            "import_rollouts",
            "--failures",
            str(run_b / "rollouts_failures.jsonl"),
            "--materialized-inputs",
            str(run_b / "rollouts.jsonl"),
        )
    assert "give it in the rollouts.jsonl field (the FILE argument of gymweb import_rollouts)" in str(caught.value)
    assert _nothing_stored()


def test_the_health_checks_verdicts_are_no_import_file_in_any_slot(signed_in, run_b):
    verdicts = run_b / "rollout_verdicts.jsonl"
    for slot, extra in (
        ("rollouts", {}),
        ("failures", {"rollouts": _upload(run_b / "rollouts.jsonl")}),
        ("materialized", {"rollouts": _upload(run_b / "rollouts.jsonl")}),
    ):
        response = signed_in.post(reverse("import"), {slot: _upload(verdicts), **extra})
        assert response.status_code == 400, slot
        error = response.context["form"].errors[slot][0]
        assert "the health check's rollout_verdicts.jsonl" in error, slot
        assert "leave it out: gymweb checks an imported run's health itself" in error, slot
    assert _nothing_stored()


def test_files_in_their_own_slots_still_import(run_b):
    call_command(
        "import_rollouts",
        str(run_b / "rollouts.jsonl"),
        "--failures",
        str(run_b / "rollouts_failures.jsonl"),
        "--materialized-inputs",
        str(run_b / "rollouts_materialized_inputs.jsonl"),
        "--no-health-check",
    )
    assert Run.objects.get().status == Run.Status.IMPORTED
    assert Rollout.objects.filter(status=Rollout.Status.FAILED).exists()
