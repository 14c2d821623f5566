"""Search of a rollout's whole stored text (the trajectory page's find, past the display cut):
which items hold a string, and where. Pure functions over payloads; no Django here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# strings longer than this are searched as they are (not decoded as JSON text)
DECODE_MAX_CHARS = 5_000_000
OFFSETS_MAX = 20  # offsets reported per item


def texts(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in ``value`` (keys of objects too), in order; a string holding a JSON object
    or array (tool arguments, JSON outputs) yields the strings it decodes to instead, as the page
    shows them in fields and trees."""
    if depth > 200:
        return
    if isinstance(value, str):
        if value.lstrip()[:1] in ("{", "[") and len(value) <= DECODE_MAX_CHARS:
            try:
                decoded = json.loads(value)
            except (ValueError, RecursionError):
                decoded = None
            if isinstance(decoded, (dict, list)):
                yield from texts(decoded, depth + 1)
                return
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in ("id", "type", "status", "call_id"):
                continue
            yield str(key)
            yield from texts(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from texts(item, depth + 1)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def find_in(value: Any, needle: str) -> tuple[int, list[int]]:
    """``(hits, offsets)`` of ``needle`` (case-insensitive) in ``value``'s strings (``texts``):
    offsets count characters into each string, at most ``OFFSETS_MAX`` of them."""
    needle = needle.lower()
    if not needle:
        return 0, []
    hits, offsets = 0, list[int]()
    for text in texts(value):
        hay = text.lower()
        start = hay.find(needle)
        while start != -1:
            hits += 1
            if len(offsets) < OFFSETS_MAX:
                offsets.append(start)
            start = hay.find(needle, start + len(needle))
    return hits, offsets
