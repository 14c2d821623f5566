"""Limits on uploads: one upload handler for /import/ and /runs/new/ stops storing a file
at GYMWEB_MAX_UPLOAD_BYTES (before it is written whole to disk) and the form says so on that
field; a request declaring more than GYMWEB_MAX_REQUEST_BYTES gets 413 before its body is read."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import TemporaryFileUploadHandler
from django.urls import reverse

from rollouts.models import Run

LIMIT = 200_000


@pytest.fixture
def stored_bytes(settings, monkeypatch):
    """Small limits, files always on disk; returns the list of chunk sizes written to disk."""
    settings.GYMWEB_MAX_UPLOAD_BYTES = LIMIT
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1000  # to a temporary file, as a big upload would go
    written: list[int] = []
    original = TemporaryFileUploadHandler.receive_data_chunk

    def counting(self, raw_data, start):
        written.append(len(raw_data))
        return original(self, raw_data, start)

    monkeypatch.setattr(TemporaryFileUploadHandler, "receive_data_chunk", counting)
    return written


def _big_jsonl(size: int) -> bytes:
    line = json.dumps({"responses_create_params": {"input": "x" * 900}}).encode() + b"\n"
    return line * (size // len(line) + 1)


def test_the_import_page_stops_storing_a_file_at_the_upload_limit(signed_in, stored_bytes):
    big = _big_jsonl(5 * LIMIT)
    response = signed_in.post(
        reverse("import"), {"rollouts": SimpleUploadedFile("rollouts.jsonl", big), "name": "mine"}
    )
    assert response.status_code == 400
    assert 0 < sum(stored_bytes) <= LIMIT  # the part before the limit, never the whole file
    body = response.content.decode()
    assert "larger than the upload limit of 195.3 KB (GYMWEB_MAX_UPLOAD_BYTES)" in body
    assert "This field is required" not in body
    assert 'value="mine"' in body  # the other fields came through
    assert not Run.objects.exists()


def test_the_import_page_names_which_of_its_two_files_was_too_large(signed_in, stored_bytes):
    small = _big_jsonl(1000)
    response = signed_in.post(
        reverse("import"),
        {
            "rollouts": SimpleUploadedFile("rollouts.jsonl", small),
            "failures": SimpleUploadedFile("rollouts_failures.jsonl", _big_jsonl(3 * LIMIT)),
        },
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == ["failures"] and "GYMWEB_MAX_UPLOAD_BYTES" in errors["failures"][0]


def test_the_new_run_page_stops_storing_a_file_at_the_same_limit(signed_in, stored_bytes):
    response = signed_in.post(
        reverse("run_new"),
        {
            "dataset_file": SimpleUploadedFile("tasks.jsonl", _big_jsonl(5 * LIMIT)),
            "agent_url": "http://127.0.0.1:9102",
            "env_url": "http://127.0.0.1:9101",
            "agent_name": "remote_agent",
            "concurrency": 4,
            "num_repeats": 1,
            "max_attempts": 3,
            "remote_responses_timeout_s": 10,
            "run_timeout_s": 20,
        },
    )
    assert response.status_code == 400
    assert 0 < sum(stored_bytes) <= LIMIT
    assert "GYMWEB_MAX_UPLOAD_BYTES" in response.context["form"].errors["dataset_file"][0]


def test_a_file_under_the_limit_is_stored_whole(signed_in, stored_bytes):
    data = _big_jsonl(LIMIT // 2)
    response = signed_in.post(reverse("import"), {"rollouts": SimpleUploadedFile("rollouts.jsonl", data)})
    assert sum(stored_bytes) == len(data)
    # (These rows are a dataset, which the import page offers to keep as one: no size complaint.)
    assert "GYMWEB_MAX_UPLOAD_BYTES" not in response.content.decode()


def test_a_request_over_the_global_cap_gets_413_before_its_body_is_read(signed_in, settings):
    settings.GYMWEB_MAX_REQUEST_BYTES = 10_000
    # Declares a gigabyte but carries a few bytes: reading the body would fail the test client.
    response = signed_in.generic(
        "POST", reverse("import"), b"x" * 10, content_type="multipart/form-data; boundary=b", CONTENT_LENGTH=str(10**9)
    )
    assert response.status_code == 413
    body = response.content.decode()
    assert "The request is too large" in body and "GYMWEB_MAX_REQUEST_BYTES" in body and "9.8 KB" in body
    assert not Run.objects.exists()
    # Under the cap, the same page answers as usual.
    assert signed_in.get(reverse("import")).status_code == 200


def test_the_global_cap_defaults_to_room_for_two_uploads():
    from django.conf import settings

    assert settings.GYMWEB_MAX_REQUEST_BYTES >= 2 * settings.GYMWEB_MAX_UPLOAD_BYTES
