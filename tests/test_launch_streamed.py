"""A run launched inside the request from an upload (``access.launch_from_form``: POST /api/v1/runs
with a JSONL body, the new-run page's file field when tasks run inline) goes through the streamed
reader and store (``collection.streamed_upload``): every row checked one at a time with none kept,
then stored in batches, shown nowhere until the last one is in; a bad line anywhere answers an
error naming line and field, and a failure while storing leaves nothing."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts.collection import run_rows, streamed_upload
from rollouts.models import Dataset, DatasetRow, Rollout, Run, Task
from rollouts.tokens import create_token
from rollouts.web import forms

API = "/api/v1"
AGENT, ENV = "http://127.0.0.1:9102", "http://127.0.0.1:9101"
ROWS = 2 * streamed_upload.BULK + 500  # three batches


def _lines(n: int) -> list[str]:
    return [json.dumps({"responses_create_params": {"input": f"task {i}"}, "expected": i}) for i in range(n)]


def _nothing_stored() -> bool:
    return not (
        Run.objects.exists()
        or Dataset.objects.exists()
        or DatasetRow.objects.exists()
        or Task.objects.exists()
        or Rollout.objects.exists()
    )


@pytest.fixture
def auth(user):
    return {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'tests')[1]}"}


def _post_jsonl(client, auth, lines: list[str], **query):
    qs = "&".join(f"{k}={v}" for k, v in {"agent_url": AGENT, "env_url": ENV, **query}.items())
    return client.post(f"{API}/runs?{qs}", data="\n".join(lines) + "\n", content_type="application/x-ndjson", **auth)


def test_a_jsonl_body_of_several_batches_makes_one_ready_launched_run(client, auth, monkeypatch):
    kept = []
    real_scan = streamed_upload.scan
    monkeypatch.setattr(forms.streamed_upload, "scan", lambda *a, **k: kept.append(real_scan(*a, **k)) or kept[-1])
    response = _post_jsonl(client, auth, _lines(ROWS), num_repeats=2)
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.status == Run.Status.RUNNING and run.writing_until is None
    assert run.num_tasks == ROWS and run.num_keys == 2 * ROWS and run.rollouts.count() == 2 * ROWS
    assert run.dataset.num_rows == ROWS and run.dataset.rows.count() == ROWS and run.dataset.writing_until is None
    assert len(kept) == 1 and kept[0].num_rows == ROWS  # the form counted the rows; it kept none


def test_a_bad_line_in_the_last_batch_names_its_line_and_field_and_stores_nothing(client, auth):
    lines = _lines(ROWS)
    lines[-1] = '{"responses_create_params": {"input": 3}}'
    response = _post_jsonl(client, auth, lines)
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert f"line {ROWS}" in detail and "input" in detail
    assert _nothing_stored()


def test_an_upload_over_the_key_limit_is_refused_while_read(client, auth, settings):
    settings.GYMWEB_MAX_KEYS_PER_RUN = 100
    response = _post_jsonl(client, auth, _lines(150))
    assert response.status_code == 400 and "line 101" in response.json()["detail"]
    assert _nothing_stored()


def test_a_failure_while_storing_leaves_nothing_and_launches_nothing(client, auth, monkeypatch):
    real, calls = run_rows.insert_from_template, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_rows, "insert_from_template", failing)  # the pending rollouts' insert
    with pytest.raises(OSError, match="disk full"):
        _post_jsonl(client, auth, _lines(ROWS))
    assert _nothing_stored()


def test_the_new_run_pages_file_field_stores_through_the_same_path(signed_in):
    upload = SimpleUploadedFile("big.jsonl", ("\n".join(_lines(ROWS)) + "\n").encode())
    data = {
        "dataset_file": upload,
        "agent_url": AGENT,
        "env_url": ENV,
        "agent_name": "remote_agent",
        "concurrency": "8",
        "num_repeats": "1",
        "max_attempts": "3",
        "remote_responses_timeout_s": "60",
        "run_timeout_s": "120",
        "overrides": "",
    }
    response = signed_in.post(reverse("run_new"), data)
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[run.pk])
    assert run.num_keys == ROWS and run.dataset.rows.count() == ROWS and run.dataset.name == "big.jsonl"
