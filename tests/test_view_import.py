"""The import page: upload a rollouts.jsonl (and its failures sidecar) into an ``imported`` run."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts.models import Rollout, Run, TrajectoryItem

pytestmark = pytest.mark.django_db

ROW = {"responses_create_params": {"input": "count"}, "response": {"id": "r", "output": []}, "reward": 1.0}
FAILURE = {
    "responses_create_params": {"input": "count"},
    "reward": 0.0,
    "error": "boom",
    "_ng_failure_class": "remote_agent_error",
}


def upload(name, text):
    return SimpleUploadedFile(name, text.encode() if isinstance(text, str) else text, content_type="application/jsonl")


def test_it_requires_login(client):
    response = client.get(reverse("import"))
    assert response.status_code == 302 and reverse("login") in response["Location"]
    response = client.post(reverse("import"), {"rollouts": upload("r.jsonl", json.dumps(ROW))})
    assert response.status_code == 302 and reverse("login") in response["Location"]
    assert Run.objects.count() == 0


def test_it_shows_an_upload_form(signed_in):
    response = signed_in.get(reverse("import"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'enctype="multipart/form-data"' in html
    assert 'name="rollouts"' in html and 'name="failures"' in html and 'name="name"' in html


def test_it_imports_a_file_and_its_sidecar_and_redirects_to_the_run(signed_in, shared_data, user):
    folder = shared_data / "collect_outputs" / "mixed"
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": upload("rollouts.jsonl", (folder / "rollouts.jsonl").read_bytes()),
            "failures": upload("rollouts_failures.jsonl", (folder / "rollouts_failures.jsonl").read_bytes()),
            "name": "mixed from NeMo Gym",
        },
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[run.pk])
    assert run.name == "mixed from NeMo Gym" and run.status == Run.Status.IMPORTED and run.created_by == user
    assert run.source_file == "rollouts.jsonl + rollouts_failures.jsonl"
    assert Rollout.objects.filter(run=run, status="succeeded").count() == 4
    assert Rollout.objects.filter(run=run, status="failed", terminal=True).count() == 1
    assert TrajectoryItem.objects.filter(rollout__run=run).count() == 28


def test_the_run_is_named_after_the_file_by_default(signed_in, shared_data):
    path = shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl"
    signed_in.post(reverse("import"), {"rollouts": upload("example_rollouts.jsonl", path.read_bytes())})
    run = Run.objects.get()
    assert run.name == "example_rollouts.jsonl" and run.rollouts.count() == 5


def test_a_success_message_tells_what_was_imported(signed_in):
    response = signed_in.post(reverse("import"), {"rollouts": upload("r.jsonl", json.dumps(ROW))}, follow=False)
    assert response.status_code == 302
    html = signed_in.get(reverse("import")).content.decode()  # the next page shows the flash message
    assert "Imported 1 rollout(s)" in html and "1 succeeded" in html


def test_a_bad_line_is_a_field_error_with_its_line_number_and_nothing_is_stored(signed_in):
    text = json.dumps(ROW) + "\n\n" + "{broken\n"
    response = signed_in.post(reverse("import"), {"rollouts": upload("mine.jsonl", text)})
    assert response.status_code == 400
    form = response.context["form"]
    assert "mine.jsonl, line 3: not valid JSON" in form.errors["rollouts"][0]
    assert "mine.jsonl, line 3: not valid JSON" in response.content.decode()
    assert Run.objects.count() == 0 and Rollout.objects.count() == 0


def test_a_control_character_in_a_line_is_named_once_with_its_column(signed_in):
    # The parser's reason ends in "at": the message read "Invalid control character at at column 9".
    response = signed_in.post(reverse("import"), {"rollouts": upload("mine.jsonl", '{"a": "x\x00y"}\n')})
    error = response.context["form"].errors["rollouts"][0]
    assert (
        "mine.jsonl, line 1: not valid JSON (Invalid control character at column 9)" in error and "at at" not in error
    )


def test_two_shards_with_the_same_name_are_told_apart_in_an_error(signed_in):
    # Two rollouts.jsonl from two folders overlap: the message named "rollouts.jsonl (rollouts.jsonl)".
    row = json.dumps({**ROW, "_ng_task_index": 0, "_ng_rollout_index": 0})
    response = signed_in.post(
        reverse("import"), {"rollouts": [upload("rollouts.jsonl", row), upload("rollouts.jsonl", row)]}
    )
    error = response.context["form"].errors["rollouts"][0]
    assert "rollouts.jsonl (file 2 of the rollouts.jsonl files), line 1: a second result" in error
    assert "the first is at rollouts.jsonl, line 1" in error and Run.objects.count() == 0


def test_a_bad_line_in_the_sidecar_is_an_error_on_the_sidecar_field(signed_in):
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": upload("rollouts.jsonl", json.dumps(ROW)),
            "failures": upload("rollouts_failures.jsonl", json.dumps(FAILURE) + "\n[]\n"),
        },
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "rollouts_failures.jsonl, line 2: each line must be a JSON object" in errors["failures"][0]
    assert "rollouts" not in errors
    assert Run.objects.count() == 0


def test_a_missing_file_is_a_field_error(signed_in):
    response = signed_in.post(reverse("import"), {"name": "nothing"})
    assert response.status_code == 400 and "rollouts" in response.context["form"].errors
    assert Run.objects.count() == 0


def test_an_empty_file_is_an_error(signed_in):
    response = signed_in.post(reverse("import"), {"rollouts": upload("empty.jsonl", "\n\n")})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any("no rows" in e or "empty" in e for e in errors["rollouts"])
    assert Run.objects.count() == 0


def test_a_file_over_the_upload_limit_is_refused(signed_in, settings):
    settings.GYMWEB_MAX_UPLOAD_BYTES = 10
    response = signed_in.post(reverse("import"), {"rollouts": upload("big.jsonl", json.dumps(ROW))})
    assert response.status_code == 400 and "upload limit" in response.context["form"].errors["rollouts"][0]
    assert Run.objects.count() == 0


def test_the_materialised_inputs_slot_imports_the_third_file_and_every_file_downloads_unchanged(signed_in, shared_data):
    folder = shared_data / "eval_0.7.0" / "runB"
    files = {
        kind: (folder / name).read_bytes()
        for kind, name in (
            ("rollouts", "rollouts.jsonl"),
            ("rollouts_failures", "rollouts_failures.jsonl"),
            ("rollouts_materialized_inputs", "rollouts_materialized_inputs.jsonl"),
        )
    }
    html = signed_in.get(reverse("import")).content.decode()
    assert 'name="materialized"' in html
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": upload("rollouts.jsonl", files["rollouts"]),
            "failures": upload("rollouts_failures.jsonl", files["rollouts_failures"]),
            "materialized": upload("rollouts_materialized_inputs.jsonl", files["rollouts_materialized_inputs"]),
        },
    )
    assert response.status_code == 302
    run = Run.objects.get()
    for kind, content in files.items():
        got = b"".join(signed_in.get(reverse("run_export", args=[run.pk, kind])).streaming_content)
        assert got == content, kind


def test_a_result_row_in_the_materialised_inputs_slot_is_refused_there(signed_in):
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": upload("rollouts.jsonl", json.dumps(ROW)),
            "materialized": upload("inputs.jsonl", json.dumps(ROW)),
        },
    )
    assert response.status_code == 400
    assert "materialised inputs file holds task rows only" in response.context["form"].errors["materialized"][0]
    assert Run.objects.count() == 0


def test_the_api_imports_the_three_files_and_says_which_one_is_bad(client, user, shared_data):
    from rollouts.tokens import create_token

    auth = {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'tests')[1]}"}
    folder = shared_data / "collect_outputs" / "mixed"
    names = ("rollouts.jsonl", "rollouts_failures.jsonl", "rollouts_materialized_inputs.jsonl")
    data = dict(zip(("rollouts", "failures", "materialized"), (upload(n, (folder / n).read_bytes()) for n in names)))
    response = client.post("/api/v1/runs/import", data, **auth)
    assert response.status_code == 202, response.content  # a background task (run inline in tests)
    task = client.get(response.json()["url"], **auth).json()
    assert task["status"] == "done", task
    run = Run.objects.get(pk=task["run"])
    assert run.status == Run.Status.IMPORTED
    got = b"".join(client.get(f"/api/v1/runs/{run.pk}/rollouts_materialized_inputs.jsonl", **auth).streaming_content)
    assert got == (folder / "rollouts_materialized_inputs.jsonl").read_bytes()
    bad = client.post(
        "/api/v1/runs/import",
        {"rollouts": upload("r.jsonl", json.dumps(ROW)), "materialized": upload("m.jsonl", "not json\n")},
        **auth,
    )
    assert bad.status_code == 202 and bad.json()["status"] == "failed"
    assert "m.jsonl, line 1" in bad.json()["message"] and bad.json()["errors"].keys() == {"materialized"}
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    "name, words",
    [
        ("quality_summary.json", "this is NeMo Gym's health check summary of a run (a JSON document), not JSONL"),
        ("rollouts_aggregate_metrics.json", "this is NeMo Gym's aggregate metrics of a run (a JSON document)"),
    ],
)
def test_a_nemo_gym_json_file_is_named_for_what_it_is_and_import_asks_for_rollouts_jsonl(
    signed_in, shared_data, name, words
):
    path = shared_data / "eval_0.7.0" / "runA" / name
    response = signed_in.post(reverse("import"), {"rollouts": upload(name, path.read_bytes())})
    assert response.status_code == 400
    error = response.context["form"].errors["rollouts"][0]
    assert error.startswith(f"{name}: {words}") and "rollouts.jsonl" in error, error
    assert "line 1" not in error
    assert Run.objects.count() == 0
