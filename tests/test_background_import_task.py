"""The import page as a background task: the POST returns at once with the task page, which polls
while the task is queued or running, then shows the result; identical imports while one is queued
make one run."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts import background
from rollouts.models import BackgroundTask, Run

pytestmark = pytest.mark.django_db

ROW = {"responses_create_params": {"input": "count"}, "response": {"id": "r", "output": []}, "reward": 1.0}


@pytest.fixture(autouse=True)
def _queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.DATA_DIR = tmp_path  # the tasks' files


def _upload(text: str, name: str = "rollouts.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="application/jsonl")


def _post(client, text: str, capture):
    with capture(execute=True):
        return client.post(reverse("import"), {"rollouts": _upload(text)})


def test_an_import_returns_the_task_page_at_once_then_the_page_shows_progress_and_the_run(
    signed_in, django_capture_on_commit_callbacks, queued
):
    response = _post(signed_in, json.dumps(ROW) + "\n", django_capture_on_commit_callbacks)
    task = BackgroundTask.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("task", args=[task.pk])
    assert Run.objects.count() == 0 and len(queued) == 1  # queued for a worker, nothing imported yet
    page = signed_in.get(response["Location"]).content.decode()
    assert "Queued" in page and f'hx-get="{reverse("task", args=[task.pk])}"' in page and 'id="task-refresh"' in page

    assert background.run(task.pk) == "done"  # as the worker does
    poll = signed_in.get(reverse("task", args=[task.pk]), HTTP_HX_REQUEST="true")
    html = poll.content.decode()
    run = Run.objects.get()
    assert 'data-status="done"' in html and "hx-get" not in html  # the poll stops itself
    assert "Imported 1 rollout(s)" in html and f'href="{reverse("run", args=[run.pk])}"' in html
    assert not background.task_dir(task.pk).exists()


def test_a_refused_import_says_why_on_the_task_page_and_stores_nothing(signed_in, django_capture_on_commit_callbacks):
    _post(signed_in, json.dumps(ROW) + "\n{bad\n", django_capture_on_commit_callbacks)
    task = BackgroundTask.objects.get()
    assert background.run(task.pk) == "failed"
    html = signed_in.get(reverse("task", args=[task.pk])).content.decode()
    assert "rollouts.jsonl, line 2: not valid JSON" in html and f'href="{reverse("import")}"' in html
    assert Run.objects.count() == 0


def test_two_identical_imports_while_one_is_queued_make_one_task_and_one_run(
    signed_in, django_capture_on_commit_callbacks, queued
):
    text = json.dumps(ROW) + "\n"
    first = _post(signed_in, text, django_capture_on_commit_callbacks)
    second = _post(signed_in, text, django_capture_on_commit_callbacks)
    assert first["Location"] == second["Location"]
    task = BackgroundTask.objects.get()
    assert len(queued) == 1
    background.run(task.pk)
    background.run(task.pk)  # a second delivery of the same task is not run again
    assert Run.objects.count() == 1

    other = _post(signed_in, json.dumps({**ROW, "reward": 0.5}) + "\n", django_capture_on_commit_callbacks)
    assert other["Location"] != first["Location"] and BackgroundTask.objects.count() == 2
