"""The HTTP API for scripts and training loops (django-ninja), under ``/api/v1/``.

Auth: ``Authorization: Bearer <token>``, a per-user token made on the account page
(``rollouts.tokens``). No token, a malformed header or an unknown/revoked token: 401 with
``{"detail": "Unauthorized"}`` and nothing else (django-ninja checks auth before it reads any
parameter). A token sees what its user sees: access goes through the run pages' rule
(``rollouts.web.access.run_for``). The schema is at ``/api/v1/openapi.json`` and its Swagger UI at
``/api/v1/docs`` (public: they hold no data). No cookies are read, so no CSRF token is needed.

The API reuses the pages' code for every rule: a run is validated by the new-run form (``RunForm``:
target URLs, timeouts, overrides, size) and launched like the form launches it; rollout lists take
the run table's filter (``RolloutFilterForm``, also the review filters); files stream through
``rollouts.review.curated``; labels, notes and corrections go through ``rollouts.review.actions``.

This module is the API object (auth, parser, operationIds, error answers); the routes are in the
modules of ``ROUTE_MODULES``, their bodies in ``rollouts.api.schemas``.
"""

from __future__ import annotations

import importlib
import sys

from django.http import HttpRequest
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from rollouts.api.errors import FieldsError
from rollouts.api.open_streams import StreamRefused
from rollouts.api.openapi import complete
from rollouts.engine.contract import NotJSON, strict_loads
from rollouts.models import ApiToken
from rollouts.teams import TOKEN_TEAM_ATTR, NoTeam
from rollouts.tokens import bad_token_wait, check_token, count_bad_token
from rollouts.web.sessions import client_address

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class TooManyBadTokens(HttpError):
    """429: this client address sent too many wrong tokens this minute; ``wait``: seconds."""

    def __init__(self, wait: int):
        self.wait = wait
        super().__init__(429, f"too many wrong API tokens from this address: try again in {wait} s")


class TokenAuth(HttpBearer):
    """``Authorization: Bearer gw_…`` → the token's active user (also set as ``request.user``).
    A wrong token: 401 and counted against the client address (``rollouts.tokens``; past the
    limit, 429 with ``Retry-After``); an expired one: 401 saying so; a read-only token on a
    POST, PATCH, PUT or DELETE: 403."""

    def authenticate(self, request: HttpRequest, token: str):
        address = client_address(request)
        wait = bad_token_wait(address)
        if wait:
            raise TooManyBadTokens(wait)
        checked = check_token(token)
        if checked.row is None:
            count_bad_token(address)
            if checked.refused == "expired":
                raise HttpError(401, "this API token has expired: make a new one on your account page")
            return None
        if checked.row.scope != ApiToken.Scope.WRITE and request.method not in SAFE_METHODS:
            raise HttpError(403, "this API token is read-only: use a read-write token to change anything")
        user = checked.user
        if checked.row.team_id is not None:
            setattr(user, TOKEN_TEAM_ATTR, checked.row.team_id)  # rollouts.teams: that team only
        request.user = user
        return user


class StrictJSONParser(Parser):
    """Request bodies read by ``contract.strict_loads``, the reader of every other JSON gymweb takes
    in: NaN/Infinity, numbers past a float (``1e400``) and unpaired surrogate escapes
    (``"\\ud800"``, which no database or file can hold) are refused. ninja turns any parse error
    into a 400; the reason is kept on the request so that 400 names it (``_http_error``)."""

    def parse_body(self, request: HttpRequest):
        try:
            return strict_loads(request.body)
        except NotJSON as exc:
            request._gymweb_body_error = f"the request body is not valid JSON: {exc}"
            raise


# The published operationIds (``rollouts_review_api_list_runs``, …): ninja derives them from the
# view's module, so each module of this package keeps its published prefix and generated clients
# keep their method names.
OPERATION_ID_PREFIXES = {
    "rollouts.api.router": "rollouts_review_api",
    "rollouts.api.datasets": "rollouts_review_api",
    "rollouts.api.runs": "rollouts_review_api",
    "rollouts.api.rollout_list": "rollouts_review_api",
    "rollouts.api.review": "rollouts_review_api",
    "rollouts.api.queues": "rollouts_review_api",
    "rollouts.api.trainer": "rollouts_review_trainer_api",
    "rollouts.api.archive": "rollouts_review_api_archive",
}


