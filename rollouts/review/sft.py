"""NeMo Gym rollouts → the OpenAI chat format that common fine-tuning tools read (SFT).

No Django here: ``conversation(row)`` takes one ``rollouts.jsonl`` row (a dict) and returns
``{"messages": [...], "tools": [...]}``. The conversation is the task's ``instructions`` and
``input`` followed by every item of the merged ``response.output`` (rule 9, DESIGN.md), in order.

Field mapping from Responses items (the same as NeMo Gym's own Responses→Chat Completions
converter, ``nemo_gym/responses_converter.py``, where one exists; "gymweb:" marks our choices):

=================================================  =================================================
Responses                                          chat message
=================================================  =================================================
``responses_create_params.instructions`` (text)    first ``system`` message; leading ``system`` /
                                                   ``developer`` input messages are folded into it,
                                                   joined by a blank line (NeMo Gym does the same:
                                                   chat templates admit one system message, first)
``message`` role ``user`` / ``system``             same role; content a string, or a list of parts
``message`` role ``developer``                     gymweb: ``system`` (most chat templates know no
                                                   ``developer`` role)
content part ``input_text`` / ``output_text``      ``{"type": "text", "text"}``; one text part alone
                                                   becomes a plain string
content part ``input_image``                       ``{"type": "image_url", "image_url": {url, detail}}``
``message`` role ``assistant``                     ``assistant``: ``output_text`` parts joined into
                                                   ``content``; ``refusal`` parts into ``refusal``
``function_call``                                  an entry of the assistant message's ``tool_calls``:
                                                   ``{"id": call_id, "type": "function", "function":
                                                   {"name", "arguments"}}`` (arguments stay the string
                                                   the agent wrote)
``function_call_output``                           ``{"role": "tool", "tool_call_id": call_id,
                                                   "content": output}`` (a string, or text parts)
``reasoning``                                      by ``reasoning=``: ``"keep"`` → the assistant
                                                   message's ``reasoning_content`` (the field vLLM,
                                                   DeepSeek and many Hugging Face chat templates
                                                   read); ``"think"`` → ``<think>…</think>`` before
                                                   the content (NeMo Gym's converter); ``"drop"`` →
                                                   left out. Its text: the ``content`` texts when
                                                   there are any, else the ``summary`` texts, joined
                                                   by a blank line; an encrypted-only item has none
``tools`` entry of type ``function``               ``{"type": "function", "function": {name,
                                                   description, parameters, strict}}`` (None values
                                                   dropped); gymweb: other tool types (hosted tools)
                                                   are left out of ``tools``
=================================================  =================================================

Consecutive assistant-side items (assistant messages, reasoning, function calls) make one assistant
message, as in NeMo Gym's converter; a tool, user or system message ends it. gymweb's rules for
what chat cannot say:

- a ``call_id`` repeated within one assistant message keeps its last call (the one that ran,
  rule 4);
- a function call that no later ``function_call_output`` answers is kept only in the
  conversation's last message (a rollout may end on asks: rule 10, or ``max_steps``); elsewhere
  it is dropped, and an assistant message left empty with it, since chat requires every tool call
  to be answered before the next turn;
- a ``function_call_output`` whose call was never made in this conversation, and any item of
  another type (hosted-tool items such as ``web_search_call`` or ``mcp_call``, content parts that
  are neither text nor images) make the row unconvertible: ``NotConvertible`` says which item.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Iterator, Optional

__all__ = ["REASONING_MODES", "NotConvertible", "conversation", "tools_to_chat", "convert_lines"]

REASONING_MODES = ("keep", "think", "drop")
_TEXT_PARTS = ("input_text", "output_text", "text")


class NotConvertible(ValueError):
    """A row whose trajectory has something the chat format cannot hold. ``str(exc)`` names the
    item (``"item 7 (web_search_call): no chat representation"``)."""


def _text_of_parts(parts: Any) -> list[str]:
    if isinstance(parts, str):
        return [parts]
    out = []
    for part in parts if isinstance(parts, list) else []:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


def _content(content: Any, where: str) -> Any:
    """A user/system/tool content: a string stays; a list of parts becomes chat parts, and a
    single text part a plain string."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise NotConvertible(f"{where}: content is a {type(content).__name__}, not text or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
            continue
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype in _TEXT_PARTS or (ptype is None and isinstance(part, dict) and isinstance(part.get("text"), str)):
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif ptype == "input_image":
            url = part.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            if not url:
                raise NotConvertible(f"{where}: an input_image without image_url (a file_id) has no chat representation")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": part.get("detail") or "auto"}})
        else:
            raise NotConvertible(f"{where}: content part {ptype!r} has no chat representation")
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _reasoning_text(item: dict[str, Any]) -> str:
    texts = _text_of_parts(item.get("content")) or _text_of_parts(item.get("summary"))
    return "\n\n".join(t for t in texts if t)


