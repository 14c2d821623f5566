"""NeMo Gym's request model: ``responses_create_params`` as NeMo Gym 0.7.0 materialises it.

NeMo Gym validates a row's ``responses_create_params`` into its request model
(``NeMoGymResponseCreateParamsNonStreaming`` in ``nemo_gym/openai_utils.py``, built on the
``openai`` package's Responses types) and then uses it in two shapes:

- ``materialize(params)``: every field present, in the model's field order (30 keys), input items
  with their defaults (``"type":"message"``, ``"phase":null`` on a message). This is what the env
  receives in ``/seed_session`` and ``/verify`` and what a failure row carries (NeMo Gym's
  ``model_dump()``).
- ``materialize_response(response)``: the merged response as NeMo Gym's ``NeMoGymResponse`` dumps
  it (openai's ``Response``, every field in order), the ``response`` of ``/verify``.
- ``agent_result(reply)``: the env's ``/verify`` reply as NeMo Gym's agent returns it from ``/run``
  (its verify-response model re-validates the reply and dumps it): the model's fields first, in its
  order, with their defaults, then the reply's other fields in the reply's order. A success row of
  ``rollouts.jsonl`` is this plus the collector's keys.
- ``as_sent(params)``: only the fields the row set, in the model's field order, and each input item
  with only the fields it set, in its model's field order. This is the body the agent service
  receives from NeMo Gym's remote_agent (``model_dump(exclude_unset=True)``).

NeMo Gym's own item models (messages, ``function_call``, ``function_call_output``, ``reasoning``)
are materialised here; other typed items (hosted tool calls and their outputs) pass through as they
came. Params NeMo Gym's model would refuse (an unknown field, a wrong type, nesting past pydantic's
depth limit) are kept as they came:
gymweb does not refuse a task row NeMo Gym would refuse, it only cannot reshape it. No Django here.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

import orjson
from openai.types.responses import Response as _OpenAIResponse
from openai.types.responses.response_conversation_param_param import ResponseConversationParamParam
from openai.types.responses.response_create_params import (
    ContextManagement,
    Metadata,
    Moderation,
    Reasoning,
    ResponseIncludable,
    ResponsePromptParam,
    ResponsesModel,
    ResponseTextConfigParam,
    StreamOptions,
    ToolChoice,
    ToolParam,
)
from openai.types.responses.response_function_call_output_item_list_param import ResponseFunctionCallOutputItemListParam
from openai.types.responses.response_input_content_param import ResponseInputContentParam
from openai.types.responses.response_output_text_param import Annotation, Logprob
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails, ResponseUsage
from pydantic import BaseModel, ConfigDict, Field, create_model

from rollouts.engine.reply_schema import ReplyModel

__all__ = [
    "agent_result",
    "params_refusal",
    "verify_json_error",
    "verify_refusal",
    "verify_refusal_error",
    "verify_refusal_listing",
    "verify_reward",
    "as_sent",
    "function_call_output",
    "materialize",
    "materialize_item",
    "materialize_response",
    "run_record",
    "sent_input",
    "sent_item",
]

# Keys NeMo Gym's remote_agent drops from a row before it goes to the env or into a failure row
# (its ``_RESERVED_RESULT_KEYS``), and the alias its run request model reads but never writes back.
RESERVED_KEYS = frozenset(
    {"reward", "response", "error", "_ng_failure_class", "_ng_no_persist", "_ng_failure_terminal", "_ng_rollout_id"}
)

_Status = Literal["in_progress", "completed", "incomplete"]
_Phase = Optional[Literal["commentary", "final_answer"]]


class _EasyMessage(BaseModel):
    content: str | list[ResponseInputContentParam]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"
    phase: _Phase = None


class _InputMessage(BaseModel):
    content: list[ResponseInputContentParam]
    role: Literal["user", "system", "developer"]
    status: _Status = "completed"
    type: Literal["message"] = "message"


class _OutputText(BaseModel):
    annotations: list[Annotation]
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: list[Logprob] | None = None


class _Refusal(BaseModel):
    refusal: str
    type: Literal["refusal"] = "refusal"


class _OutputMessage(BaseModel):
    id: str
    content: list[_OutputText | _Refusal]
    role: Literal["assistant"] = "assistant"
    status: _Status = "completed"
    type: Literal["message"] = "message"
    phase: _Phase = None


class _FunctionCall(BaseModel):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    status: _Status | None = None
    namespace: str | None = None


class _FunctionCallOutput(BaseModel):
    call_id: str
    output: str | ResponseFunctionCallOutputItemListParam
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: _Status | None = None


class _Reasoning(BaseModel):
    id: str
    summary: list[Summary]
    type: Literal["reasoning"] = "reasoning"
    encrypted_content: str | None = None
    content: list[ReasoningContent] | None = None


class _Params(BaseModel):
    """The request's top-level fields in NeMo Gym's order; ``input`` is handled item by item."""

    background: bool | None = None
    include: list[ResponseIncludable] | None = None
    input: Any = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: Metadata | None = None
    model: ResponsesModel | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt: ResponsePromptParam | None = None
    reasoning: Reasoning | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: bool | None = None
    context_management: list[ContextManagement] | None = None
    conversation: str | ResponseConversationParamParam | None = None
    moderation: Moderation | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    text: ResponseTextConfigParam | None = None
    tool_choice: ToolChoice = "auto"
    tools: list[ToolParam] = []
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    stream: Literal[False] | None = None


_SIMPLE_ROLES = frozenset({"user", "system", "developer"})
_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_OUTPUT_PARTS = frozenset({"output_text", "refusal"})


def _first_part_type(content: Any) -> str | None:
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return None
    first = content[0]
    return first.get("type") or ("refusal" if "refusal" in first else None)


def _message_model(item: dict[str, Any]) -> type[BaseModel]:
    """Which message model NeMo Gym's input union picks: by role, content and status."""
    content = item.get("content")
    if item.get("role") in _SIMPLE_ROLES:
        return _InputMessage if isinstance(content, list) and item.get("status") in _STATUSES else _EasyMessage
    if isinstance(content, list) and (
        (content and _first_part_type(content) in _OUTPUT_PARTS) or (not content and isinstance(item.get("id"), str))
    ):
        return _OutputMessage
    return _EasyMessage


