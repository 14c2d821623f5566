"""The trajectory page's outline: one row per step with its tools, latency, tokens,
problem badges and a bar on one shared time axis (a waterfall of where the rollout's time went),
and the one-line summary a folded item shows.

Everything here works on the view dicts ``items.timeline`` builds; nothing reads the
database. Texts stay plain strings: templates autoescape them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollouts.display import duration_ms, svg_number
from rollouts.thinking import split_thinking

# The waterfall's SVG user space: bars are drawn in a viewBox this wide (the SVG scales to its box).
AXIS_WIDTH = 1000.0
SUMMARY_MAX_CHARS = 120


_TAG_ONLY = {"<think>", "</think>", "<thinking>", "</thinking>"}
# tool-call argument keys whose value says what the call does (shown instead of the JSON)
_TELLING_KEYS = ("command", "cmd", "code", "query", "patch", "path", "url")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and line.lower() not in _TAG_ONLY:
            return line if len(line) <= SUMMARY_MAX_CHARS else line[: SUMMARY_MAX_CHARS - 1] + "…"
    return ""


def _length(n: int) -> str:
    return f"{n:,} char{'' if n == 1 else 's'}"


def _texts(content: Any) -> list[str]:
    """The texts of a message's content (a string or a list of parts), in order."""
    if isinstance(content, str):
        return [content]
    out = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict):
            for key in ("text", "refusal"):
                if isinstance(part.get(key), str):
                    out.append(part[key])
                    break
    return out


def item_summary(payload: Any) -> dict[str, str]:
    """The one line a folded item shows: ``{"label": role or tool name, "line": first non-empty
    line of its text (at most 120 characters), "length": "1,234 chars"}``.

    A message is labelled by its role, a ``function_call`` by ``call <name>``, an output by
    ``output``, reasoning by ``reasoning``; other items by their type. The length counts every
    character of the item's texts (arguments, output, content), not only the shown part.
    (A stand-in for the rendering module's own summary; the same shape.)"""
    item = payload if isinstance(payload, dict) else {}
    kind = item.get("type")
    if kind is None and "role" in item and "content" in item:
        kind = "message"
    if kind == "message":
        label, texts = str(item.get("role") or "message"), _texts(item.get("content"))
    elif kind == "function_call":
        args = item.get("arguments")
        label, texts = f"call {item.get('name') or ''}".strip(), [args if isinstance(args, str) else str(args)]
        shown = _telling_argument(args)
        if shown is not None:
            line = _first_line(shown)
            return {"label": label, "line": line, "length": _length(len(texts[0]))}
    elif kind == "function_call_output":
        out = item.get("output")
        label, texts = "output", (_texts(out) if isinstance(out, list) else [out if isinstance(out, str) else str(out)])
    elif kind == "reasoning":
        label = "reasoning"
        texts = _texts(item.get("summary")) + _texts(item.get("content"))
    else:
        label, texts = str(kind or "item"), [str(payload)]
    label = label if len(label) <= 80 else label[:79] + "…"
    line = next((first for first in (_first_line(t) for t in texts) if first), "")
    return {"label": label, "line": line, "length": _length(sum(len(t) for t in texts))}


