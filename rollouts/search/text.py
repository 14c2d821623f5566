"""What an item's searchable text is (``TrajectoryItem.search_text``): pure functions, no Django,
no models.

The item's string values, decoded (JSON escapes undone, so a quote, a newline or text after U+0000
is found as it reads), lowercased, joined by newlines. Structural values (``type``, ``id``,
``status``, ``role``) are left out so "assistant" or "completed" do not match every item. A string
that holds JSON (tool-call ``arguments``, a tool output that is a JSON document) also contributes
its decoded strings when they differ from the raw text (escapes inside). U+0000 becomes a space
(PostgreSQL's ``text`` cannot hold it, and a search box cannot type it): "a\\x00secret" is found by
"secret". The column is filled by ``TrajectoryItem``'s manager on every ``bulk_create``/``save``
(the worker, ``collect``, imports, reverify, tests), and for rows stored before by migration
``0013_content_search``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_TEXT", "fill_missing", "find_snippet", "item_search_text", "normalise_query"]

# Longest search text kept per item (characters): a multi-megabyte tool output is indexed by its
# first 2,000,000 characters.
MAX_TEXT = 2_000_000
SKIPPED_KEYS = frozenset({"type", "id", "status", "role"})
_SURROGATE = re.compile("[\ud800-\udfff]")


def displayable(text: str) -> str:
    """``text`` with each lone surrogate as U+FFFD (no page can encode one); a NUL kept."""
    if not text.isascii() and _SURROGATE.search(text):
        return _SURROGATE.sub("\ufffd", text)
    return text


def _clean(text: str) -> str:
    if "\x00" in text:
        text = text.replace("\x00", " ")
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    return text


def normalise_query(text: str) -> str:
    """A user's query as the index holds text: lowercased, U+0000 as a space, lone surrogates as
    U+FFFD (``item_search_text``'s rules), so both sides compare alike."""
    return _clean(text).lower()


def _strings(value: Any, out: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        out.append(value)
        stripped = value.lstrip()
        # JSON inside a string (tool arguments, a JSON tool output): its decoded strings too, when
        # decoding changes something (an escaped quote, newline, unicode or U+0000).
        if depth < 4 and "\\" in value and stripped[:1] in ("{", "[", '"'):
            try:
                inner = json.loads(value)
            except (ValueError, RecursionError):
                return
            _strings(inner, out, depth + 1)
    elif isinstance(value, dict):
        for key, inner in value.items():
            if depth == 0 and key in SKIPPED_KEYS:
                continue
            _strings(inner, out, depth)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            _strings(inner, out, depth)


def item_search_text(item: Any) -> str:
    """The searchable text of one trajectory item (a decoded JSON value, usually a dict): its string
    values joined by ``"\\n"``, lowercased, U+0000 as a space, at most ``MAX_TEXT`` characters
    (rules in the module docstring). ``""`` for an item without text."""
    out: list[str] = []
    try:
        _strings(item, out)
    except RecursionError:  # deeper than Python nests: index what was read
        pass
    text = "\n".join(out)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT]
    return normalise_query(text)


def fill_missing(items: Iterable[Any]) -> None:
    """Set ``search_text`` on each unsaved ``TrajectoryItem`` of ``items`` whose text is not set yet
    (``TrajectoryItem``'s manager calls this before every ``bulk_create``)."""
    for item in items:
        if not item.search_text and item.payload is not None:
            item.search_text = item_search_text(item.payload)


def find_snippet(
    value: Any, query: str, context: int = 60, skip: frozenset = frozenset()
) -> tuple[str, str, str] | None:
    """The first string value of ``value`` (a decoded JSON value; top-level keys in ``skip`` left
    out) that contains ``query`` case-insensitively, as ``(before, match, after)``: the match as
    written, with up to ``context`` characters either side (``"…"`` where cut), newlines as
    spaces. None when no string holds it. Plain text: the caller escapes it."""
    needle = normalise_query(query)
    if not needle:
        return None
    if isinstance(value, dict) and skip:
        value = {k: v for k, v in value.items() if k not in skip}
    out: list[str] = []
    try:
        _strings(value, out)
    except RecursionError:
        pass
    for text in out:
        lowered = normalise_query(text)
        at = lowered.find(needle)
        if at < 0:
            continue
        if len(lowered) != len(text):  # lowercasing changed lengths (rare letters): show the lowered text
            text = lowered
        end = at + len(needle)
        before = text[max(0, at - context) : at]
        after = text[end : end + context]
        return (  # a lone surrogate as U+FFFD: no page can encode it
            ("…" if at > context else "") + displayable(before.replace("\n", " ")),
            displayable(text[at:end].replace("\n", " ")),
            displayable(after.replace("\n", " ")) + ("…" if end + context < len(text) else ""),
        )
    return None