def _item_model(item: Any) -> type[BaseModel] | None:
    """The model NeMo Gym's input union gives ``item``; None for items passed through as they came."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "message":
        return _message_model(item)
    if kind is None:
        if item.get("role") is not None and isinstance(item.get("content"), (str, list)):
            return _message_model(item)
        if "arguments" in item and "name" in item and "call_id" in item:
            return _FunctionCall
        if isinstance(item.get("call_id"), str) and "output" in item:
            return _FunctionCallOutput
        if isinstance(item.get("id"), str) and isinstance(item.get("summary"), list):
            return _Reasoning
        return None
    return {"function_call": _FunctionCall, "function_call_output": _FunctionCallOutput, "reasoning": _Reasoning}.get(
        kind
    )


def _dump_item(item: Any, exclude_unset: bool) -> Any:
    model = _item_model(item)
    if model is None:
        return item
    try:
        return model.model_validate(item).model_dump(mode="json", exclude_unset=exclude_unset)
    except (ValueError, RecursionError):  # refused, or nested past pydantic's depth limit
        return item


def sent_item(item: Any) -> Any:
    """One item as NeMo Gym's remote_agent re-sends it to the agent service: only the fields given,
    in its model's order; an item it does not model, or cannot validate, as it came."""
    return _dump_item(item, exclude_unset=True)


def materialize_item(item: Any) -> Any:
    """One input item as NeMo Gym's model dumps it (every field, defaults filled); an item it does
    not model, or cannot validate, as it came."""
    return _dump_item(item, exclude_unset=False)


def _dump(params: Any, exclude_unset: bool) -> Any:
    if not isinstance(params, dict) or "input" not in params:
        return params
    try:
        model = _Params.model_validate(params)
    except (ValueError, RecursionError):  # refused, or nested past pydantic's depth limit
        return params
    out = model.model_dump(mode="json", exclude_unset=exclude_unset)
    items = params["input"]
    out["input"] = [_dump_item(i, exclude_unset) for i in items] if isinstance(items, list) else items
    for key, value in params.items():  # fields NeMo Gym's model does not know: kept, last
        if key not in out:
            out[key] = value
    return out