class GymwebAPI(NinjaAPI):
    """``NinjaAPI`` whose OpenAPI document also declares what the routes' signatures cannot
    (``rollouts.api.openapi``: filter values, 401/403/404 answers, file content types), with the
    published operationIds (``OPERATION_ID_PREFIXES``)."""

    def get_openapi_schema(self, *args, **kwargs):
        return complete(super().get_openapi_schema(*args, **kwargs))

    def get_openapi_operation_id(self, operation) -> str:
        module = operation.view_func.__module__
        prefix = OPERATION_ID_PREFIXES.get(module, module.replace(".", "_"))
        return f"{prefix}_{operation.view_func.__name__}"


api = GymwebAPI(
    title="gymweb API",
    version="1",
    description="Datasets, runs, NeMo Gym files and review for scripts and training loops. "
    "Send `Authorization: Bearer <token>` (make one on your account page).",
    auth=TokenAuth(),
    urls_namespace="api",
    parser=StrictJSONParser(),
    docs_url="/docs",  # Swagger UI from django-ninja's own static files (ninja is an app), never a CDN
)


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    body = {"detail": getattr(request, "_gymweb_body_error", None) or exc.message}
    if isinstance(exc, FieldsError) and exc.errors:
        body["errors"] = exc.errors
    if isinstance(exc, StreamRefused):
        body.update(exc.body)
    response = api.create_response(request, body, status=exc.status_code)
    if isinstance(exc, TooManyBadTokens):
        response["Retry-After"] = str(exc.wait)
    elif isinstance(exc, StreamRefused):
        response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(NoTeam)
def _no_team(request, exc: NoTeam):
    """A user in no team (or a token of a team they left) making a run, dataset or queue: 400."""
    return api.create_response(request, {"detail": str(exc), "errors": {"team": [str(exc)]}}, status=400)


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    """A query or path parameter django-ninja could not read (``offset=-5``, ``limit=0``,
    ``after=x``): a 400 with the body of every other 400 (``detail`` naming the parameter and why,
    ``errors``: parameter → messages). A request body's errors keep ninja's 422 and its list."""
    errors: dict[str, list[str]] = {}
    for error in exc.errors:
        loc = [str(part) for part in error.get("loc", ())]
        if not loc or loc[0] not in ("query", "path"):
            return api.create_response(request, {"detail": exc.errors}, status=422)
        name = loc[-1] if len(loc) > 1 else loc[0]
        errors.setdefault(name, []).append(_reason(error))
    name, reasons = next(iter(errors.items()))
    return api.create_response(request, {"detail": f"{name}: {reasons[0]}", "errors": errors}, status=400)


def _reason(error: dict) -> str:
    """One parameter error in words, with the value sent: ``"must be at least 1 (got '0')"``."""
    ctx = error.get("ctx") or {}
    got = f" (got {error['input']!r})" if "input" in error and error.get("type") != "missing" else ""
    kind = error.get("type", "")
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}{got}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}{got}"
    return f"{error.get('msg', 'invalid value')}{got}"


# The routes register on `api` as their modules load, in this order (the OpenAPI document lists
# them so): datasets, runs, the rollout list, review, review queues and the rubric; then the
# training-loop routes (POST /runs, GET /runs/{id}/results, GET /rollouts/{id}). Delete, archive
# and restore (DELETE /runs/{id}, POST /runs/{id}/archive, /restore) are their own router.
ROUTE_MODULES = ("datasets", "runs", "rollout_list", "review", "queues", "archive", "trainer")
for _name in ROUTE_MODULES:
    importlib.import_module(f"rollouts.api.{_name}")
archive_routes = sys.modules["rollouts.api.archive"]
api.delete(archive_routes.DELETE_PATH, **archive_routes.DELETE_ROUTE)(archive_routes.delete_run)
api.add_router("", archive_routes.router)
