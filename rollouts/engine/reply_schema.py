"""What a valid ``/v1/responses`` reply is, on the ``openai`` package's Responses types.

The rule is NeMo Gym 0.7.0's ``NeMoGymResponse`` (``nemo_gym/openai_utils.py``): openai-python's
``Response`` whose ``output`` items are the SDK's output items *plus* the request-side message and
``function_call_output`` shapes (a local agent returns its whole transcript), routed to one model
by a discriminator, and whose ``usage`` is absent, ``null`` or complete with nullable detail counts.
Validation is pydantic's default (lax) mode; unknown extra fields are tolerated. Token counts are
plain integers (NeMo Gym accepts negative ones; storage decides what fits its columns).

Same verdict as NeMo Gym for every reply in ``tests/data/reply_corpus.jsonl`` (recorded from the real
``NeMoGymResponse`` by ``scripts/record_reply_corpus.py``). No Django here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from openai.types.responses import (
    Response,
    ResponseApplyPatchToolCall,
    ResponseApplyPatchToolCallOutput,
    ResponseCodeInterpreterToolCall,
    ResponseCompactionItem,
    ResponseComputerToolCall,
    ResponseComputerToolCallOutputItem,
    ResponseCustomToolCall,
    ResponseCustomToolCallOutputItem,
    ResponseFileSearchToolCall,
    ResponseFunctionShellToolCall,
    ResponseFunctionShellToolCallOutput,
    ResponseFunctionToolCallOutputItem,
    ResponseFunctionWebSearch,
    ResponseToolSearchCall,
    ResponseToolSearchOutputItem,
)
from openai.types.responses.response_function_call_output_item_list_param import (
    ResponseFunctionCallOutputItemListParam,
)
from openai.types.responses.response_input_content_param import ResponseInputContentParam
from openai.types.responses.response_output_item import (
    AdditionalTools,
    ImageGenerationCall,
    LocalShellCall,
    LocalShellCallOutput,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
)
from openai.types.responses.response_output_text_param import Annotation, Logprob
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails, ResponseUsage
from pydantic import BaseModel, BeforeValidator, Discriminator, Field, Tag
from typing_extensions import Required, TypedDict

__all__ = ["ITEM_TAGS", "ReplyModel", "ReplyUsage", "OutputItem"]

_STATUSES = ("in_progress", "completed", "incomplete")
Status = Literal["in_progress", "completed", "incomplete"]
Phase = Optional[Literal["commentary", "final_answer"]]


# -- token metadata a training agent may attach to an item -----------------------------------------
class _TokenMetadata(BaseModel):
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    # Per-token routed experts: nested ints or an opaque string envelope.
    routed_experts: Optional[Union[str, list[list[list[int]]]]] = None


_TOKEN_REQUIRED = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_TOKEN_FIELDS = _TOKEN_REQUIRED + ("routed_experts",)


def _token_metadata_whole(value: Any) -> Any:
    """An item with any token field must carry the three required ones, each well typed."""
    if isinstance(value, dict):
        present = [name for name in _TOKEN_FIELDS if name in value]
        if present:
            missing = sorted(set(_TOKEN_REQUIRED) - set(present))
            if missing:
                raise ValueError(f"Token metadata must include all required fields; missing: {', '.join(missing)}")
            _TokenMetadata.model_validate({name: value[name] for name in present})
    return value


def _typed(value: Any) -> Any:
    if isinstance(value, dict) and "type" not in value:
        raise ValueError("Responses API output items must include a type discriminator")
    return value


# -- message and call shapes (the SDK's own are TypedDicts or too strict for replayed transcripts) ---
class _VideoPart(TypedDict, total=False):
    type: Required[Literal["input_video"]]
    video_url: Union[str, dict[str, Any]]
    video: Union[str, dict[str, Any]]


def _video_source(value: Any) -> Any:
    """An ``input_video`` part names exactly one non-empty source."""
    if isinstance(value, dict) and value.get("type") == "input_video":
        keys = [key for key in ("video_url", "video") if key in value]
        if len(keys) != 1:
            raise ValueError("input_video requires exactly one of video_url or video")
        source = value[keys[0]]
        url = source.get("url") if isinstance(source, dict) else source
        if not isinstance(url, str) or not url.strip():
            raise ValueError(f"input_video.{keys[0]} must contain a non-empty URL")
    return value


InputPart = Annotated[Union[ResponseInputContentParam, _VideoPart], BeforeValidator(_video_source)]


class OutputText(BaseModel):
    annotations: list[Annotation]
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: Optional[list[Logprob]] = None


class OutputRefusal(BaseModel):
    refusal: str
    type: Literal["refusal"] = "refusal"


class OutputMessage(BaseModel):
    """An assistant message as a model returns it."""

    id: str
    content: list[Union[OutputText, OutputRefusal]]
    role: Literal["assistant"] = "assistant"
    status: Status = "completed"
    type: Literal["message"] = "message"
    phase: Phase = None


class EasyMessage(BaseModel):
    """A message of any role whose content is a string or a list of input parts."""

    content: Union[str, list[InputPart]]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"
    phase: Phase = None


class InputMessage(BaseModel):
    """A non-assistant message with input parts and an item status."""

    content: list[InputPart]
    role: Literal["user", "system", "developer"]
    status: Status = "completed"
    type: Literal["message"] = "message"


class FunctionCall(BaseModel):
    arguments: str  # a JSON *string*, as the Responses API sends it
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: Optional[str] = None
    status: Optional[Status] = None
    namespace: Optional[str] = None


class FunctionCallResult(BaseModel):
    """A ``function_call_output`` in its request shape (no id or status needed)."""

    call_id: str
    output: Union[str, ResponseFunctionCallOutputItemListParam]
    type: Literal["function_call_output"] = "function_call_output"
    id: Optional[str] = None
    status: Optional[Status] = None


class Reasoning(BaseModel):
    id: str
    summary: list[Summary]
    type: Literal["reasoning"] = "reasoning"
    encrypted_content: Optional[str] = None
    content: Optional[list[ReasoningContent]] = None


# Hosted MCP items: endpoints may omit the id and server label, and send any status or tool entry.
class McpCallItem(McpCall):
    type: Literal["mcp_call"] = "mcp_call"
    id: Optional[str] = None
    server_label: Optional[str] = None
    status: Optional[str] = None


class McpListToolsItem(McpListTools):
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    tools: list[Any] = Field(default_factory=list)
    id: Optional[str] = None
    server_label: Optional[str] = None


class McpApprovalRequestItem(McpApprovalRequest):
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: Optional[str] = None
    server_label: Optional[str] = None


def _trained(base: type[BaseModel]) -> type[BaseModel]:
    """``base`` that also carries a training agent's token ids and log-probs."""
    return type(f"{base.__name__}WithTokens", (base, _TokenMetadata), {"__module__": __name__})