def tools_to_chat(tools: Any) -> list[dict[str, Any]]:
    """The request's Responses ``tools`` as chat tools (function tools only; see the module doc)."""
    out = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not tool.get("name"):
            continue
        function = {k: v for k, v in tool.items() if k not in ("type", "defer_loading") and v is not None}
        out.append({"type": "function", "function": function})
    return out


class _Assistant:
    """The assistant message being gathered from consecutive assistant-side items."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[str, dict[str, Any]] = {}  # call_id → tool call (insertion order kept)
        self.any = False

    def message(self, reasoning: str) -> Optional[dict[str, Any]]:
        if not self.any:
            return None
        content = "".join(self.content)
        if reasoning == "think" and self.reasoning:
            content = "".join(f"<think>{t}</think>" for t in self.reasoning) + content
        msg: dict[str, Any] = {"role": "assistant", "content": content if content or not self.calls else None}
        if reasoning == "keep" and self.reasoning:
            msg["reasoning_content"] = "\n\n".join(self.reasoning)
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        if self.calls:
            msg["tool_calls"] = list(self.calls.values())
        return msg


def _items(row: dict[str, Any]) -> list[Any]:
    params = row.get("responses_create_params")
    params = params if isinstance(params, dict) else {}
    first = params.get("input")
    if isinstance(first, str):
        first = [{"type": "message", "role": "user", "content": first}]
    response = row.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return list(first if isinstance(first, list) else []) + list(output if isinstance(output, list) else [])


def conversation(row: dict[str, Any], *, reasoning: str = "keep") -> dict[str, Any]:
    """One ``rollouts.jsonl`` row as ``{"messages": [...], "tools": [...]}`` (the module doc has
    the mapping). ``reasoning``: ``"keep"`` (``reasoning_content``), ``"think"`` (``<think>`` tags
    in the content) or ``"drop"``. Raises ``NotConvertible`` (item and why) and ``ValueError`` for
    an unknown ``reasoning``."""
    if reasoning not in REASONING_MODES:
        raise ValueError(f"reasoning must be one of {', '.join(REASONING_MODES)}, not {reasoning!r}")
    params = row.get("responses_create_params")
    params = params if isinstance(params, dict) else {}
    items = _items(row)
    answered = {it.get("call_id") for it in items if isinstance(it, dict) and it.get("type") == "function_call_output"}
    messages: list[dict[str, Any]] = []
    pending = _Assistant()
    made: set[str] = set()

    def flush() -> None:
        nonlocal pending
        msg = pending.message(reasoning)
        if msg is not None:
            messages.append(msg)
        pending = _Assistant()

    for n, item in enumerate(items):
        where = f"item {n}"
        if not isinstance(item, dict):
            raise NotConvertible(f"{where}: not a JSON object")
        kind = item.get("type") or ("message" if "role" in item else None)
        where = f"item {n} ({kind})"
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                pending.any = True
                content = item.get("content")
                if isinstance(content, str):
                    pending.content.append(content)
                for part in content if isinstance(content, list) else []:
                    if isinstance(part, dict) and isinstance(part.get("refusal"), str) and part.get("type") in ("refusal", None):
                        pending.refusal.append(part["refusal"])
                    elif isinstance(part, dict) and isinstance(part.get("text"), str):
                        pending.content.append(part["text"])
                    else:
                        raise NotConvertible(f"{where}: assistant content part {part!r:.80} has no chat representation")
            elif role in ("user", "system", "developer"):
                flush()
                messages.append({"role": "system" if role == "developer" else role, "content": _content(item.get("content"), where)})
            else:
                raise NotConvertible(f"{where}: message role {role!r} has no chat representation")
        elif kind == "reasoning":
            pending.any = True
            text = _reasoning_text(item)
            if text:
                pending.reasoning.append(text)
        elif kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise NotConvertible(f"{where}: no call_id")
            arguments = item.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            pending.any = True
            pending.calls.pop(call_id, None)  # a repeated call_id: the last one ran (rule 4)
            pending.calls[call_id] = {"id": call_id, "type": "function",
                                      "function": {"name": str(item.get("name") or ""), "arguments": arguments}}
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            flush()
            if call_id not in made:
                raise NotConvertible(f"{where}: answers call_id {call_id!r}, which no earlier function_call made")
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _content(output, where)})
        else:
            raise NotConvertible(f"{where}: no chat representation")
        if kind == "function_call":
            made.add(item["call_id"])
    flush()
    _drop_unanswered(messages, answered)
    _fold_instructions(messages, params.get("instructions"))
    return {"messages": messages, "tools": tools_to_chat(params.get("tools"))}


def _drop_unanswered(messages: list[dict[str, Any]], answered: set) -> None:
    """Remove unanswered tool calls except in the last message (see the module doc)."""
    last = len(messages) - 1
    keep = []
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant" and msg.get("tool_calls") and i != last:
            calls = [c for c in msg["tool_calls"] if c["id"] in answered]
            if calls:
                msg["tool_calls"] = calls
            else:
                del msg["tool_calls"]
                if msg.get("content") is None:
                    msg["content"] = ""
                if not msg["content"] and not msg.get("reasoning_content") and not msg.get("refusal"):
                    continue
        keep.append(msg)
    messages[:] = keep


def _fold_instructions(messages: list[dict[str, Any]], instructions: Any) -> None:
    """``instructions`` (a string, or a list of input items' texts) as the first system message,
    with the leading system messages folded in (NeMo Gym's converter does the same)."""
    if isinstance(instructions, list):
        instructions = "\n\n".join(t for it in instructions if isinstance(it, dict) for t in _text_of_parts(it.get("content")))
    if not isinstance(instructions, str) or not instructions:
        return
    parts = [instructions]
    while messages and messages[0]["role"] == "system":
        content = messages.pop(0)["content"]
        parts.append(content if isinstance(content, str) else "".join(_text_of_parts(content)))
    messages.insert(0, {"role": "system", "content": "\n\n".join(parts)})


def convert_lines(rows: Iterable[dict[str, Any]], *, reasoning: str = "keep",
                  skipped: Optional[list[str]] = None, where: Optional[Iterable[str]] = None) -> Iterator[str]:
    """JSON lines (no newline) of ``conversation`` for each row. A row that is not convertible is
    left out and, when ``skipped`` is a list, ``"<where>: <why>"`` is appended to it (``where``
    names each row, default ``row N``)."""
    names = iter(where) if where is not None else None
    for n, row in enumerate(rows, 1):
        name = next(names) if names is not None else f"row {n}"
        try:
            yield json.dumps(conversation(row, reasoning=reasoning), ensure_ascii=False)
        except NotConvertible as exc:
            if skipped is not None:
                skipped.append(f"{name}: {exc}")
