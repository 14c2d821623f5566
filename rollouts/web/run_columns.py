"""The run table's chosen columns (task and verify fields, the prompt and final-answer previews)
and its search snippets, for one page of rows.

The fields a run offers come from ``rollouts.review.columns.discover`` (a bounded sample of its
rows), cached for a final run. Cell values are read in SQL for the page's rows only. Everything
here is plain text: the template escapes it (a snippet's match goes in ``<mark>`` there).
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.cache import cache
from django.db.models import OuterRef, Subquery

from rollouts.models import Rollout, Run, TrajectoryItem
from rollouts.review import columns
from rollouts.search.text import find_snippet, normalise_query

PREVIEW_CHARS = 100
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)  # reasoning inside a message: not the answer
FIELDS_CACHE_S = 300
FIELDS_LIVE_CACHE_S = 30


def run_fields(run: Run) -> list[columns.FieldInfo]:
    """The task and verify fields of ``run`` (``columns.discover``), cached ``FIELDS_CACHE_S``
    (``FIELDS_LIVE_CACHE_S`` while the run is not final, so a live table's refreshes do not
    re-read the sample)."""
    key = f"gymweb:run-fields:v1:{run.pk}:{run.status}:{run.created.timestamp() if run.created else 0}"
    hit = cache.get(key)
    if isinstance(hit, list):
        return [columns.FieldInfo(**f) for f in hit]
    found = columns.discover(Rollout.objects.filter(run=run), imported=run.status == Run.Status.IMPORTED)
    cache.set(key, [f.__dict__ for f in found], FIELDS_CACHE_S if run.is_final else FIELDS_LIVE_CACHE_S)
    return found


def column_heads(chosen: list[str], fields: list[columns.FieldInfo], filt, base: str) -> list[dict[str, Any]]:
    """One head per chosen column: ``name``, ``label``, ``type``, ``preview`` (no sort), and for a
    field its sort link (``url``, ``arrow``) and its filter's value and name."""
    types = {f.name: f.type for f in fields}
    heads = []
    current = filt.sort_key
    for name in chosen:
        if name in columns.PREVIEWS:
            heads.append({"name": name, "label": columns.PREVIEWS[name], "preview": True, "type": "text"})
            continue
        if current == name:
            target, arrow = f"-{name}", "↑"
        elif current == f"-{name}":
            target, arrow = name, "↓"
        else:
            target, arrow = name, ""
        qs = filt.querystring(sort=target)
        heads.append(
            {
                "name": name,
                "label": name,
                "type": types.get(name, ""),
                "preview": False,
                "url": f"{base}?{qs}" if qs else base,
                "arrow": arrow,
                "filter_value": filt.field_filter_value(name),
            }
        )
    return heads


def cell_text(value: Any, kind: str) -> str:
    """A field's value as the table shows it (SQLite gives booleans as 1/0: shown as the field's
    JSON spelling when the field is boolean); ``""`` for a missing value."""
    if value is None:
        return ""
    if kind == "bool" and value in (0, 1, "0", "1"):
        return "true" if str(value) == "1" else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS].rstrip() + "…"


def _message_text(item: Any) -> str:
    if not isinstance(item, dict):
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "\n".join(parts)


def prompt_preview(params_input: Any) -> str:
    """The first user message's text of a task's ``responses_create_params.input`` (a string, or a
    list of items, or its JSON text), cut to ``PREVIEW_CHARS``; ``""`` when there is none."""
    value = params_input
    if isinstance(value, str) and value[:1] == "[":
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if isinstance(value, str):
        return _cut(value)
    for item in value if isinstance(value, list) else []:
        if isinstance(item, dict) and item.get("role", "user") == "user":
            text = _message_text(item)
            if text:
                return _cut(text)
    return ""


def attach_columns(run: Run, rows: list, chosen: list[str], fields: list[columns.FieldInfo], text: str) -> None:
    """Set on each loaded row (``Rollout``) of a page: ``cells`` (the chosen columns' texts, in
    order), and ``snippet`` (``(before, match, after)`` or None) when ``text`` (a content search)
    is given. Two queries at most, over the page's rows only."""
    if not rows:
        return
    types = {f.name: f.type for f in fields}
    ids = [r.pk for r in rows]
    annotations: dict[str, Any] = {}
    for i, name in enumerate(chosen):
        if name == "prompt":
            annotations[f"c{i}"] = columns.FieldText("task__row_json", ["responses_create_params", "input"])
        elif name == "answer":
            last = TrajectoryItem.objects.filter(rollout=OuterRef("pk"), kind="message", role="assistant")
            annotations[f"c{i}"] = Subquery(last.order_by("-seq").values("payload")[:1])
        else:
            exprs = columns.field_expressions(name)
            if exprs is not None:
                annotations[f"c{i}"] = exprs[0]
    values: dict[int, dict[str, Any]] = {}
    if annotations:
        values = {
            v["id"]: v for v in Rollout.objects.filter(id__in=ids).annotate(**annotations).values("id", *annotations)
        }
    for row in rows:
        got = values.get(row.pk, {})
        cells = []
        for i, name in enumerate(chosen):
            value = got.get(f"c{i}")
            if name == "prompt":
                cells.append(prompt_preview(value))
            elif name == "answer":
                payload = value
                if isinstance(payload, str):
                    try:
                        payload = json.loads(payload)
                    except ValueError:
                        payload = None
                cells.append(_cut(_THINK.sub(" ", _message_text(payload))))
            else:
                cells.append(cell_text(value, types.get(name, "")))
        row.cells = cells
        row.snippet = None
    if text:
        _attach_snippets(rows, text)


def _attach_snippets(rows: list, text: str) -> None:
    """Each row's first hit of ``text``: in its items (in order), else its verify reply (without the
    response, which the items are), else its task row."""
    needle = normalise_query(text)
    left = {r.pk: r for r in rows}
    hits = (
        TrajectoryItem.objects.filter(rollout_id__in=list(left), search_text__contains=needle)
        .order_by("rollout_id", "seq")
        .values_list("rollout_id", "seq", "payload")
    )
    for rollout_id, _seq, payload in hits.iterator(chunk_size=50):
        row = left.get(rollout_id)
        if row is None or row.snippet is not None:
            continue
        found = find_snippet(payload, text)
        if found:
            row.snippet = found
    missing = [pk for pk, r in left.items() if r.snippet is None]
    if not missing:
        return
    for pk, verify_json, task_json in Rollout.objects.filter(id__in=missing).values_list(
        "id", "verify_json", "task__row_json"
    ):
        for source, skip in ((verify_json, columns.SKIP_VERIFY), (task_json, frozenset())):
            try:
                value = json.loads(source) if source else None
            except ValueError:
                value = None
            found = find_snippet(value, text, skip=frozenset(skip) | {"_ng_task_index", "_ng_rollout_index"})
            if found:
                left[pk].snippet = found
                break
