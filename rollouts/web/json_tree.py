"""JSON values as markup: foldable trees (JSON inside JSON strings decoded too), strings shown by
content (a diff, code, text), and named values as field lists (``value_html``). Not yet sanitised
(``sanitiser.sanitise``); rendering stops walking a value once the ``Budget`` is spent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.utils.html import escape

from rollouts.web.diffs import diff_html, looks_like_diff
from rollouts.web.highlight import code_block, key_language
from rollouts.web.markup import RICH_MAX_CHARS, Budget, elided_note, plural, pre_block

# JSON inside JSON strings is decoded this many levels deep; JSON values nest this deep at most
# in a tree (deeper values are shown as compact JSON text).
NESTED_JSON_LEVELS = 8
JSON_TREE_DEPTH = 40
# Argument and field names whose string values are code or commands: shown as code blocks even on
# one line (any value with a newline is a code block too).
CODE_KEYS = frozenset(
    {
        "command",
        "cmd",
        "commands",
        "code",
        "patch",
        "diff",
        "query",
        "sql",
        "script",
        "shell",
        "bash",
        "python",
        "program",
        "source",
        "snippet",
        "regex",
        "pattern",
        "model_patch",
        "test_patch",
    }
)
# An object whose values are all short scalars is shown on one line up to this length.
COMPACT_OBJECT_CHARS = 100


def parse_json_text(text: str) -> Any:
    """The object or array a string holds as JSON, or None (not JSON, a bare scalar, or longer
    than ``RICH_MAX_CHARS``)."""
    s = text.strip()
    if not s or s[0] not in "{[" or s[-1] not in "}]" or len(s) > RICH_MAX_CHARS:
        return None
    try:
        value = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, (dict, list)) else None


def scalar_html(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return f'<span class="j-l">{"null" if value is None else str(value).lower()}</span>'
    if isinstance(value, (int, float)):
        return f'<span class="j-n">{escape(json.dumps(value))}</span>'
    return f'<span class="j-l">{escape(str(value))}</span>'


def string_value_html(key: str, text: str, budget: Budget, levels: int, in_json: bool) -> str:
    """A string found in arguments, a tool output, a JSON value or a verify field, by content:
    JSON (decoded and shown as a tree), a diff, code or multi-line text (whitespace kept), or a
    one-line string."""
    if levels < NESTED_JSON_LEVELS:
        nested = parse_json_text(text)
        if nested is not None:
            return '<div class="nested-note"><span class="j-note">JSON in a string</span></div>' + json_tree_html(
                nested, budget, levels + 1
            )
    if len(text) <= RICH_MAX_CHARS and looks_like_diff(text):
        shown, note = budget.clip(text)
        return diff_html(shown, note)
    if "\n" in text or (not in_json and key.lower() in CODE_KEYS):
        shown, note = budget.clip(text)
        if not in_json and key_language(key):
            return code_block(shown, key_language(key)) + elided_note(note)
        return pre_block(shown, "code" if not in_json else "j-m") + elided_note(note)
    shown, note = budget.clip(text)
    if in_json:
        return f'<span class="j-s">{escape(json.dumps(shown, ensure_ascii=False))}</span>{elided_note(note)}'
    return f'<span class="j-s">{escape(shown)}</span>{elided_note(note)}'


def json_tree_html(value: Any, budget: Budget, levels: int = 0, depth: int = 0) -> str:
    """A JSON value as a foldable tree (objects and arrays are ``<details open>``)."""
    if isinstance(value, str):
        return string_value_html("", value, budget, levels, True)
    if not isinstance(value, (dict, list)):
        return scalar_html(value)
    if not value:
        return '<span class="j-l">{}</span>' if isinstance(value, dict) else '<span class="j-l">[]</span>'
    if depth >= JSON_TREE_DEPTH:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, RecursionError):
            text = str(value)[:10_000]
        shown, note = budget.clip(text)
        return pre_block(shown, "part-json") + elided_note(note)
    is_dict = isinstance(value, dict)
    compact = compact_json(value, is_dict) if depth else None  # the outermost value is always a tree
    if compact is not None:
        shown, note = budget.clip(compact)
        return f'<span class="j-s">{escape(shown)}</span>{elided_note(note)}'
    entries: Iterable = value.items() if isinstance(value, dict) else enumerate(value)
    rows = []
    listed = 0
    for k, v in entries:
        if budget.spent:
            budget.cut = True
            break
        key = str(k)
        label = f'<span class="j-k">{escape(key)}</span>: ' if is_dict else ""
        inner = (
            json_tree_html(v, budget, levels, depth + 1)
            if isinstance(v, (dict, list))
            else _leaf(key, v, budget, levels)
        )
        rows.append(f'<div class="j-row">{label}{inner}</div>')
        listed += 1
    if listed < len(value):
        left = len(value) - listed
        rows.append(elided_note(f"… {left:,} more entr{'y' if left == 1 else 'ies'}"))
    size = plural(len(value), "key") if is_dict else plural(len(value), "item")
    opener, closer = ("{", "}") if is_dict else ("[", "]")
    return (
        f'<details class="j" open><summary class="j-sum">{opener} <span class="j-c">{size}</span></summary>'
        f'<div class="j-in">{"".join(rows)}</div>{closer}</details>'
    )


def _is_plain_scalar(v: Any) -> bool:
    if isinstance(v, str):
        return len(v) <= 80 and "\n" not in v and v.strip()[:1] not in ("{", "[")
    return v is None or isinstance(v, (bool, int, float))


def compact_json(value: Any, is_dict: bool) -> str | None:
    """One line of JSON for a container of plain scalars (short one-line strings, numbers,
    literals): an array of any length, an object up to ``COMPACT_OBJECT_CHARS``; None otherwise
    (shown as a tree)."""
    values = value.values() if is_dict else value
    if not all(_is_plain_scalar(v) for v in values):
        return None
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if not is_dict or len(text) <= COMPACT_OBJECT_CHARS else None


def _leaf(key: str, value: Any, budget: Budget, levels: int) -> str:
    if isinstance(value, str):
        return string_value_html(key, value, budget, levels, True)
    return scalar_html(value)


def json_block(value: Any, budget: Budget, levels: int = 0) -> str:
    return f'<div class="json">{json_tree_html(value, budget, levels)}</div>'


def pretty_text(value: Any) -> tuple[str, bool]:
    """``(text, is_json)``: JSON (a string holding JSON, or a value) pretty-printed with a
    2-space indent; other strings as they are."""
    if isinstance(value, str):
        parsed = parse_json_text(value)
        if parsed is None:
            try:
                json.loads(value)
                return value, True
            except (ValueError, RecursionError):
                return value, False
        value = parsed
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str), True
    except (ValueError, RecursionError, TypeError):
        try:
            return json.dumps(value, ensure_ascii=False, default=str), True
        except (ValueError, RecursionError, TypeError):
            return str(value)[:10_000], False


def value_html(key: str, value: Any, budget: Budget) -> str:
    """One named value (a tool-call argument, a verify field) rendered by content: a string by
    ``string_value_html``; an object as a field list; an array as a JSON tree; other values as JSON
    literals. Markup, not yet sanitised."""
    if isinstance(value, str):
        return string_value_html(key, value, budget, 0, False)
    if isinstance(value, dict) and value:
        return fields_html(value, budget)
    if isinstance(value, list):
        compact = compact_json(value, False)
        if compact is not None:
            shown, note = budget.clip(compact)
            return f'<span class="j-s">{escape(shown)}</span>{elided_note(note)}'
    if isinstance(value, (dict, list)):
        return json_block(value, budget)
    return scalar_html(value)


def fields_html(mapping: dict, budget: Budget) -> str:
    rows = []
    items = list(mapping.items())
    for i, (k, v) in enumerate(items):
        if budget.spent:
            budget.cut = True
            rows.append(
                f'<dt class="f-k">…</dt><dd class="f-v">{elided_note(f"{len(items) - i:,} more field(s)")}</dd>'
            )
            break
        rows.append(f'<dt class="f-k">{escape(str(k))}</dt><dd class="f-v">{value_html(str(k), v, budget)}</dd>')
    return f'<dl class="fields">{"".join(rows)}</dl>'
