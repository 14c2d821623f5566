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
- a function call that no tool message right after its assistant message answers is dropped (also
  at the end: a rollout may end on asks, rule 10, or ``max_steps``), and an assistant message left
  empty with it; turns of one role left side by side are joined;
- thinking spans inside assistant text (``<think>…</think>``, read by ``rollouts.thinking``, the
  spans the trajectory page folds) are reasoning too: ``keep`` moves them to
  ``reasoning_content``, ``drop`` removes them, ``think`` leaves them in the content;
- user messages after the last assistant or tool message are left out (a user simulator's closing
  line teaches nothing);
- the result must be a valid chat example (``_check_valid``): one system message at most, first;
  user and assistant turns alternating; every tool call answered by the tool messages right after
  it; at least one assistant turn. A row that is not is not convertible;
- a ``function_call_output`` whose call was never made in this conversation, and any item of
  another type (hosted-tool items such as ``web_search_call`` or ``mcp_call``, content parts that
  are neither text nor images) make the row unconvertible: ``NotConvertible`` says which item,
  and its ``reason`` the kind of fault exports count (``left_out_text``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from rollouts.thinking import split_thinking

__all__ = ["REASONING_MODES", "NotConvertible", "conversation", "tools_to_chat", "convert_lines", "left_out_text"]

REASONING_MODES = ("keep", "think", "drop")
_TEXT_PARTS = ("input_text", "output_text", "text")


class NotConvertible(ValueError):
    """A row that cannot be made a valid chat example. ``str(exc)`` names the item (``"item 7
    (web_search_call): no chat representation"``); ``reason`` is the short kind of fault that
    exports count rows by (``"no assistant turn"``)."""

    def __init__(self, message: str, reason: str = "an item chat cannot hold"):
        super().__init__(message)
        self.reason = reason


def left_out_text(reasons: Counter) -> str:
    """``"3 rollouts left out: no assistant turn; 1 rollout left out: …"`` for counted reasons
    (most first); ``""`` for none."""
    return "; ".join(f"{n:,} rollout{'' if n == 1 else 's'} left out: {why}" for why, n in reasons.most_common())


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
                raise NotConvertible(
                    f"{where}: an input_image without image_url (a file_id) has no chat representation"
                )
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

    def message(self, reasoning: str) -> dict[str, Any] | None:
        if not self.any:
            return None
        content = "".join(self.content)
        if reasoning != "think":
            content = self._take_thinking(content)
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

    def _take_thinking(self, content: str) -> str:
        """``content`` without its thinking spans (``rollouts.thinking``: what the trajectory page
        folds as thinking); the spans join the message's reasoning."""
        segments = split_thinking(content)
        if not any(thinking for thinking, _ in segments):
            return content
        for thinking, text in segments:
            if thinking and text.strip():
                self.reasoning.append(text.strip("\n"))
        return "".join(text for thinking, text in segments if not thinking).strip()


def _items(row: dict[str, Any]) -> list[Any]:
    params = row.get("responses_create_params")
    params = params if isinstance(params, dict) else {}
    first = params.get("input")
    if isinstance(first, str):
        first = [{"type": "message", "role": "user", "content": first}]
    response = row.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return list(first if isinstance(first, list) else []) + list(output if isinstance(output, list) else [])


class _Chat:
    """The chat messages gathered from a row's items, in order (``add`` one item at a time, then
    ``flush``)."""

    def __init__(self, reasoning: str) -> None:
        self.reasoning = reasoning
        self.messages: list[dict[str, Any]] = []
        self.pending = _Assistant()
        self.made: set[str] = set()  # call_ids of the function calls seen so far

    def flush(self) -> None:
        msg = self.pending.message(self.reasoning)
        if msg is not None:
            self.messages.append(msg)
        self.pending = _Assistant()

    def add(self, n: int, item: Any) -> None:
        where = f"item {n}"
        if not isinstance(item, dict):
            raise NotConvertible(f"{where}: not a JSON object")
        kind = item.get("type") or ("message" if "role" in item else None)
        where = f"item {n} ({kind})"
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            self.pending.any = True
            text = _reasoning_text(item)
            if text:
                self.pending.reasoning.append(text)
        elif kind == "function_call":
            self._function_call(item, where)
        elif kind == "function_call_output":
            self._function_call_output(item, where)
        else:
            raise NotConvertible(f"{where}: no chat representation")

    def _message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role == "assistant":
            self._assistant_content(item.get("content"), where)
        elif role in ("user", "system", "developer"):
            self.flush()
            self.messages.append(
                {"role": "system" if role == "developer" else role, "content": _content(item.get("content"), where)}
            )
        else:
            raise NotConvertible(f"{where}: message role {role!r} has no chat representation")

    def _assistant_content(self, content: Any, where: str) -> None:
        pending = self.pending
        pending.any = True
        if isinstance(content, str):
            pending.content.append(content)
        for part in content if isinstance(content, list) else []:
            if (
                isinstance(part, dict)
                and isinstance(part.get("refusal"), str)
                and part.get("type") in ("refusal", None)
            ):
                pending.refusal.append(part["refusal"])
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                pending.content.append(part["text"])
            else:
                raise NotConvertible(f"{where}: assistant content part {part!r:.80} has no chat representation")

    def _function_call(self, item: dict[str, Any], where: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise NotConvertible(f"{where}: no call_id")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        self.pending.any = True
        self.pending.calls.pop(call_id, None)  # a repeated call_id: the last one ran (rule 4)
        self.pending.calls[call_id] = {
            "id": call_id,
            "type": "function",
            "function": {"name": str(item.get("name") or ""), "arguments": arguments},
        }
        self.made.add(call_id)

    def _function_call_output(self, item: dict[str, Any], where: str) -> None:
        call_id = item.get("call_id")
        self.flush()
        if call_id not in self.made:
            raise NotConvertible(
                f"{where}: answers call_id {call_id!r}, which no earlier function_call made",
                "a tool output without its call",
            )
        output = item.get("output")
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": _content(output, where)})


def conversation(row: dict[str, Any], *, reasoning: str = "keep") -> dict[str, Any]:
    """One ``rollouts.jsonl`` row as ``{"messages": [...], "tools": [...]}`` (the module doc has
    the mapping). ``reasoning``: ``"keep"`` (``reasoning_content``), ``"think"`` (``<think>`` tags
    in the content) or ``"drop"``. Raises ``NotConvertible`` (item and why) and ``ValueError`` for
    an unknown ``reasoning``."""
    if reasoning not in REASONING_MODES:
        raise ValueError(f"reasoning must be one of {', '.join(REASONING_MODES)}, not {reasoning!r}")
    params = row.get("responses_create_params")
    params = params if isinstance(params, dict) else {}
    chat = _Chat(reasoning)
    for n, item in enumerate(_items(row)):
        chat.add(n, item)
    chat.flush()
    messages = chat.messages
    _drop_unanswered(messages)
    _merge_turns(messages)
    while messages and messages[-1]["role"] == "user":
        messages.pop()  # a user turn after the last answer teaches nothing
    _fold_instructions(messages, params.get("instructions"))
    _check_valid(messages)
    return {"messages": messages, "tools": tools_to_chat(params.get("tools"))}


def _empty(msg: dict[str, Any]) -> bool:
    return (
        not msg.get("content")
        and not msg.get("tool_calls")
        and not msg.get("reasoning_content")
        and not msg.get("refusal")
    )


def _drop_unanswered(messages: list[dict[str, Any]]) -> None:
    """Remove tool calls that no tool message right after their assistant message answers (see
    the module doc), and assistant messages left empty by it."""
    keep = []
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            answered = set()
            for later in messages[i + 1 :]:
                if later["role"] != "tool":
                    break
                answered.add(later["tool_call_id"])
            calls = [c for c in msg["tool_calls"] if c["id"] in answered]
            if calls:
                msg["tool_calls"] = calls
            else:
                del msg["tool_calls"]
                if msg.get("content") is None:
                    msg["content"] = ""
                if _empty(msg):
                    continue
        keep.append(msg)
    messages[:] = keep


def _merge_turns(messages: list[dict[str, Any]]) -> None:
    """Join consecutive user messages, and consecutive assistant messages whose first has no tool
    calls, into one (dropping unanswered calls can leave two turns of one role side by side)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        prev = out[-1] if out else None
        if prev is not None and prev["role"] == msg["role"] == "user":
            prev["content"] = _join_content(prev["content"], msg["content"])
            continue
        if prev is not None and prev["role"] == msg["role"] == "assistant" and not prev.get("tool_calls"):
            prev["content"] = "\n\n".join(t for t in (prev.get("content"), msg.get("content")) if t) or (
                None if msg.get("tool_calls") else ""
            )
            for key in ("reasoning_content", "refusal"):
                joined = "\n\n".join(t for t in (prev.get(key), msg.get(key)) if t)
                if joined:
                    prev[key] = joined
            if msg.get("tool_calls"):
                prev["tool_calls"] = msg["tool_calls"]
            continue
        out.append(msg)
    messages[:] = out


def _join_content(a: Any, b: Any) -> Any:
    if isinstance(a, str) and isinstance(b, str):
        return "\n\n".join(t for t in (a, b) if t)

    def parts(c: Any) -> list:
        return [{"type": "text", "text": c}] if isinstance(c, str) else list(c)

    return parts(a) + parts(b)


def _check_valid(messages: list[dict[str, Any]]) -> None:
    """Raise ``NotConvertible`` unless ``messages`` is a valid chat example: at most one system
    message, first; user and assistant turns alternating (tool messages after the assistant message
    whose calls they answer, each call answered); at least one assistant turn."""
    if not any(m["role"] == "assistant" for m in messages):
        raise NotConvertible("the conversation has no assistant turn", "no assistant turn")
    open_calls: set = set()
    prev = ""
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "system" and i:
            raise NotConvertible(
                f"message {i}: a system message after the conversation started", "a system message mid-conversation"
            )
        if role == "tool":
            if msg["tool_call_id"] not in open_calls:
                raise NotConvertible(
                    f"message {i}: a tool message that answers no call of the assistant turn before it",
                    "a tool output without its call",
                )
            open_calls.discard(msg["tool_call_id"])
        elif open_calls:  # _drop_unanswered leaves none: a guard for what it cannot fix
            raise NotConvertible(
                f"message {i}: tool calls {sorted(open_calls)} are not answered before it", "an unanswered tool call"
            )
        elif role == prev and role in ("user", "assistant"):
            raise NotConvertible(f"message {i}: two {role} turns in a row", f"two {role} turns in a row")
        if role == "assistant":
            open_calls = {c["id"] for c in msg.get("tool_calls") or ()}
        if role != "tool":
            prev = role
        elif not open_calls:
            prev = "tool"


def _fold_instructions(messages: list[dict[str, Any]], instructions: Any) -> None:
    """``instructions`` (a string, or a list of input items' texts) as the first system message,
    with the leading system messages folded in (NeMo Gym's converter does the same)."""
    if isinstance(instructions, list):
        instructions = "\n\n".join(
            t for it in instructions if isinstance(it, dict) for t in _text_of_parts(it.get("content"))
        )
    if not isinstance(instructions, str) or not instructions:
        return
    parts = [instructions]
    while messages and messages[0]["role"] == "system":
        content = messages.pop(0)["content"]
        parts.append(content if isinstance(content, str) else "".join(_text_of_parts(content)))
    messages.insert(0, {"role": "system", "content": "\n\n".join(parts)})


def convert_lines(
    rows: Iterable[dict[str, Any]],
    *,
    reasoning: str = "keep",
    skipped: list[str] | None = None,
    where: Iterable[str] | None = None,
    left_out: Counter | None = None,
) -> Iterator[str]:
    """JSON lines (no newline) of ``conversation`` for each row. A row that is not convertible is
    left out and, when ``skipped`` is a list, ``"<where>: <why>"`` is appended to it (``where``
    names each row, default ``row N``); ``left_out`` counts them by ``NotConvertible.reason``."""
    names = iter(where) if where is not None else None
    for n, row in enumerate(rows, 1):
        name = next(names) if names is not None else f"row {n}"
        try:
            yield json.dumps(conversation(row, reasoning=reasoning), ensure_ascii=False)
        except NotConvertible as exc:
            if skipped is not None:
                skipped.append(f"{name}: {exc}")
            if left_out is not None:
                left_out[exc.reason] += 1