# Tag -> model. Items of the SDK's output union keep the SDK's model; the request-side shapes sit
# beside them; "+tokens" marks the variants picked when an item carries all token fields.
_MODELS: dict[str, type[BaseModel]] = {
    "output_message": OutputMessage,
    "easy_message": EasyMessage,
    "input_message": InputMessage,
    "function_call": FunctionCall,
    "function_call_output": ResponseFunctionToolCallOutputItem,
    "function_call_output_input": FunctionCallResult,
    "reasoning": Reasoning,
    "mcp_call": McpCallItem,
    "mcp_list_tools": McpListToolsItem,
    "mcp_approval_request": McpApprovalRequestItem,
    "mcp_approval_response": McpApprovalResponse,
    "file_search_call": ResponseFileSearchToolCall,
    "web_search_call": ResponseFunctionWebSearch,
    "computer_call": ResponseComputerToolCall,
    "computer_call_output": ResponseComputerToolCallOutputItem,
    "image_generation_call": ImageGenerationCall,
    "code_interpreter_call": ResponseCodeInterpreterToolCall,
    "local_shell_call": LocalShellCall,
    "local_shell_call_output": LocalShellCallOutput,
    "custom_tool_call": ResponseCustomToolCall,
    "custom_tool_call_output": ResponseCustomToolCallOutputItem,
    "apply_patch_call": ResponseApplyPatchToolCall,
    "apply_patch_call_output": ResponseApplyPatchToolCallOutput,
    "compaction": ResponseCompactionItem,
    "shell_call": ResponseFunctionShellToolCall,
    "shell_call_output": ResponseFunctionShellToolCallOutput,
    "tool_search_call": ResponseToolSearchCall,
    "tool_search_output": ResponseToolSearchOutputItem,
    "additional_tools": AdditionalTools,
}
_WITH_TOKENS = ("output_message", "easy_message", "input_message", "function_call", "reasoning")
for _tag in _WITH_TOKENS:
    _MODELS[_tag + "+tokens"] = _trained(_MODELS[_tag])
_TAG_OF_CLASS = {model: tag for tag, model in _MODELS.items()}
ITEM_TAGS = frozenset(_MODELS)  # the labels pydantic puts into an output item's error location


def _message_tag(item: dict[str, Any]) -> str:
    """Which message model fits: by role, content shape, status and id."""
    content = item.get("content")
    if item.get("role") in ("user", "system", "developer"):
        return "input_message" if isinstance(content, list) and item.get("status") in _STATUSES else "easy_message"
    if isinstance(content, list):
        if not content:
            return "output_message" if isinstance(item.get("id"), str) else "easy_message"
        first = content[0]
        kind = (
            (first.get("type") or ("refusal" if "refusal" in first else None))
            if isinstance(first, dict)
            else getattr(first, "type", None)
        )
        if kind in ("output_text", "refusal"):
            return "output_message"
    return "easy_message"


def _item_tag(item: Any) -> Optional[str]:
    """The union tag of one output item, or None (no model fits: a validation error)."""
    if not isinstance(item, dict):
        for cls in type(item).__mro__:
            if cls in _TAG_OF_CLASS:
                return _TAG_OF_CLASS[cls]
        return getattr(item, "type", None)
    kind = item.get("type")
    if kind == "message":
        tag = _message_tag(item)
    elif kind == "function_call_output":
        # The SDK's output item also needs an id and a status; without them, the request shape.
        complete = isinstance(item.get("id"), str) and item.get("status") in _STATUSES
        tag = "function_call_output" if complete else "function_call_output_input"
    elif isinstance(kind, str):
        tag = kind
    else:
        return None
    if tag in _WITH_TOKENS and all(name in item for name in _TOKEN_REQUIRED):
        tag += "+tokens"
    return tag


OutputItem = Annotated[
    Union[tuple(Annotated[model, Tag(tag)] for tag, model in _MODELS.items())],  # type: ignore[misc]
    Discriminator(_item_tag),
    BeforeValidator(_token_metadata_whole),
    BeforeValidator(_typed),
]


class _InputDetails(InputTokensDetails):
    cached_tokens: Optional[int]  # required but nullable: null = unknown


class _OutputDetails(OutputTokensDetails):
    reasoning_tokens: Optional[int]


class ReplyUsage(ResponseUsage):
    """Complete token usage of one reply (partial usage is invalid). Units: tokens."""

    input_tokens_details: _InputDetails
    output_tokens_details: _OutputDetails


class ReplyModel(Response):
    """A valid Responses API object from the agent service (contract rule 3, DESIGN.md)."""

    output: list[OutputItem]
    usage: Optional[ReplyUsage] = None