def _telling_argument(arguments: Any) -> str | None:
    """The argument that says what a call does (``command``, ``code``, ``query``…, or the only
    string argument) when ``arguments`` is a JSON object; None otherwise."""
    if not isinstance(arguments, str) or not arguments.lstrip().startswith("{") or len(arguments) > 1_000_000:
        return None
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    for key in _TELLING_KEYS:
        if isinstance(value.get(key), str) and value[key].strip():
            return value[key]
    strings = [v for v in value.values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 and len(value) == 1 else None


def fold_summary(payload: Any) -> dict[str, str]:
    """The folded item's line as ``{"label", "line", "length"}`` (``item_summary``)."""
    return item_summary(payload)


# a shell tool's exit status as tools print it: mini-swe-agent's ``<returncode>1</returncode>``,
# "Exit code: 1", or a JSON output's ``returncode`` / ``exit_code`` field
_RETURNCODE_RE = re.compile(
    r"<returncode>\s*(-?\d+)\s*</returncode>|\bexit(?:\s|_)?(?:code|status)\W{0,3}(-?\d+)", re.I
)
_EXIT_KEYS = ("returncode", "return_code", "exit_code", "exitcode", "exit_status")


def output_failure(payload: Any, tool_status: int | None = None) -> str:
    """Why a ``function_call_output`` failed, as a short badge text (``"HTTP 500"``, ``"exit 1"``,
    ``"error"``), or ``""`` when nothing says it did: an HTTP status >= 400 of the tool call, a
    non-zero exit code the output reports (in its first 2,000 characters), or a JSON output whose
    ``error`` field is set or whose ``status`` is ``"error"``/``"failed"``."""
    if tool_status is not None and tool_status >= 400:
        return f"HTTP {tool_status}"
    item = payload if isinstance(payload, dict) else {}
    output = item.get("output")
    if isinstance(output, list):
        output = "\n".join(_texts(output))
    if isinstance(output, dict):
        value: Any = output
    elif isinstance(output, str):
        head = output[:2000]
        stripped = head.lstrip()
        value = None
        if stripped.startswith("{") and len(output) <= 100_000:
            try:
                value = json.loads(output)
            except ValueError:
                value = None
        if not isinstance(value, dict):
            m = _RETURNCODE_RE.search(head)
            code = (m.group(1) or m.group(2)) if m else None
            return f"exit {code}" if code is not None and int(code) != 0 else ""
    else:
        return ""
    for key in _EXIT_KEYS:
        code = value.get(key)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return f"exit {code}"
    if value.get("error") not in (None, "", False, [], {}):
        return "error"
    if str(value.get("status") or "").lower() in ("error", "failed", "failure"):
        return "error"
    return ""


def message_gist(payload: Any) -> str:
    """The first line an assistant message says outside its thinking spans (thinking's first
    line when it says nothing else), at most 120 characters; ``""`` for other items."""
    item = payload if isinstance(payload, dict) else {}
    if item.get("type", "message") != "message" or "content" not in item:
        return ""
    thought = ""
    for text in _texts(item.get("content")):
        for thinking, segment in split_thinking(text):
            line = _first_line(segment)
            if line and not thinking:
                return line
            thought = thought or line
    return thought


def _is_call(view: dict[str, Any]) -> bool:
    return str(view.get("template", "")).endswith("item_function_call.html")


def _call_line(view: dict[str, Any]) -> str:
    """``bash: ls -la`` for a function call view (its summary's telling argument)."""
    summary = view.get("summary") or {}
    name = view.get("name") or "?"
    line = summary.get("line") or ""
    return f"{name}: {line}" if line else str(name)


def step_gist(items: list[dict[str, Any]]) -> dict[str, str]:
    """What a step did, for its outline row and folded header: ``{"what": first call as
    "bash: ls -la" (and "+N more calls"), "text": the first line of the agent's first message}``;
    either may be ``""``."""
    calls = [v for v in items if _is_call(v)]
    what = _call_line(calls[0]) if calls else ""
    if len(calls) > 1:
        what += f" (+{len(calls) - 1} more call{'' if len(calls) == 2 else 's'})"
    text = next((v["gist"] for v in items if v.get("gist")), "")
    return {"what": what, "text": text}


# a step with more items than this shows them in sub-groups (each call with its reasoning)
GROUP_MIN_ITEMS = 8
# a step with more items than this starts with its sub-groups folded
GROUP_FOLD_ITEMS = 24


def sub_groups(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A long step's items in sub-groups: each group is the reasoning and messages before a call,
    the call(s) and their outputs (a new group starts at a non-call item after a call). Each
    ``{"items": [...], "line": what the group did, "label": "bash" or "message", "count": "5 items",
    "failed": badge text or ""}``."""
    groups: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    seen_call = False
    for view in views:
        io = _is_call(view) or str(view.get("template", "")).endswith("item_function_call_output.html")
        if current and seen_call and not io:
            groups.append(current)
            current, seen_call = [], False
        current.append(view)
        seen_call = seen_call or _is_call(view)
    if current:
        groups.append(current)
    out = []
    for group in groups:
        calls = [v for v in group if _is_call(v)]
        gist = step_gist(group)
        failed = next((v["failed"] for v in group if v.get("failed")), "")
        first_seq = next((v["seq"] for v in group if v.get("seq")), "")
        out.append(
            {
                "items": group,
                "label": ", ".join(dict.fromkeys(str(v.get("name") or "?") for v in calls)) if calls else "text",
                "line": gist["what"] or gist["text"] or (group[0].get("summary") or {}).get("line", ""),
                "count": f"{len(group)} item{'' if len(group) == 1 else 's'}",
                "failed": failed,
                "seq": first_seq,
            }
        )
    return out


def _tokens(usage: Any) -> str:
    if not isinstance(usage, dict):
        return ""
    i, o = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(i, int) and not isinstance(o, int):
        return ""
    return f"{i if isinstance(i, int) else '?'}→{o if isinstance(o, int) else '?'} tok"


def _tool_names(items: list[dict[str, Any]]) -> list[str]:
    """Names of the tools a step called, in order, repeats folded: ``["bash ×3", "submit"]``."""
    counts: dict[str, int] = {}
    for view in items:
        if view.get("template", "").endswith("item_function_call.html"):
            name = view.get("name") or "?"
            counts[name] = counts.get(name, 0) + 1
    return [f"{name} ×{n}" if n > 1 else name for name, n in counts.items()]


def _step_badges(step: dict[str, Any]) -> list[dict[str, str]]:
    """Problems of a step as outline badges (class, text, title)."""
    call = step.get("call")
    items = step.get("items", []) + step.get("tail", [])
    badges = []
    if call is not None and (call.error or (call.http_status or 0) >= 300):
        badges.append({"cls": "failed", "text": "error", "title": "the agent call failed"})
    if step.get("incomplete"):
        badges.append({"cls": "warn", "text": "incomplete", "title": step["incomplete"]})
    refusals = sum(1 for v in items for p in (v.get("parts") or ()) if p.get("kind") == "refusal")
    if refusals:
        badges.append(
            {"cls": "failed", "text": "refusal", "title": f"{refusals} refusal part(s) in the agent's messages"}
        )
    unpaired = sum(1 for v in items if v.get("unanswered"))
    if unpaired:
        badges.append({"cls": "unpaired", "text": f"{unpaired} unpaired", "title": "function calls no output answered"})
    refused = sum(1 for v in items if v.get("answer_refused") or (v.get("origin") == "gym" and v.get("refused")))
    refused_calls = sum(1 for v in items if v.get("answer_refused"))
    if refused_calls:
        badges.append(
            {"cls": "failed", "text": f"{refused_calls} refused", "title": "calls gymweb refused to send to the env"}
        )
    elif refused:
        badges.append(
            {"cls": "failed", "text": f"{refused} refused", "title": "calls gymweb refused to send to the env"}
        )
    failed = [
        v.get("failed") or f"HTTP {v['tool_status']}"
        for v in items
        if v.get("failed") or (v.get("tool_status") or 0) >= 400
    ]
    if failed:
        kinds = ", ".join(dict.fromkeys(failed))
        badges.append(
            {
                "cls": "bad",
                "text": f"{len(failed)} tool failed",
                "title": f"tool outputs that failed (an HTTP error status or a non-zero exit code): {kinds}"[:300],
            }
        )
    return badges


def outline(steps: list[dict[str, Any]], *, imported: bool, started: Any | None = None) -> dict[str, Any]:
    """The outline of a timeline (``items.timeline``'s steps).

    Returns ``{"rows": [...], "timed": bool, "span": "12.3 s"}``; each row: ``index``, ``title``,
    ``tools`` (names, repeats folded), ``latency`` (text; "" when unknown), ``tokens`` (text),
    ``badges``, and for timed rollouts the waterfall geometry in SVG user units of a
    ``AXIS_WIDTH``-wide axis: ``agent_x``/``agent_w`` (the agent call: from its start, relative to
    the first call's start or ``started``, for its latency) and ``tools_x``/``tools_w`` (the sum of
    the step's tool call latencies, right after the call). Imported runs have no timing:
    ``timed`` is False and no geometry is given (the page says "latency unknown")."""
    rows = []
    spans = []  # (start ms, agent ms, tools ms) per row, None when untimed
    origin = None
    if not imported:
        starts = [s["call"].started for s in steps if s.get("call") is not None and s["call"].started]
        origin = started if started is not None else (min(starts) if starts else None)
        if starts and origin is not None and min(starts) < origin:
            origin = min(starts)
    for step in steps:
        call = step.get("call")
        items = step.get("items", []) + step.get("tail", [])
        tools_ms = sum(v.get("tool_latency_ms") or 0.0 for v in items)
        row = {
            "index": step["index"],
            "number": str(step["index"] + 1),
            "title": step.get("title") or f"Step {step['index'] + 1}",
            "tools": _tool_names(items),
            "gist": step.get("gist") or step_gist(items),
            "latency": "" if imported or call is None else duration_ms(call.latency_ms),
            "tools_time": duration_ms(tools_ms) if tools_ms and not imported else "",
            "tokens": _tokens(call.usage) if call is not None else "",
            "badges": _step_badges(step),
            "items": step.get("count", len(items)),
        }
        rows.append(row)
        if origin is not None and call is not None and call.started:
            start = (call.started - origin).total_seconds() * 1000.0
            spans.append((max(start, 0.0), max(call.latency_ms or 0.0, 0.0), tools_ms))
        else:
            spans.append(None)
    end = max((s + a + t for s, a, t in (x for x in spans if x)), default=0.0)
    timed = end > 0
    if timed:
        scale = AXIS_WIDTH / end
        for row, span in zip(rows, spans):
            if span is None:
                continue
            start, agent, tools = span
            # at least half a unit wide, so a 1 ms call on a 10 minute axis is still a mark
            # strings: a float in a template goes through number localisation, slow on 500 rows
            row["agent_x"] = svg_number(start * scale)
            row["agent_w"] = svg_number(max(agent * scale, 0.5))
            row["tools_x"] = svg_number((start + agent) * scale)
            row["tools_w"] = svg_number(tools * scale) if tools else ""
    return {"rows": rows, "timed": timed, "span": duration_ms(end) if timed else "", "axis": svg_number(AXIS_WIDTH)}