def materialize(params: Any) -> Any:
    """``responses_create_params`` as NeMo Gym's request model dumps it: all 30 fields in its order,
    input items materialised (``materialize_item``); unknown fields kept at the end. A value that is
    not an object with ``input``, or that NeMo Gym's model refuses, comes back unchanged."""
    return _dump(params, exclude_unset=False)


def as_sent(params: Any) -> Any:
    """``responses_create_params`` as NeMo Gym's remote_agent sends it to the agent service: only the
    fields given, in the model's order, each input item likewise. Unchanged where ``materialize`` is."""
    return _dump(params, exclude_unset=True)


def sent_input(params: Any) -> list[Any]:
    """The first ``input`` list sent to the agent: ``as_sent(params)["input"]``, a string input
    turned into one user message as NeMo Gym's remote_agent turns it (contract rule 7). Raises
    ``ValueError`` for an ``input`` that is neither a string nor a list."""
    value = as_sent(params).get("input", []) if isinstance(params, dict) else []
    if isinstance(value, str):
        return [{"content": value, "role": "user"}]
    if not isinstance(value, list):
        raise ValueError(f"responses_create_params.input must be a string or a list (got {type(value).__name__})")
    return list(value)


def run_record(row: dict[str, Any]) -> dict[str, Any]:
    """The row as NeMo Gym's remote_agent passes it on (its run request model's ``model_dump()``,
    reserved keys dropped): ``responses_create_params`` first and materialised, then the row's other
    fields in order. The body of ``/seed_session``, and of ``/verify`` with ``response`` added."""
    record: dict[str, Any] = {}
    if "responses_create_params" in row:
        record["responses_create_params"] = materialize(row["responses_create_params"])
    for key, value in row.items():
        if key not in record and key not in RESERVED_KEYS:
            record[key] = value
    return record


class _InputTokensDetails(InputTokensDetails):
    cached_tokens: int | None


class _OutputTokensDetails(OutputTokensDetails):
    reasoning_tokens: int | None


class _Usage(ResponseUsage):
    input_tokens_details: _InputTokensDetails
    output_tokens_details: _OutputTokensDetails


class _Response(_OpenAIResponse):
    """openai's ``Response`` with NeMo Gym's two changes (``NeMoGymResponse``): ``output`` items are
    materialised item by item (``materialize_item``), ``usage`` may have null detail counts."""

    output: list[Any]
    usage: _Usage | None = None


def materialize_response(response: Any) -> Any:
    """A merged response as NeMo Gym's remote_agent sends it to ``/verify`` (its ``NeMoGymResponse``
    dumped whole: every field of openai's ``Response`` in its order, output items materialised).
    A value its model refuses comes back unchanged (the loop has validated the replies already)."""
    if not isinstance(response, dict):
        return response
    try:
        out = _Response.model_validate(response).model_dump(mode="json")
    except (ValueError, RecursionError):  # refused, or nested past pydantic's depth limit
        return response
    if isinstance(response.get("output"), list):
        out["output"] = [materialize_item(i) for i in response["output"]]
    return out


class _VerifyFields(BaseModel):
    """The scalar fields of NeMo Gym's ``BaseVerifyResponse`` after ``response``, in its order."""

    reward: float
    mask_sample: bool = False
    failure_kind: Optional[str] = None
    failure_reason: Optional[str] = None


_VERIFY_FIELDS = tuple(_VerifyFields.model_fields)
# ``BaseRunRequest.capture_rollout_id`` (alias ``_ng_rollout_id``): read from the reply, never dumped.
_EXCLUDED_FIELDS = ("capture_rollout_id", "_ng_rollout_id")


def params_refusal(params: Any) -> str | None:
    """Why NeMo Gym 0.7.0's request model refuses ``responses_create_params`` (not an object, a
    field of a wrong shape such as a function tool without ``strict``, ``input`` neither a string
    nor a list), or ``None`` when it accepts them."""
    try:
        _Params.model_validate(params)
    except (ValueError, RecursionError) as exc:
        return "; ".join(f"responses_create_params.{line}" for line in _errors(exc, 5))
    if not isinstance(params.get("input"), (str, list)):
        return "responses_create_params.input: a string or a list is required"
    return None


