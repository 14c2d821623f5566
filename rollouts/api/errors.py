"""The API's 400 answers: ``FieldsError`` (a message and the fields at fault), made from a form's
errors or from a review action's ``ReviewError``."""

from __future__ import annotations

from django.http import JsonResponse
from ninja.errors import HttpError

from rollouts.review.actions import ReviewError


class FieldsError(HttpError):
    """An HTTP 400 whose body also names the fields at fault (``errors``: field name → messages)."""

    def __init__(self, message: str, errors: dict[str, list[str]], status: int = 400):
        super().__init__(status, message)
        self.errors = errors


def form_error(form) -> FieldsError:
    errors = {name: [str(e) for e in errs] for name, errs in form.errors.items()}
    first = next(iter(errors.items()), ("", ["invalid input"]))
    detail = f"{first[0]}: {first[1][0]}" if first[0] and first[0] != "__all__" else first[1][0]
    return FieldsError(detail, errors)


def review_error(exc: ReviewError) -> HttpError:
    return FieldsError(str(exc), {exc.field: [str(exc)]}) if exc.field else HttpError(400, str(exc))


class JsonMethodNotAllowedMiddleware:
    """A 405 under ``/api/v1/`` (django-ninja answers a wrong method with a bare text/html
    ``Method not allowed``) becomes the API's JSON ``{"detail": ...}``, naming the methods the path
    takes; the ``Allow`` header is kept (RFC 9110 §15.5.6)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code != 405 or not request.path.startswith("/api/v1/"):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        allowed = response.get("Allow", "")
        detail = f"Method Not Allowed: {request.method} {request.path}"
        answer = JsonResponse({"detail": f"{detail} (this path takes {allowed})" if allowed else detail}, status=405)
        if allowed:
            answer["Allow"] = allowed
        return answer
