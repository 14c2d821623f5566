"""Download responses: a file the browser saves under ``filename`` (``Content-Disposition`` from
Django's ``content_disposition_header``, ``X-Content-Type-Options: nosniff``), text as UTF-8.

Three shapes: bytes held whole (``bytes_download``), JSONL lines streamed as they are made
(``jsonl_download``), an open file streamed and closed after (``file_download``, Django's
``FileResponse``). No gymweb module below: the pages, the API and review exports all use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO

from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header

JSONL = "application/jsonl"
FILE_BLOCK_BYTES = 1 << 16


def attach(response: HttpResponse | StreamingHttpResponse, filename: str) -> None:
    """Mark ``response`` as a download of ``filename``, never sniffed as another type."""
    response["Content-Disposition"] = content_disposition_header(True, filename)
    response["X-Content-Type-Options"] = "nosniff"


def bytes_download(body: bytes | str, filename: str, content_type: str) -> HttpResponse:
    """``body`` whole, as ``content_type`` (a bare media type: ``; charset=utf-8`` is added)."""
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    attach(response, filename)
    return response


def jsonl_download(lines: Iterable[str], filename: str) -> StreamingHttpResponse:
    """``lines`` (JSON texts without their newline) streamed as a JSONL file, one row at a time."""
    response = StreamingHttpResponse((line + "\n" for line in lines), content_type=f"{JSONL}; charset=utf-8")
    attach(response, filename)
    return response


def file_download(file: IO[bytes], filename: str, content_type: str) -> FileResponse:
    """The open binary ``file`` from its current position, streamed and closed when sent.
    ``content_type`` is sent as given (add the charset for text)."""
    response = FileResponse(file, as_attachment=True, filename=filename, content_type=content_type)
    response.block_size = FILE_BLOCK_BYTES
    response["X-Content-Type-Options"] = "nosniff"
    return response
