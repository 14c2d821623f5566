"""Download responses (``rollouts.downloads``): the name, type and nosniff every download carries,
streamed where the body is streamed."""

from __future__ import annotations

import tempfile

import pytest
from django.http import FileResponse, HttpResponse, StreamingHttpResponse

from rollouts import downloads


def test_bytes_download():
    response = downloads.bytes_download(b"{}", "run-1_x.json", "application/json")
    assert isinstance(response, HttpResponse) and response.content == b"{}"
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="run-1_x.json"'
    assert response["X-Content-Type-Options"] == "nosniff"


def test_jsonl_download_streams_lines():
    response = downloads.jsonl_download(iter(['{"a":1}', '{"b":2}']), "run-1_rollouts.jsonl")
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"] == "application/jsonl; charset=utf-8"
    assert b"".join(response.streaming_content) == b'{"a":1}\n{"b":2}\n'


@pytest.mark.django_db  # closing the response sends request_finished, which checks the database connections
def test_file_download_and_a_name_that_is_not_ascii():
    spool = tempfile.TemporaryFile()
    spool.write(b"zip")
    spool.seek(0)
    response = downloads.file_download(spool, "résumé.zip", "application/zip")
    assert isinstance(response, FileResponse) and response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"] == "attachment; filename*=utf-8''r%C3%A9sum%C3%A9.zip"
    assert b"".join(response.streaming_content) == b"zip"
    response.close()
    assert spool.closed
