"""The agent side of the contract: what a valid ``/v1/responses`` reply is, and which calls are asks.

No Django here: the loop (``rollouts.engine.loop``) and the conformance check use it directly.

A valid reply is one NeMo Gym's ``NeMoGymResponse`` accepts (contract rule 3, DESIGN.md); the models
are in ``rollouts.engine.reply_schema``. This module turns their verdict into gymweb's messages and
the JSON paths of each error (``InvalidReply``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import ValidationError

__all__ = [
    "AgentReply",
    "NotJSON",
    "strict_loads",
    "InvalidReply",
    "ReplyError",
    "RESERVED_ENV_ROUTES",
    "Usage",
    "add_usage",
    "find_asks",
    "has_assistant_message",
    "parse_reply",
    "prepare_reply_validation",
    "tool_name_problem",
    "arguments_problem",
    "refused_tool_output",
]


def __getattr__(name: str) -> Any:
    """``AgentReply`` (a valid reply) and ``Usage`` (a complete usage): the models of
    ``reply_schema``, imported on first use, because importing the openai package is slow, a cost
    that commands which never read an agent reply should not pay."""
    if name in ("AgentReply", "Usage"):
        from rollouts.engine import reply_schema

        return reply_schema.ReplyModel if name == "AgentReply" else reply_schema.ReplyUsage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class NotJSON(ValueError):
    """Text that is not strict JSON; ``str(exc)`` says why. For a syntax error, ``reason`` is the
    parser's message without its position (``"Expecting ',' delimiter"``) and ``line``/``column``
    (1-based) say where; all three are None for the other reasons (NaN, nesting, surrogates)."""

    def __init__(self, message: str, *, reason: str | None = None, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.reason = reason
        self.line = line
        self.column = column


def _reject_constant(name: str) -> Any:
    raise NotJSON(f"{name} is not a JSON value")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value in (math.inf, -math.inf):
        # Python would read it as infinity and write it back as `Infinity`, which is not JSON.
        raise NotJSON(f"the number {literal[:40]} is too large for a 64-bit float")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise NotJSON(f"the key {name!r} appears twice in one object")
            seen.add(name)
    return value


def strict_loads(text: str | bytes, *, unique_keys: bool = False) -> Any:
    """``json.loads`` that accepts only what every JSON reader accepts and gymweb can store.

    Rejects NaN/Infinity (Python's json reads them; NeMo Gym's files must not carry them), numbers
    past a 64-bit float's range like ``1e400`` (they would read as infinity), nesting
    deeper than Python can handle, and unpaired UTF-16 surrogates (``"\\ud800"``), which cannot be
    written as UTF-8. ``unique_keys`` also rejects an object that names a key twice (files a user
    wrote; replies keep JSON's last-one-wins, as NeMo Gym reads them). Raises ``NotJSON`` with the
    reason; returns the decoded value.
    """
    hook = _no_duplicate_keys if unique_keys else None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=hook)
    except RecursionError:
        raise NotJSON("nested too deeply") from None
    except NotJSON:
        raise
    except json.JSONDecodeError as exc:
        raise NotJSON(str(exc), reason=exc.msg, line=exc.lineno, column=exc.colno) from None
    except ValueError as exc:
        raise NotJSON(str(exc)) from None
    raw = text if isinstance(text, str) else text.decode("utf-8", "replace")
    if "\\u" in raw:  # only an escape can spell a lone surrogate; check the decoded value then
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise NotJSON("it contains an unpaired UTF-16 surrogate escape (like \\ud800), which is not text") from None
        except RecursionError:
            raise NotJSON("nested too deeply") from None
    return value


class ReplyError(dict):
    """One validation error of a reply: ``{"path": [...], "message": str}``. ``path`` is the JSON
    path into the body the agent sent (object keys and list indices; a missing field's name last)."""


class InvalidReply(Exception):
    """The agent's JSON object is not a valid Responses API object: a terminal failure (rule 3).

    ``str(exc)`` is a readable list of every field error, e.g. ``"output.0.call_id: Field required"``;
    ``errors`` the same as ``ReplyError`` dicts (at most ``ERRORS_KEPT``); ``validation_text``
    pydantic's text of the validation error as NeMo Gym's model names it (``N validation errors for
    NeMoGymResponse`` then each error), for NeMo Gym's failure row (``nemo_errors.agent_reply``).
    """

    def __init__(self, message: str, errors: list[ReplyError] | None = None, validation_text: str = ""):
        super().__init__(message)
        self.errors = errors or []
        self.validation_text = validation_text


ERRORS_KEPT = 50


def _json_path(data: Any, loc: tuple[Any, ...], missing: bool) -> list[Any]:
    """The part of pydantic's ``loc`` that names places in ``data``: union member labels
    (``function_call``, ``OutputText``, ``str``, ``list[...]``) are dropped; a missing field's name
    is kept as the last step."""
    from rollouts.engine import reply_schema

    path: list[Any] = []
    here: Any = data
    for position, step in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(here, dict) and isinstance(step, str) and step in here:
            here = here[step]
            path.append(step)
        elif isinstance(here, list) and isinstance(step, int) and 0 <= step < len(here):
            here = here[step]
            path.append(step)
        elif last and missing and isinstance(step, str) and step not in reply_schema.ITEM_TAGS:
            path.append(step)
    return path


def _message(err: Any) -> str:
    """pydantic's message, in words for the item-type errors (its own lists every known tag)."""
    if err["type"] == "union_tag_invalid":
        return f"unknown output item type {err.get('ctx', {}).get('tag')!r}"
    if err["type"] == "union_tag_not_found":
        return "the item has no usable 'type' (an object with a string 'type' is needed)"
    return err["msg"]


def _errors(data: Any, exc: ValidationError) -> list[ReplyError]:
    found: list[ReplyError] = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors():
        path = _json_path(data, tuple(err["loc"]), err["type"] == "missing")
        key = (json.dumps(path), err["msg"])
        if key in seen:  # one line per place and message (a union reports each member)
            continue
        seen.add(key)
        found.append(ReplyError(path=path, message=_message(err)))
        if len(found) >= ERRORS_KEPT:
            break
    return found


def _describe(errors: list[ReplyError], total: int, limit: int = 8) -> str:
    lines = [f"{'.'.join(str(p) for p in e['path']) or '(top level)'}: {e['message']}" for e in errors[:limit]]
    more = total - min(limit, len(errors))
    if more > 0:
        lines.append(f"... and {more} more")
    return "; ".join(lines)


def prepare_reply_validation() -> None:
    """Import and build the reply models now (a slow import, once per process), so that a
    long-lived event loop is not paused by it at its first reply."""
    from rollouts.engine.reply_schema import ReplyModel

    ReplyModel.model_validate(
        {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "output": [],
            "usage": None,
        }
    )


def parse_reply(data: dict[str, Any]) -> AgentReply:
    """Validate one agent reply (a JSON object already decoded into a dict).

    Returns the validated ``AgentReply``. Raises ``InvalidReply`` naming every bad field with its
    JSON path (contract rule 3, DESIGN.md). The caller keeps ``data`` itself as the stored record, so
    nothing the agent sent is normalised away.
    """
    from rollouts.engine.reply_schema import ReplyModel

    try:
        return ReplyModel.model_validate(data)
    except ValidationError as exc:
        errors = _errors(data, exc)
        head, newline, rest = str(exc).partition("\n")
        text = head.replace(f" for {exc.title}", " for NeMoGymResponse") + newline + rest
        raise InvalidReply(
            f"{len(errors)} validation error(s): {_describe(errors, len(errors))}", errors, text
        ) from None


def find_asks(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``function_call`` items of one reply that gymweb must execute (contract rule 4).

    ``output`` is the reply's raw item list. A call is an *ask* when no ``function_call_output`` of
    the same ``call_id`` is in the same reply (pairing is judged within one reply only). When a
    ``call_id`` repeats among asks, the last one wins, and it runs once, at the position of the last.
    Returns the asks in order.
    """
    answered = {item.get("call_id") for item in output if item.get("type") == "function_call_output"}
    last_by_id: dict[str, int] = {}
    for pos, item in enumerate(output):
        if item.get("type") == "function_call" and item.get("call_id") not in answered:
            last_by_id[item["call_id"]] = pos
    return [output[pos] for pos in sorted(last_by_id.values())]


def has_assistant_message(output: list[dict[str, Any]]) -> bool:
    """True when the reply carries at least one assistant ``message`` item (rule 10)."""
    return any(item.get("type") == "message" and item.get("role") == "assistant" for item in output)


# An env's own routes: an agent must never reach them through a tool call (rule 5).
RESERVED_ENV_ROUTES = frozenset({"seed_session", "verify", "aggregate_metrics", "close_session"})
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_\-.~:@!$&'()*+,;=]+$")


def tool_name_problem(name: str) -> str | None:
    """Why a tool name must not be sent to the env, or None when it may be (rule 5, DESIGN.md).

    A name must be one safe URL path segment (no ``/``, ``..``, ``?``, ``#``, ``%``, white space,
    not empty) and not one of the env's own routes (``RESERVED_ENV_ROUTES``).
    """
    if not name:
        return "the tool name is empty"
    if name in (".", "..") or not _SAFE_SEGMENT.match(name):
        return f"the tool name {name!r} is not a safe URL path segment"
    # Servers may match routes without regard to case or a trailing dot; refuse every such spelling.
    if name.rstrip(".").lower() in RESERVED_ENV_ROUTES:
        return f"{name!r} is one of the environment's own routes, which an agent may not call"
    return None


def arguments_problem(arguments: Any) -> tuple[Any | None, str | None]:
    """Decode a call's ``arguments`` string: ``(value, None)``, or ``(None, output text)`` when it is
    not JSON. The text is NeMo Gym's remote_agent's, byte for byte, since agents are trained on what
    they read here (contract rule 6, DESIGN.md): ``json.dumps({"error": f"Invalid tool call
    arguments: {e!r}"})`` with ``e`` the exception ``json.loads`` raised (Python's lax parser, as
    NeMo Gym's; nesting too deep for it is refused the same way)."""
    try:
        return json.loads(arguments), None
    except (ValueError, TypeError, RecursionError) as exc:
        return None, json.dumps({"error": f"Invalid tool call arguments: {exc!r}"})


def refused_tool_output(name: Any, arguments: Any) -> tuple[Any | None, str | None]:
    """Whether one ask may be sent to the env: ``(decoded arguments, None)``, or ``(None, the
    function_call_output text gymweb appends instead)`` (rules 5 and 6, DESIGN.md). The one place
    both the loop and the conformance check decide this."""
    name = name if isinstance(name, str) else ""
    problem = tool_name_problem(name)
    if problem is not None:
        return None, f"Error: gymweb did not call tool {name!r}: {problem}."
    return arguments_problem(arguments if isinstance(arguments, str) else "")


_USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens")
_USAGE_DETAILS = (("input_tokens_details", "cached_tokens"), ("output_tokens_details", "reasoning_tokens"))


def _optional_sum(left: Any, right: Any) -> int | None:
    # An unknown (null) detail count stays unknown: it is never turned into a measurement.
    return None if left is None or right is None else left + int(right)


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Sum the usage of one more reply into a rollout's total (rule 8, DESIGN.md), as NeMo Gym's
    ``accumulate_response_usage`` does: ``None`` means "not reported" and leaves the other side;
    the first reported usage is copied whole, extra keys (``cost``, ``input_tokens_per_turn``…)
    included, and later replies add only the five standard counts (tokens). A null
    ``cached_tokens``/``reasoning_tokens`` on either side makes the sum null. Returns a new dict;
    neither argument is changed.
    """
    if usage is None:
        return total
    if total is None:
        first = json.loads(json.dumps(usage))  # a deep copy that keeps key order and extra keys
        for key in _USAGE_KEYS:
            first[key] = int(usage[key])
        for outer, inner in _USAGE_DETAILS:
            value = usage[outer][inner]
            first[outer][inner] = None if value is None else int(value)
        return first
    result = json.loads(json.dumps(total))
    for key in _USAGE_KEYS:
        result[key] = total[key] + int(usage[key])
    for outer, inner in _USAGE_DETAILS:
        result[outer][inner] = _optional_sum(result[outer][inner], usage[outer][inner])
    return result
