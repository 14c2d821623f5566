"""Limits on what a request may upload, in one place for every form (``/runs/new/``, ``/import/``).

- ``SizeLimitUploadHandler`` is first in ``FILE_UPLOAD_HANDLERS``, so it sees every uploaded file
  before anything is stored: once a file passes ``GYMWEB_MAX_UPLOAD_BYTES`` it stops the file
  there (the part already written is deleted, the rest of it is read and dropped; the other form
  fields still arrive) and records the field in ``too_large_uploads(request)`` so the form can say
  so on that field.
- ``RequestSizeLimitMiddleware`` refuses a request whose declared size (``Content-Length``)
  passes ``GYMWEB_MAX_REQUEST_BYTES`` with 413, before anything reads its body.
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile
from django.shortcuts import render

from rollouts.display import binary_size


def upload_limit_message(limit: int) -> str:
    """The error a form shows on a file field whose upload passed ``limit`` bytes."""
    return (
        f"The file is larger than the upload limit of {binary_size(limit)} "
        "(GYMWEB_MAX_UPLOAD_BYTES). Split it, or ask the administrator to raise the limit."
    )


def too_large_uploads(request) -> set[str]:
    """Names of the file fields of ``request`` that ``SizeLimitUploadHandler`` cut off (read
    ``request.FILES`` or ``request.POST`` first, which parses the body)."""
    return getattr(request, "gymweb_too_large_uploads", set())


class SizeLimitUploadHandler(FileUploadHandler):
    """Stops storing an uploaded file once it passes ``GYMWEB_MAX_UPLOAD_BYTES`` (see the module
    docstring). Passes every chunk on unchanged below the limit; stores nothing itself."""

    def __init__(self, request=None):
        super().__init__(request)
        self.limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)

    def receive_data_chunk(self, raw_data, start):
        if start + len(raw_data) > self.limit:
            if self.request is not None:
                fields = too_large_uploads(self.request) | {self.field_name}
                self.request.gymweb_too_large_uploads = fields
            raise SkipFile()
        return raw_data

    def file_complete(self, file_size):
        return None  # the next handler stores the file


class RequestSizeLimitMiddleware:
    """413 for a request declaring more than ``GYMWEB_MAX_REQUEST_BYTES`` of body, unread. A body
    without ``Content-Length`` is never read by Django, so the header is the whole story."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = int(settings.GYMWEB_MAX_REQUEST_BYTES)
        if length > limit:
            context = {"limit": binary_size(limit), "upload_limit": binary_size(int(settings.GYMWEB_MAX_UPLOAD_BYTES))}
            return render(request, "413.html", context, status=413)
        return self.get_response(request)
