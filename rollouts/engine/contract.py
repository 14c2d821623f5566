"""The agent side of the contract: what a valid ``/v1/responses`` reply is, and which calls are asks.

No Django here: the loop (``rollouts.engine.loop``) and the conformance check use it directly.

The reference is NeMo Gym's ``NeMoGymResponse`` (``nemo_gym/openai_utils.py``): openai-python's
``Response`` with ``output`` typed as the *input-item* union and a ``usage`` that is either absent,
``null`` or complete (contract rule 3, DESIGN.md). Validation is pydantic's default (lax) mode, as in
NeMo Gym; unknown extra fields are tolerated everywhere.
"""
from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

__all__ = [
    "AgentReply",
    "NotJSON",
    "strict_loads",
    "InvalidReply",
    "RESERVED_ENV_ROUTES",
    "Usage",
    "add_usage",
    "find_asks",
    "has_assistant_message",
    "parse_reply",
    "tool_name_problem",
    "arguments_problem",
    "refused_tool_output",
]


class _Loose(BaseModel):
    # Unknown extra fields are tolerated and kept (rule 3); the stored item is the agent's own dict.
    model_config = ConfigDict(extra="allow")


class OutputText(_Loose):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class Refusal(_Loose):
    type: Literal["refusal"]
    refusal: str


class OutputMessage(_Loose):
    """An assistant message as a model returns it (``ResponseOutputMessage``)."""

    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    content: list[Annotated[Union[OutputText, Refusal], Field(discriminator="type")]]
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = "completed"


class InputText(_Loose):
    type: Literal["input_text"]
    text: str


class InputMedia(_Loose):
    type: Literal["input_image", "input_file", "input_audio"]


class InputMessage(_Loose):
    """An "easy" input message (any role, content a string or a list of input parts)."""

    type: Literal["message"]
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[Annotated[Union[InputText, InputMedia], Field(discriminator="type")]]]


class FunctionCall(_Loose):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # a JSON *string*, as the Responses API sends it
    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class FunctionCallOutput(_Loose):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[dict[str, Any]]]
    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class SummaryText(_Loose):
    type: Literal["summary_text"]
    text: str


class Reasoning(_Loose):
    type: Literal["reasoning"]
    id: str
    summary: list[SummaryText]


# Hosted-tool and client-executed call items pass through untouched (rule 3); their inner shapes are
# the provider's business, so only `type` is checked.
HOSTED_ITEM_TYPES = (
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
)


class HostedItem(_Loose):
    type: Literal[HOSTED_ITEM_TYPES]  # type: ignore[valid-type]


def _item_kind(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str):
            return kind if kind in _TAGGED else "hosted" if kind in HOSTED_ITEM_TYPES else "unknown"
        return "untyped"
    return "unknown"


_TAGGED = {"message", "function_call", "function_call_output", "reasoning"}


class _UnknownItem(BaseModel):
    """Never valid: routes items with an unknown or missing ``type`` to a clear error."""

    type: Annotated[str, Field(description="must be a known Responses item type")]

    @field_validator("type")
    @classmethod
    def _reject(cls, value: str) -> str:
        raise ValueError(f"unknown output item type {value!r}")


class _UntypedItem(BaseModel):
    type: str  # missing -> "Field required" error, which is the message we want


OutputItem = Annotated[
    Union[
        # Smart union, as in NeMo Gym: an assistant message may come in either shape.
        Annotated[Union[OutputMessage, InputMessage], Tag("message")],
        Annotated[FunctionCall, Tag("function_call")],
        Annotated[FunctionCallOutput, Tag("function_call_output")],
        Annotated[Reasoning, Tag("reasoning")],
        Annotated[HostedItem, Tag("hosted")],
        Annotated[_UnknownItem, Tag("unknown")],
        Annotated[_UntypedItem, Tag("untyped")],
    ],
    Discriminator(_item_kind),
]