def verify_refusal(reply: Any, check_params: bool = True) -> str | None:
    """Why NeMo Gym 0.7.0's remote_agent refuses an env's ``/verify`` reply (its
    ``RemoteAgentVerifyResponse.model_validate`` raises, and the rollout becomes a failure row), or
    ``None`` when it accepts it. Lax mode like NeMo Gym's: ``reward`` may be ``true`` or ``"0.5"``,
    ``mask_sample`` ``"yes"``. Refused: not an object, ``response`` or ``responses_create_params``
    missing or not of NeMo Gym's shape, ``reward`` missing or not a number, ``mask_sample`` not a
    bool, ``failure_kind``/``failure_reason`` not a string or null. ``check_params=False`` leaves
    the shape of ``responses_create_params`` unchecked (for a task whose own params NeMo Gym's model
    refuses: NeMo Gym would not have run it, and the env only echoes them)."""
    if not isinstance(reply, dict):
        return "the reply is not a JSON object"
    problems = [f"{key}: field required" for key in ("responses_create_params", "response") if key not in reply]
    try:
        _VerifyFields.model_validate({k: reply[k] for k in _VERIFY_FIELDS if k in reply})
    except ValueError as exc:
        problems.extend(_errors(exc))
    if "response" in reply:
        try:
            ReplyModel.model_validate(reply["response"])
        except (ValueError, RecursionError) as exc:
            problems.extend(f"response.{line}" for line in _errors(exc))
    if "responses_create_params" in reply and check_params:
        refusal = params_refusal(reply["responses_create_params"])
        if refusal:
            problems.append(refusal)
    for key in _EXCLUDED_FIELDS:
        if reply.get(key) is not None and not isinstance(reply[key], str):
            problems.append(f"{key}: must be a string")
    return "; ".join(problems[:5]) or None


def verify_reward(reply: dict[str, Any]) -> float:
    """The reward of a reply ``verify_refusal`` accepts, coerced as NeMo Gym's model coerces it
    (``true`` → 1.0, ``"0.5"`` → 0.5; ``"nan"``/``"inf"`` give non-finite floats). Raises
    ``ValueError`` for a reward that model refuses."""
    return _VerifyFields.model_validate({k: reply[k] for k in _VERIFY_FIELDS if k in reply}).reward


class NeMoGymResponse(ReplyModel):
    model_config = ConfigDict(title="NeMoGymResponse")  # the names NeMo Gym's listing gives


class NeMoGymResponseCreateParamsNonStreaming(_Params):
    model_config = ConfigDict(title="NeMoGymResponseCreateParamsNonStreaming")

    input: Union[str, list[Any]]  # required, a string or a list (checked item by item elsewhere)


