"""A new run from an uploaded dataset as a background task: the POST checks the other fields,
keeps the file and returns the task page at once; the worker reads the dataset, stores it and
launches the run (or refuses a dataset over the key limit while reading it, storing nothing)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts import background
from rollouts.models import BackgroundTask, Dataset, Run

from .run_factories import dataset_lines

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.DATA_DIR = tmp_path


def _data(rows: int, **changes):
    data = {
        "dataset_file": SimpleUploadedFile("tasks.jsonl", ("\n".join(dataset_lines(rows)) + "\n").encode()),
        "agent_url": "http://127.0.0.1:9102/",
        "env_url": "http://127.0.0.1:9101",
        "agent_name": "remote_agent",
        "concurrency": "8",
        "num_repeats": "2",
        "max_attempts": "3",
        "remote_responses_timeout_s": "60",
        "run_timeout_s": "120",
        "overrides": "",
    }
    return {**data, **changes}


def test_an_upload_returns_the_task_page_at_once_then_the_run_is_launched(signed_in):
    response = signed_in.post(reverse("run_new"), _data(3, name="from a task"))
    task = BackgroundTask.objects.get(kind="upload")
    assert response.status_code == 302 and response["Location"] == reverse("task", args=[task.pk])
    assert Dataset.objects.count() == 0 and Run.objects.count() == 0  # nothing read or stored yet

    assert background.run(task.pk) == "done"
    run = Run.objects.get()
    assert run.name == "from a task" and run.num_keys == 6 and run.dataset.num_rows == 3
    html = signed_in.get(reverse("task", args=[task.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "Run “from a task” started: 6 rollouts." in html and f'href="{reverse("run", args=[run.pk])}"' in html


def test_a_bad_field_is_refused_in_the_request_without_a_task(signed_in):
    response = signed_in.post(reverse("run_new"), _data(3, concurrency="0"))
    assert response.status_code == 400 and BackgroundTask.objects.count() == 0


def test_a_dataset_over_the_key_limit_is_refused_by_the_task_and_nothing_is_stored(signed_in, settings):
    settings.GYMWEB_MAX_KEYS_PER_RUN = 2
    signed_in.post(reverse("run_new"), _data(3, num_repeats="1"))
    task = BackgroundTask.objects.get()
    assert background.run(task.pk) == "failed"
    html = signed_in.get(reverse("task", args=[task.pk])).content.decode()
    assert "tasks.jsonl, line 3: the dataset has more than 2 rows" in html
    assert f'href="{reverse("run_new")}"' in html
    assert Dataset.objects.count() == 0 and Run.objects.count() == 0
