"""``POST /api/v1/runs/import`` runs as the import page's background task: 202 with the task at
once, ``GET /api/v1/tasks/{id}`` until it is done (the run) or failed (why, and which file);
identical imports while one is queued answer that same task; another user's task is 404; the
OpenAPI document declares both routes."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from rollouts import background
from rollouts.models import BackgroundTask, Run
from rollouts.tokens import create_token

pytestmark = pytest.mark.django_db

ROW = {"responses_create_params": {"input": "count"}, "response": {"id": "r", "output": []}, "reward": 1.0}


@pytest.fixture(autouse=True)
def _queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.DATA_DIR = tmp_path


@pytest.fixture
def auth(user):
    return {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'tests')[1]}"}


def _files(text: str, name: str = "rollouts.jsonl") -> dict:
    return {"rollouts": SimpleUploadedFile(name, text.encode(), content_type="application/jsonl"), "name": "api"}


def _post(client, auth, text: str, capture):
    with capture(execute=True):
        return client.post("/api/v1/runs/import", _files(text), **auth)


def test_an_api_import_answers_202_with_the_task_then_the_task_names_the_run(
    client, auth, django_capture_on_commit_callbacks, queued
):
    response = _post(client, auth, json.dumps(ROW) + "\n", django_capture_on_commit_callbacks)
    assert response.status_code == 202, response.content
    body = response.json()
    task = BackgroundTask.objects.get()
    assert body["id"] == task.pk and body["kind"] == "import" and body["status"] == "queued"
    assert body["url"] == f"/api/v1/tasks/{task.pk}" and body["run"] is None
    assert Run.objects.count() == 0 and len(queued) == 1  # queued, nothing imported yet

    assert background.run(task.pk) == "done"  # as the worker does
    done = client.get(body["url"], **auth)
    assert done.status_code == 200 and done["Cache-Control"] == "no-store"
    out = done.json()
    run = Run.objects.get()
    assert out["status"] == "done" and out["run"] == run.pk and out["progress"] == 1.0
    assert run.status == Run.Status.IMPORTED and run.name == "api"
    assert client.get(f"/api/v1/runs/{out['run']}", **auth).json()["status"] == "imported"


def test_identical_concurrent_api_imports_share_one_task_and_make_one_run(
    client, auth, django_capture_on_commit_callbacks, queued
):
    text = json.dumps(ROW) + "\n"
    first = _post(client, auth, text, django_capture_on_commit_callbacks).json()
    second = _post(client, auth, text, django_capture_on_commit_callbacks).json()
    assert first["id"] == second["id"] and BackgroundTask.objects.count() == 1 and len(queued) == 1
    different = _post(client, auth, text + json.dumps(ROW) + "\n", django_capture_on_commit_callbacks).json()
    assert different["id"] != first["id"]
    for task_id in (first["id"], different["id"]):
        assert background.run(task_id) == "done"
    assert Run.objects.count() == 2


def test_a_refused_api_import_fails_its_task_naming_the_file_and_line(client, auth, django_capture_on_commit_callbacks):
    body = _post(client, auth, json.dumps(ROW) + "\n{bad\n", django_capture_on_commit_callbacks).json()
    assert background.run(body["id"]) == "failed"
    out = client.get(body["url"], **auth).json()
    assert out["status"] == "failed" and "rollouts.jsonl, line 2" in out["message"]
    assert out["errors"] == {"rollouts": [out["message"]]} and out["run"] is None
    assert Run.objects.count() == 0


def test_past_the_per_user_task_limit_the_api_answers_429(client, auth, settings, django_capture_on_commit_callbacks):
    settings.GYMWEB_MAX_TASKS_PER_USER = 1
    assert _post(client, auth, json.dumps(ROW) + "\n", django_capture_on_commit_callbacks).status_code == 202
    refused = _post(client, auth, json.dumps(ROW) + "\n\n", django_capture_on_commit_callbacks)
    assert refused.status_code == 429 and "GYMWEB_MAX_TASKS_PER_USER" in refused.json()["detail"]


def test_a_token_of_one_team_imports_into_that_team(
    client, user, django_user_model, django_capture_on_commit_callbacks
):
    from rollouts.models import Team

    red, blue = Team.objects.create(name="red"), Team.objects.create(name="blue")
    red.members.add(user)
    blue.members.add(user)
    blue_auth = {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'blue only', team=blue)[1]}"}
    body = _post(client, blue_auth, json.dumps(ROW) + "\n", django_capture_on_commit_callbacks).json()
    assert background.run(body["id"]) == "done"  # the worker has no token: the task carries the team
    assert Run.objects.get().team == blue


def test_another_users_task_is_404(client, auth, django_user_model, django_capture_on_commit_callbacks):
    body = _post(client, auth, json.dumps(ROW) + "\n", django_capture_on_commit_callbacks).json()
    other = django_user_model.objects.create_user(username="mallory", password="another long password 9")
    other_auth = {"HTTP_AUTHORIZATION": f"Bearer {create_token(other, 'theirs')[1]}"}
    assert client.get(body["url"], **other_auth).status_code == 404
    assert client.get(body["url"]).status_code == 401


def test_the_openapi_document_declares_the_202_task_and_the_status_route(client):
    doc = client.get("/api/v1/openapi.json").json()
    answers = doc["paths"]["/api/v1/runs/import"]["post"]["responses"]
    assert answers["202"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/TaskOut"}
    assert {"400", "413", "429"} <= answers.keys() and "201" not in answers
    status = doc["paths"]["/api/v1/tasks/{task_id}"]["get"]["responses"]
    assert status["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/TaskOut"}
    assert "404" in status
    assert [p["name"] for p in doc["paths"]["/api/v1/tasks/{task_id}"]["get"]["parameters"]] == ["task_id"]