class RemoteAgentVerifyResponse(BaseModel):
    """NeMo Gym 0.7.0's remote_agent model of a ``/verify`` reply (``BaseVerifyResponse``, extra
    fields allowed), composed of gymweb's own field models, so a refusal reads as pydantic's listing
    in NeMo Gym's failure row: ``N validation errors for RemoteAgentVerifyResponse`` then each
    field's path and message. Only for that text: ``verify_refusal`` decides what is refused."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    responses_create_params: Any
    capture_rollout_id: Optional[str] = Field(default=None, alias="_ng_rollout_id", exclude=True)
    response: NeMoGymResponse
    reward: float
    mask_sample: bool = False
    failure_kind: Optional[str] = None
    failure_reason: Optional[str] = None


# The same model with NeMo Gym's request model for the echoed params. Made under the same class name:
# pydantic names the class in the refusal of a reply that is not an object ("a valid dictionary or
# instance of RemoteAgentVerifyResponse").
_CheckedVerifyResponse = create_model(
    "RemoteAgentVerifyResponse",
    __base__=RemoteAgentVerifyResponse,
    responses_create_params=(NeMoGymResponseCreateParamsNonStreaming, ...),
)


def verify_refusal_listing(reply: Any, check_params: bool = True) -> str:
    """Pydantic's listing of why NeMo Gym's remote_agent refuses ``reply`` (``str`` of the
    ``ValidationError`` its ``RemoteAgentVerifyResponse.model_validate`` raises), whole as NeMo Gym
    writes it; ``verify_refusal``'s words when the composed model accepts a reply that a check outside
    it refuses (``input`` neither a string nor a list)."""
    model = _CheckedVerifyResponse if check_params else RemoteAgentVerifyResponse
    try:
        model.model_validate(reply)
    except (ValueError, RecursionError) as exc:
        return str(exc)
    return verify_refusal(reply, check_params) or ""


def verify_refusal_error(reply: Any, check_params: bool = True) -> str:
    """The ``error`` of the failure row NeMo Gym 0.7.0's remote_agent writes for a ``/verify`` reply
    its model refuses (``verify_refusal``): its ``run()`` catches the ``ValidationError`` and writes
    ``unexpected error: ValidationError: `` and the whole listing (``verify_refusal_listing``)."""
    return "unexpected error: ValidationError: " + verify_refusal_listing(reply, check_params)


def verify_json_error(body: bytes) -> str | None:
    """The ``error`` of NeMo Gym 0.7.0's failure row for a ``/verify`` reply body its JSON reader
    (``orjson.loads``) refuses: ``/verify on the resources server failed: JSONDecodeError: `` and
    orjson's message (``unexpected character, expected a JSON value: line 1 column 1 (char 0)``).
    ``None`` when orjson reads the body."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"/verify on the resources server failed: JSONDecodeError: {exc}"
    return None


def _errors(exc: BaseException, limit: int | None = None) -> list[str]:
    """The first ``limit`` (None: all) ``loc: message`` lines of a pydantic ``ValidationError``
    (the exception's text otherwise)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return [str(exc)[:300]]
    try:
        # only loc and msg are read: leave out the URL, context and input pydantic builds per error
        found = errors(include_url=False, include_context=False, include_input=False)
    except TypeError:  # an ``errors()`` that is not pydantic's
        found = errors()
    return [".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in found[:limit]]


def agent_result(reply: Any, accepted: bool | None = None) -> Any:
    """The env's ``/verify`` reply as NeMo Gym 0.7.0's remote_agent returns it from ``/run``: its
    ``RemoteAgentVerifyResponse`` (``BaseVerifyResponse`` with extra fields allowed) validated from
    the reply and dumped. ``responses_create_params`` (``materialize``), ``response``
    (``materialize_response``), ``reward`` (a float), ``mask_sample``, ``failure_kind`` and
    ``failure_reason`` (defaults ``false``/``null``/``null``), then the reply's other fields in its
    order; ``capture_rollout_id``/``_ng_rollout_id`` are not dumped. A reply that model refuses
    (``verify_refusal``) comes back unchanged. ``accepted``: whether ``verify_refusal(reply)`` is
    None, when the caller has found it already (the loop has); None: found here."""
    if accepted is None:
        accepted = verify_refusal(reply) is None
    if not accepted:
        return reply
    try:
        fields = _VerifyFields.model_validate({k: reply[k] for k in _VERIFY_FIELDS if k in reply})
    except ValueError:
        return reply
    if any(reply.get(k) is not None and not isinstance(reply.get(k), str) for k in _EXCLUDED_FIELDS):
        return reply
    params = materialize(reply["responses_create_params"])
    response = materialize_response(reply["response"])
    if not isinstance(params, dict) or not isinstance(response, dict):
        return reply
    out: dict[str, Any] = {"responses_create_params": params, "response": response}
    out.update(fields.model_dump(mode="json"))
    for key, value in reply.items():
        if key not in out and key not in _EXCLUDED_FIELDS:
            out[key] = value
    return out


def function_call_output(call_id: str, output: str) -> dict[str, Any]:
    """The ``function_call_output`` item NeMo Gym's remote_agent appends after a tool call, with its
    fields in NeMo Gym's order (as the agent receives it)."""
    return {"call_id": call_id, "output": output, "type": "function_call_output"}