# Token counts are counts: negative or absurd values (beyond a 64-bit column) are invalid.
TokenCount = Annotated[int, Field(ge=0, lt=2**63)]


class InputTokensDetails(_Loose):
    # Required but nullable, as in NeMo Gym's NeMoGymResponseInputTokensDetails: null = unknown.
    cached_tokens: Optional[TokenCount]


class OutputTokensDetails(_Loose):
    reasoning_tokens: Optional[TokenCount]


class Usage(_Loose):
    """Complete token usage of one reply (rule 3: partial usage is invalid). Units: tokens."""

    input_tokens: TokenCount
    output_tokens: TokenCount
    total_tokens: TokenCount
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails


class AgentReply(_Loose):
    """A valid Responses API object from the agent service (contract rule 3, DESIGN.md)."""

    id: str
    created_at: float
    model: str
    object: Literal["response"]
    output: list[OutputItem]
    parallel_tool_calls: bool
    tool_choice: Union[str, dict[str, Any]]
    tools: list[Any]
    usage: Optional[Usage] = None
    incomplete_details: Optional[Any] = None


class NotJSON(ValueError):
    """Text that is not strict JSON; ``str(exc)`` says why. For a syntax error, ``reason`` is the
    parser's message without its position (``"Expecting ',' delimiter"``) and ``line``/``column``
    (1-based) say where; all three are None for the other reasons (NaN, nesting, surrogates)."""

    def __init__(self, message: str, *, reason: Optional[str] = None, line: Optional[int] = None, column: Optional[int] = None):
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


def strict_loads(text: "str | bytes", *, unique_keys: bool = False) -> Any:
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


class InvalidReply(Exception):
    """The agent's JSON object is not a valid Responses API object: a terminal failure (rule 3).

    ``str(exc)`` is a readable list of every field error, e.g. ``"output.0.call_id: Field required"``.
    """


def _describe(exc: ValidationError, limit: int = 8) -> str:
    lines = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in _ALL_TAGS)) or "(top level)"
        lines.append(f"{where}: {err['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        lines.append(f"... and {more} more")
    return "; ".join(lines)


_ALL_TAGS = {"message", "OutputMessage", "InputMessage", "function_call", "function_call_output", "reasoning", "hosted", "unknown", "untyped"}


def parse_reply(data: dict[str, Any]) -> AgentReply:
    """Validate one agent reply (a JSON object already decoded into a dict).

    Returns the validated ``AgentReply``. Raises ``InvalidReply`` naming every bad field
    (contract rule 3, DESIGN.md). The caller keeps ``data`` itself as the stored record, so nothing
    the agent sent is normalised away.
    """
    try:
        return AgentReply.model_validate(data)
    except ValidationError as exc:
        raise InvalidReply(f"{exc.error_count()} validation error(s): {_describe(exc)}") from None


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


def tool_name_problem(name: str) -> Optional[str]:
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


def arguments_problem(arguments: Any) -> tuple[Optional[Any], Optional[str]]:
    """Decode a call's ``arguments`` string: ``(value, None)``, or ``(None, output text)`` when it is
    not JSON. The text is NeMo Gym's remote_agent's, byte for byte, since agents are trained on what
    they read here (contract rule 6, DESIGN.md): ``json.dumps({"error": f"Invalid tool call
    arguments: {e!r}"})`` with ``e`` the exception ``json.loads`` raised (Python's lax parser, as
    NeMo Gym's; nesting too deep for it is refused the same way)."""
    try:
        return json.loads(arguments), None
    except (ValueError, TypeError, RecursionError) as exc:
        return None, json.dumps({"error": f"Invalid tool call arguments: {exc!r}"})


def refused_tool_output(name: Any, arguments: Any) -> tuple[Optional[Any], Optional[str]]:
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


def _optional_sum(left: Any, right: Any) -> Optional[int]:
    # An unknown (null) detail count stays unknown: it is never turned into a measurement.
    return None if left is None or right is None else left + int(right)


def add_usage(total: Optional[dict[str, Any]], usage: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
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
