"""The verdict panel of the trajectory page: what the env added to its verify reply, at the top of
the page beside the reward.

NeMo Gym's resources servers answer ``/verify`` with the request echoed (the task row's fields,
``responses_create_params``, ``response``) plus their own fields (``BaseVerifyResponse`` and its
subclasses: ``resolved``, ``judge_evaluations``, ``rubric_evaluations`` …). The panel shows only
the latter:

- Left out: ``reward`` (shown beside the panel), ``responses_create_params``, ``response``,
  ``agent_ref``, ``_ng_*`` keys, and every field the task row holds with the same value. An
  imported run's task row is the imported row itself, so there every other field is shown (the
  panel says so).
- Objects are opened (nulls inside them are counted, not shown; up to ``OPEN_DEPTH`` levels, ``OPEN_MAX_KEYS`` keys each, ``OPEN_TOP_MAX_KEYS``
  for a field of the reply): their scalars are
  shown inline under dotted names (``metadata.eval_report.<id>.resolved``).
- Scalars inline; texts rendered by ``rendering.text_body`` (Markdown, diffs, JSON); lists and
  other objects as JSON trees (``rendering.tree_body``); large trees start folded.
- Known shapes as a table (``judgement_rows``): a rubric (a list of objects each with a score or
  verdict and a reason) and a judge (an object with a verdict and an explanation, or NeMo Gym's
  ``JudgeEvaluation``: the judge's ``response`` and its ``verdict_label``).
- References (``references``): a value equal to a ``call_id`` of the trajectory, an integer
  under an index key (``item_index``, ``message_index``, ``output_index``: a position in
  ``response.output``, which is the item's ``#N``), or a text (a value, or a quotation inside a
  judge's text) found verbatim in an item, link to that item's anchor (``#item-N``).

Pure functions: no database, no request. All markup comes from ``rendering`` (sanitised by
``sanitiser.sanitise``, the one place); everything else is plain text the template escapes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from rollouts.web import rendering
from rollouts.web.json_tree import parse_json_text

SKIP_KEYS = frozenset({"reward", "responses_create_params", "response", "agent_ref"})
OPEN_DEPTH = 6
OPEN_MAX_KEYS = 20  # a nested object with more keys is a tree
OPEN_TOP_MAX_KEYS = 30  # the same for a field of the reply itself
SCALAR_MAX_CHARS = 200  # a one-line string up to this length is a scalar
FOLD_TREE_CHARS = 3_000  # trees whose JSON is longer start folded
MAX_QUOTE_CANDIDATES = 200
MAX_SCAN_CHARS = 200_000_000  # texts searched for quotations: candidates × the items' characters
MIN_QUOTE_CHARS = 16
MAX_REFERENCES = 50

NAME_KEYS = (
    "criterion",
    "criteria",
    "question",
    "name",
    "title",
    "requirement",
    "rubric",
    "item",
    "criterion_id",
    "id",
    "description",
)
VERDICT_KEYS = (
    "verdict",
    "verdict_label",
    "judgement",
    "judgment",
    "decision",
    "label",
    "passed",
    "met",
    "satisfied",
    "correct",
    "is_correct",
)
SCORE_KEYS = ("score", "points", "reward", "grade", "rating", "value")
REASON_KEYS = (
    "explanation",
    "reason",
    "reasoning",
    "rationale",
    "justification",
    "judge_response",
    "judge_output",
    "feedback",
    "critique",
    "comment",
)
_INDEX_KEY_RE = re.compile(r"(?:^|_)(?:item|message|output)_?(?:index|idx)$", re.I)
_QUOTE_RE = re.compile(r"[\"“‘`]([^\"“”‘’`\n]{%d,300})[\"”’`]" % MIN_QUOTE_CHARS)
_ITEM_SKIP_KEYS = frozenset({"type", "id", "call_id", "role", "status", "name"})


def _is_scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= SCALAR_MAX_CHARS and "\n" not in value and parse_json_text(value) is None
    return value is None or isinstance(value, (bool, int, float))


def scalar_text(value: Any) -> str:
    """A scalar as the panel shows it: JSON literals (``true``, ``null``, numbers) and strings as
    they are (the empty string as ``""``); a list of scalars as compact JSON."""
    if isinstance(value, str):
        return value or '""'
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _first(obj: dict, keys: Iterable[str]) -> tuple[str, Any]:
    for key in keys:
        if key in obj and obj[key] is not None and obj[key] != "":
            return key, obj[key]
    return "", None


def _judge_text(obj: dict) -> str:
    """The text of a NeMo Gym ``JudgeEvaluation``'s ``response`` (its output messages' texts)."""
    response = obj.get("response")
    texts: list[str] = []
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        for item in response["output"]:
            if isinstance(item, dict) and item.get("type", "message") == "message":
                content = item.get("content")
                for part in content if isinstance(content, list) else [content]:
                    if isinstance(part, str):
                        texts.append(part)
                    elif isinstance(part, dict) and isinstance(part.get("text"), str):
                        texts.append(part["text"])
    return "\n\n".join(t for t in texts if t)


def _judgement_row(obj: Any) -> dict[str, Any] | None:
    """One judgement (``{"name", "verdict", "score", "reason"}``, texts or None) from an object
    with a verdict or score and a reason (or a judge's response); None for any other value."""
    if not isinstance(obj, dict):
        return None
    verdict_key, verdict = _first(obj, VERDICT_KEYS)
    score_key, score = _first(obj, SCORE_KEYS)
    reason_key, reason = _first(obj, REASON_KEYS)
    if not isinstance(reason, str):
        reason_key, reason = "", _judge_text(obj) or None
    if reason is None or (verdict_key == "" and score_key == ""):
        return None
    if verdict is not None and not _is_scalar(verdict) or score is not None and not _is_scalar(score):
        return None
    name_key, name = _first({k: v for k, v in obj.items() if k not in (verdict_key, score_key, reason_key)}, NAME_KEYS)
    weight = obj.get("weight")
    return {
        "name": scalar_text(name) if name is not None and _is_scalar(name) else "",
        "verdict": scalar_text(verdict) if verdict is not None else "",
        "score": scalar_text(score) if score is not None else "",
        "weight": scalar_text(weight) if _is_scalar(weight) and weight is not None else "",
        "reason": reason,
        "keys": [k for k in (name_key, verdict_key, score_key, reason_key) if k],
    }


def judgement_rows(value: Any) -> list[dict[str, Any]] | None:
    """The rows of a known shape: a rubric (a non-empty list of objects, each a judgement) or a
    judge (one object that is a judgement); None for any other value."""
    if isinstance(value, dict):
        row = _judgement_row(value)
        return [row] if row else None
    if isinstance(value, list) and value and len(value) <= 1_000:
        rows = [_judgement_row(v) for v in value]
        return rows if all(rows) else None  # type: ignore[return-value]
    return None


def _echoed(key: str, value: Any, task_row: dict[str, Any]) -> bool:
    return key in task_row and task_row[key] == value


def verdict_entries(verify: dict[str, Any], task_row: dict[str, Any], *, imported: bool) -> list[tuple[str, Any]]:
    """``(name, value)`` of the verify reply's fields the env added, in the reply's order
    (see the module docstring for what is left out)."""
    out = []
    for key, value in verify.items():
        if not isinstance(key, str) or key in SKIP_KEYS or key.startswith("_ng_"):
            continue
        if not imported and _echoed(key, value, task_row):
            continue
        out.append((key, value))
    return out


def _walk(path: str, value: Any, depth: int) -> Iterator[tuple[str, str, Any]]:
    """``(kind, dotted name, value)`` for the panel: ``scalar``, ``text``, ``table``, ``tree``,
    and ``empty`` for a null inside an opened object (counted, not shown)."""
    rows = judgement_rows(value)
    if depth and value is None:
        yield "empty", path, value
    elif rows is not None:
        yield "table", path, rows
    elif _is_scalar(value) or (
        isinstance(value, list) and all(_is_scalar(v) for v in value) and len(scalar_text(value)) <= SCALAR_MAX_CHARS
    ):
        yield "scalar", path, value
    elif isinstance(value, str):
        yield "text", path, value
    elif (
        isinstance(value, dict)
        and value
        and depth < OPEN_DEPTH
        and len(value) <= (OPEN_MAX_KEYS if depth else OPEN_TOP_MAX_KEYS)
    ):
        for k, v in value.items():
            yield from _walk(f"{path}.{k}", v, depth + 1)
    else:
        yield "tree", path, value


# -- references ---------------------------------------------------------------------------------
def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """``(key, string)`` of every string leaf of ``value`` (JSON strings of arguments decoded)."""
    if isinstance(value, str):
        yield key, value
        nested = parse_json_text(value) if key == "arguments" else None
        if nested is not None:
            yield from _strings(nested)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in _ITEM_SKIP_KEYS:
                yield from _strings(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, key)


class ItemIndex:
    """What the trajectory's items can be found by: ``call_id`` → the function_call's ``#N``,
    ``#N`` → a label, and each item's texts for finding quotations."""

    def __init__(self, items: Iterable[tuple[int, Any]]):
        self.calls: dict[str, int] = {}
        self.labels: dict[int, str] = {}
        self.texts: list[tuple[int, str]] = []
        for seq, payload in items:
            if not isinstance(payload, dict):
                continue
            kind = payload.get("type") or ("message" if "role" in payload else "item")
            call_id = payload.get("call_id")
            if isinstance(call_id, str) and call_id and (kind == "function_call" or call_id not in self.calls):
                self.calls[call_id] = seq
            name = payload.get("name") if isinstance(payload.get("name"), str) else payload.get("role")
            self.labels[seq] = f"{kind} {name}" if isinstance(name, str) and name else str(kind)
            self.texts.append((seq, "\n\x00".join(s for _, s in _strings(payload))))
        self.chars = sum(len(t) for _, t in self.texts)

    def find_text(self, text: str) -> int | None:
        for seq, haystack in self.texts:
            if text in haystack:
                return seq
        return None


class _References:
    """The links ``references`` collects: one per (field, item), at most ``MAX_REFERENCES``, and
    at most ``max_quotes`` texts searched for."""

    def __init__(self, index: ItemIndex) -> None:
        self.index = index
        self.found: list[dict[str, Any]] = []
        self.seen: set[tuple[str, int]] = set()
        self.quotes = 0
        self.max_quotes = max(20, min(MAX_QUOTE_CANDIDATES, MAX_SCAN_CHARS // max(1, index.chars)))

    def add(self, field_name: str, how: str, seq: int | None, text: str) -> None:
        if (
            seq is None
            or seq not in self.index.labels
            or (field_name, seq) in self.seen
            or len(self.found) >= MAX_REFERENCES
        ):
            return
        self.seen.add((field_name, seq))
        self.found.append(
            {
                "field": field_name,
                "how": how,
                "seq": seq,
                "label": self.index.labels[seq],
                "text": text if len(text) <= 80 else text[:79] + "…",
            }
        )

    def visit(self, field_name: str, key: str, value: Any) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int) and _INDEX_KEY_RE.search(key):
            self.add(field_name, f"{key} {value}", value, "")
        elif isinstance(value, str):
            self.visit_text(field_name, value)
        elif isinstance(value, dict):
            for k, v in value.items():
                self.visit(field_name, str(k), v)
        elif isinstance(value, list):
            for v in value:
                self.visit(field_name, key, v)

    def visit_text(self, field_name: str, value: str) -> None:
        if value in self.index.calls:
            self.add(field_name, "call_id", self.index.calls[value], value)
            return
        candidates = [value.strip()] if MIN_QUOTE_CHARS <= len(value.strip()) <= SCALAR_MAX_CHARS * 5 else []
        candidates += [m.group(1).strip() for m in _QUOTE_RE.finditer(value[:50_000])]
        for text in candidates:
            if self.quotes >= self.max_quotes or len(text) < MIN_QUOTE_CHARS:
                break
            self.quotes += 1
            self.add(field_name, "quotes", self.index.find_text(text), text)


def references(entries: list[dict[str, Any]], index: ItemIndex) -> list[dict[str, Any]]:
    """Links from the panel's fields to trajectory items: ``{"field", "how", "seq", "label",
    "text"}``, at most ``MAX_REFERENCES``, one per (field, item)."""
    refs = _References(index)
    for entry in entries:
        if entry["kind"] == "table":
            for row in entry["rows"]:
                refs.visit(entry["name"], "reason", row["reason_text"])
        elif entry["kind"] != "tree" or not entry["folded"]:
            refs.visit(entry["name"], entry["name"].rsplit(".", 1)[-1], entry["value"])
    return refs.found


# -- the panel ----------------------------------------------------------------------------------
def verdict_view(
    verify: Any, task_row: Any, *, imported: bool, items: Iterable[tuple[int, Any]], max_chars: int
) -> dict[str, Any] | None:
    """The verdict panel's context: ``scalars`` and ``blocks`` (each ``{"kind": scalar|text|table|tree,
    "name", "text"/"html"/"rows", "refs"}``), ``references``, ``imported``, ``cut`` (a text or tree
    was cut at ``max_chars``), ``empty`` (nulls inside opened objects, not shown);
    None when ``verify`` is not an object or the env added nothing."""
    if not isinstance(verify, dict):
        return None
    fields = verdict_entries(verify, task_row if isinstance(task_row, dict) else {}, imported=imported)
    top = dict(fields)
    judge = _judgement_row(top)
    if judge is not None and judge["verdict"] and any(k in REASON_KEYS for k in judge["keys"]):
        # the reply itself is a judge's (a verdict and an explanation at the top): one table
        used = set(judge["keys"])
        fields = [("judge", [{k: top[k] for k in judge["keys"]}])] + [(k, v) for k, v in fields if k not in used]
    entries: list[dict[str, Any]] = []
    cut = False
    empty = 0
    for key, value in fields:
        for kind, name, v in _walk(key, value, 0):
            if kind == "empty":
                empty += 1
                continue
            entry: dict[str, Any] = {"kind": kind, "name": name, "value": v, "refs": []}
            if kind == "scalar":
                entry["text"] = scalar_text(v)
                entry["cls"] = "v-true" if v is True else "v-false" if v is False else ""
            elif kind == "text":
                body = rendering.text_body(name.rsplit(".", 1)[-1], v, max_chars=max_chars)
                entry["html"], entry["length"] = body.html, f"{body.total:,}"
                cut = cut or body.cut
            elif kind == "tree":
                try:
                    size = len(json.dumps(v, ensure_ascii=False, default=str))
                except (ValueError, RecursionError):
                    size = FOLD_TREE_CHARS + 1
                body = rendering.tree_body(v, max_chars=max_chars)
                entry["html"], entry["folded"] = body.html, size > FOLD_TREE_CHARS
                entry["size"] = (
                    f"{len(v):,} {'key' if isinstance(v, dict) else 'item'}{'' if len(v) == 1 else 's'}"
                    if isinstance(v, (dict, list))
                    else ""
                )
                cut = cut or body.cut
            else:  # table
                budget = max(1, max_chars // max(1, len(v)))
                rows = []
                for row in v:
                    body = rendering.text_body("reason", row["reason"], max_chars=budget)
                    cut = cut or body.cut
                    rows.append({**row, "reason_text": row["reason"], "reason": body.html})
                entry["rows"] = rows
                entry["has_name"] = any(r["name"] for r in rows)
                entry["has_verdict"] = any(r["verdict"] for r in rows)
                entry["has_score"] = any(r["score"] for r in rows)
                entry["has_weight"] = any(r["weight"] for r in rows)
            entries.append(entry)
    if not entries and not empty:
        return None
    index = ItemIndex(items)
    refs = references(entries, index)
    by_field: dict[str, list[dict[str, Any]]] = {}
    for ref in refs:
        by_field.setdefault(ref["field"], []).append(ref)
    order = {"scalar": 0, "table": 1, "text": 2, "tree": 3}
    entries.sort(key=lambda e: order[e["kind"]])  # stable: the reply's order within each kind
    for entry in entries:
        entry["refs"] = by_field.get(entry["name"], [])
    return {
        "scalars": [e for e in entries if e["kind"] == "scalar"],
        "blocks": [e for e in entries if e["kind"] != "scalar"],
        "references": refs,
        "imported": imported,
        "cut": cut,
        "empty": empty,
    }
