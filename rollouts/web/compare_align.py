"""Two trajectories of one task aligned for the compare page's side-by-side view.

Alignment: the task inputs face each other, then step K of A faces step K of B (by step index).
Within a step, items are paired by type and name (a message by its role): the n-th ``function_call``
named ``bash`` of A faces the n-th of B; an item without a partner faces nothing. Two items are
**identical** when their canonical JSON is the same: keys sorted, and the keys that name one run's
objects (``id``, ``call_id``) left out. A row whose items are all identical (same count, every pair
identical) is shown once, folded; a differing row shows both sides and a line diff of each
differing pair, with the differing words of a changed line marked (``diffs.mark_words``). The first
differing row is the **first divergence**.

Pure functions over payloads and the trajectory page's view models; no database. Diffs are built
by ``diffs.diff_html`` (every line escaped) and sanitised here (``sanitiser.sanitise``).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from django.utils.safestring import SafeString

from rollouts.web.diffs import diff_html
from rollouts.web.sanitiser import sanitise

__all__ = ["align", "canonical_item", "item_key", "pair_items"]

RUN_KEYS = frozenset({"id", "call_id"})
DIFF_TEXT_MAX_CHARS = 50_000  # each side's text diffed at most (characters)
DIFF_MAX_LINES = 400  # diff lines shown per pair
DIFFS_PER_ROW = 20  # differing pairs diffed per row


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in RUN_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def canonical_item(payload: Any) -> str:
    """The canonical JSON of an item: keys sorted, ``id``/``call_id`` left out, at any depth. An
    item nested past Python's recursion limit gets a text of its own (it is never identical)."""
    try:
        return json.dumps(_strip(payload), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        return f"\0too deep {id(payload)}"


def item_key(payload: Any) -> tuple[str, str]:
    """``(type, name)`` an item is paired by: a call's name, a message's role, else ``""``."""
    if not isinstance(payload, dict):
        return (type(payload).__name__, "")
    kind = str(payload.get("type") or ("message" if "role" in payload else ""))
    return kind, str(payload.get("name") or payload.get("role") or "")


def pair_items(a: list[Any], b: list[Any]) -> list[tuple[int | None, int | None]]:
    """Positions of ``a`` and ``b`` paired by ``item_key`` occurrence (see the module docstring),
    in A's order with each unpaired item of B placed after the pair before it."""
    by_key: dict[tuple[str, str], list[int]] = {}
    for j, payload in enumerate(b):
        by_key.setdefault(item_key(payload), []).append(j)
    partner: dict[int, int] = {}
    for i, payload in enumerate(a):
        queue = by_key.get(item_key(payload))
        if queue:
            partner[i] = queue.pop(0)
    taken = set(partner.values())
    out: list[tuple[int | None, int | None]] = []
    next_b = 0
    for i in range(len(a)):
        j = partner.get(i)
        if j is not None:
            while next_b < j:  # B's unpaired items before this partner
                if next_b not in taken:
                    out.append((None, next_b))
                next_b += 1
            next_b = max(next_b, j + 1)
        out.append((i, j))
    out.extend((None, j) for j in range(next_b, len(b)) if j not in taken)
    return out


def _text(payload: Any) -> str:
    """What a diff compares: an item's texts, a call's name and arguments, else pretty JSON."""
    if isinstance(payload, dict):
        content = payload.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list) and content and all(isinstance(p, dict) and "text" in p for p in content):
            return "\n".join(str(p.get("text") or "") for p in content)
        if payload.get("type") == "function_call":
            args = payload.get("arguments")
            try:
                args = json.dumps(json.loads(args), indent=1, sort_keys=True, ensure_ascii=False)
            except (TypeError, ValueError):
                pass
            return f"{payload.get('name')}\n{args}"
        if isinstance(payload.get("output"), str):
            return payload["output"]
    return json.dumps(_strip(payload), indent=1, sort_keys=True, ensure_ascii=False)


def diff_of(a: Any, b: Any, label: str = "") -> SafeString:
    """A line diff of two items (``---`` A, ``+++`` B), the differing words of each changed line
    marked, as sanitised markup."""
    try:
        ta, tb = _text(a)[:DIFF_TEXT_MAX_CHARS], _text(b)[:DIFF_TEXT_MAX_CHARS]
    except RecursionError:
        ta, tb = "(nested too deep to diff)", "(nested too deep to diff)"
    lines = list(difflib.unified_diff(ta.split("\n"), tb.split("\n"), "A", "B", lineterm="", n=2))
    note = ""
    if len(lines) > DIFF_MAX_LINES:
        note = f"{len(lines) - DIFF_MAX_LINES:,} more diff lines not shown"
        lines = lines[:DIFF_MAX_LINES]
    return sanitise(diff_html("\n".join(lines), note, words=True))


def _row(kind: str, title: str, a: dict | None, b: dict | None, pa: list[Any], pb: list[Any]) -> dict[str, Any]:
    """One aligned row: ``a``/``b`` are the sides' views (a step or the task input) or None."""
    pairs = pair_items(pa, pb)
    same = bool(pairs) and all(
        i is not None and j is not None and canonical_item(pa[i]) == canonical_item(pb[j]) for i, j in pairs
    )
    if not pa and not pb:
        same = a is not None and b is not None
    diffs: list[dict[str, Any]] = []
    unpaired = 0
    if not same:
        for i, j in pairs:
            if i is None or j is None:
                unpaired += 1
            elif canonical_item(pa[i]) != canonical_item(pb[j]) and len(diffs) < DIFFS_PER_ROW:
                kind_name = " ".join(x for x in item_key(pa[i]) if x)
                diffs.append({"label": f"{kind_name} (A item {i + 1}, B item {j + 1})", "html": diff_of(pa[i], pb[j])})
    return {
        "kind": kind,
        "title": title,
        "a": a,
        "b": b,
        "same": same,
        "count": len(pa),
        "diffs": diffs,
        "unpaired": unpaired,
        "anchor": "",
    }


def align(
    input_a: list[Any] | None,
    input_b: list[Any] | None,
    steps_a: list[dict[str, Any]],
    steps_b: list[dict[str, Any]],
    payloads_a: dict[int, list[Any]],
    payloads_b: dict[int, list[Any]],
) -> list[dict[str, Any]]:
    """The aligned rows: the task input (``input_*``: the raw input items, None for a side
    without a rollout), then one row per step index. ``steps_*``: the trajectory page's step views;
    ``payloads_*``: every item payload of each step index, in order. The first differing row gets
    ``anchor = "first-divergence"``."""
    rows = []
    if input_a is not None or input_b is not None:
        rows.append(
            _row(
                "input",
                "Task input",
                {} if input_a is not None else None,
                {} if input_b is not None else None,
                input_a or [],
                input_b or [],
            )
        )
    by_a = {s["index"]: s for s in steps_a}
    by_b = {s["index"]: s for s in steps_b}
    for index in sorted(set(by_a) | set(by_b)):
        sa, sb = by_a.get(index), by_b.get(index)
        row = _row("step", f"Step {index + 1}", sa, sb, payloads_a.get(index, []), payloads_b.get(index, []))
        if sa is None or sb is None:
            row["same"] = False
        rows.append(row)
    first = next((r for r in rows if not r["same"]), None)
    if first is not None:
        first["anchor"] = "first-divergence"
    return rows
