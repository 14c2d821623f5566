"""What the API's OpenAPI document declares beyond the routes' signatures (``complete``):

- the run table's filter on every route that reads it (the rollout list, the file downloads, a
  dataset from a selection), each parameter with its type and, for a choice, its allowed values,
  taken from the filter form itself (``RolloutFilterForm``), so they cannot drift apart;
- the task and verify field filters (``f.<field>``) as one documented parameter pattern;
- the 400 answer of every route that takes parameters or a body, the 401 of every route behind the
  token, the 403 of every write (a read-only token) and where a route declares one, the 404 of
  every route with an id in its path, all with the ``Error`` body;
- the content type of the downloaded files (JSONL) and of the results stream (NDJSON).
"""

from __future__ import annotations

from typing import Any

from django import forms

from rollouts.engine.failures import FailureKind
from rollouts.review.query import FILTER_FIELDS, RolloutFilterForm

FILTERED = ("/rollouts", "/rollouts.jsonl", "/rollouts_failures.jsonl", "/sft.jsonl", "/selection/dataset")
FILES = {"/rollouts.jsonl", "/rollouts_failures.jsonl", "/rollouts_materialized_inputs.jsonl", "/sft.jsonl"}
ERROR_REF = {"$ref": "#/components/schemas/Error"}
ANSWERS = {
    "401": "no token, a malformed `Authorization` header, or an unknown or revoked token "
    '(`{"detail": "Unauthorized"}`)',
    "400": "a bad parameter or body: `detail` names it and why, `errors` maps each parameter to its messages "
    '(`{"detail": "limit: must be at least 1", "errors": {"limit": ["must be at least 1"]}}`)',
    "403": "the token's user may not do this (a read-only token on a write)",
    "404": "no such object (or not visible to the token's user)",
}
_FILTER_DOC = {
    "label": "a label's name (GET /labels), or `(none)` for rollouts without any label",
    "not_label": "a label's name (GET /labels): rollouts without it",
    "text": "case-insensitive substring of any trajectory item",
    "tool": "a tool's exact name: rollouts that called it",
    "output": "case-insensitive substring of a tool output",
    "error": "case-insensitive substring of the failure message",
    "kind": "a failure kind",
    "task": "a task index",
}
_EXPORT_PARAMS = [
    {
        "name": "review",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["", "0", "1"]},
        "description": "1: each row gets `gymweb_review` (labels, notes, correction)",
    },
]


def filter_parameters() -> list[dict[str, Any]]:
    """The run table's filter as OpenAPI query parameters (name, type, allowed values)."""
    form = RolloutFilterForm({})
    out = []
    for name in FILTER_FIELDS:
        field = form.fields[name]
        schema: dict[str, Any]
        if isinstance(field, forms.FloatField):
            schema = {"type": "number"}
        elif isinstance(field, forms.IntegerField):
            schema = {"type": "integer", "minimum": 0}
        elif name == "kind":
            schema = {"type": "string", "enum": [""] + list(FailureKind.ALL)}
        elif isinstance(field, forms.ChoiceField) and name not in ("label", "not_label"):
            schema = {"type": "string", "enum": [str(v) for v, _ in field.choices]}
        else:
            schema = {"type": "string"}
            if getattr(field, "max_length", None):
                schema["maxLength"] = field.max_length
        desc = _FILTER_DOC.get(name) or str(field.label or name)
        out.append({"name": name, "in": "query", "required": False, "schema": schema, "description": desc})
    return out


# The task and verify field filters: one query parameter per field, named after it.
FIELD_FILTER_PARAM = {
    "name": "f.<field>",
    "in": "query",
    "required": False,
    "style": "form",
    "explode": True,
    "schema": {
        "type": "object",
        "propertyNames": {"pattern": r"^f\.(task|verify)\.[A-Za-z0-9_\-:@$ ]{1,80}(\.[A-Za-z0-9_\-:@$ ]{1,80}){0,5}$"},
        "additionalProperties": {"type": "string", "maxLength": 500},
    },
    "description": "a task or verify field's filter, one parameter per field: `f.verify.score=0.5..1` (a number "
    'range: `..1`, `0.5..`, `1`, `true`/`false`), `f.task.category=math` (exact text), `f.task.id="nan"` (in '
    "double quotes: always text). An invalid range is a 400 naming the parameter (docs/trajectory.md)",
}


def _content(op: dict[str, Any], ctype: str, what: str) -> None:
    ok = op.setdefault("responses", {}).setdefault("200", {"description": "OK"})
    ok["content"] = {ctype: {"schema": {"type": "string", "description": what}}}


def _answers(schema: dict[str, Any], path: str, method: str, op: dict[str, Any]) -> None:
    """``op``'s responses keyed by strings, with the 400/401/403/404 answers it can give."""
    responses: dict[str, Any] = {}
    for code, answer in op["responses"].items():  # ninja's codes are ints, openapi_extra's strings
        responses[str(code)] = {**responses.get(str(code), {}), **answer}
    op["responses"] = responses
    if op.get("security") or schema.get("security"):
        responses.setdefault(
            "401", {"description": ANSWERS["401"], "content": {"application/json": {"schema": ERROR_REF}}}
        )
    if "{" in path:
        responses.setdefault(
            "404", {"description": ANSWERS["404"], "content": {"application/json": {"schema": ERROR_REF}}}
        )
    if op.get("parameters") or op.get("requestBody"):
        responses.setdefault("400", {"content": {"application/json": {"schema": ERROR_REF}}})
        responses["400"]["description"] = ANSWERS["400"]
    if method in ("post", "put", "patch", "delete") and (op.get("security") or schema.get("security")):
        responses.setdefault("403", {"content": {"application/json": {"schema": ERROR_REF}}})
    if "403" in responses:
        responses["403"].setdefault("description", ANSWERS["403"])


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (django-ninja's OpenAPI document of the API) with the declarations above added.
    Returns the same dict."""
    error = (
        schema.setdefault("components", {})
        .setdefault("schemas", {})
        .setdefault("Error", {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]})
    )
    error.setdefault("properties", {}).setdefault(
        "errors",
        {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
            "description": "per parameter or field, its messages (a 400)",
        },
    )
    filters = filter_parameters()
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            _answers(schema, path, method, op)
            tail = path[path.rfind("}") + 1 :] if "{" in path else path
            if method == "get" and tail in FILES:
                _content(op, "application/jsonl", "JSONL: one JSON object per line")
            if path.startswith("/api/v1/runs/{run_id}") and tail in FILTERED:
                have = {p["name"] for p in op.get("parameters", [])}
                params = op.setdefault("parameters", [])
                for p in filters:
                    if p["name"] in have:
                        for q in params:
                            if q["name"] == p["name"]:
                                q["schema"] = {
                                    **q.get("schema", {}),
                                    **{k: v for k, v in p["schema"].items() if k != "type"},
                                }
                                q.setdefault("description", p["description"])
                    else:
                        params.append(p)
                if FIELD_FILTER_PARAM["name"] not in have:
                    params.append(FIELD_FILTER_PARAM)
                if tail in FILES:
                    params.extend(p for p in _EXPORT_PARAMS if p["name"] not in have)
    return schema
