"""A scripted example agent service: `POST /v1/responses` that solves the counter tasks.

Contract (NeMo Gym's /v1/responses, as docs/DESIGN.md describes it): each call receives the task's
`responses_create_params` with `input` grown by the agent's own earlier output items and one
`function_call_output` per executed tool call; each reply is one Responses API object.

For "add X then add Y [then add Z ...] then get the count" it answers over three calls:

1. no tool results yet       -> one unpaired `function_call` ask `increment_counter {"count": X}`
                                per number (arguments a JSON *string*, call ids `call_<hex>`);
2. the increments were run   -> one ask `get_counter_value {}`;
3. the count came back       -> a final assistant message "The count is N." (N parsed from the
                                last `get_counter_value` output, e.g. '{"count":6}').

The plan is derived from `input` alone (stateless), so any number of replicas can serve. Still,
to show per-rollout state through cookies, the first call of a rollout sets `agent_session=<id>`
and the service counts calls per id; the reply header `X-Agent-Call` carries that count (1, 2, 3
when the caller echoes the cookie; always 1 when it does not) and `X-Agent-Cookies` the names of
the cookies the request carried (so a test can see that no env cookie reached the agent).

A task that also says "reset the counter" gets, after the increments, one ask `reset_counter {}`
(a tool the example env does not serve: the demo's lesson in a tool that answers an error); when
its output is not `{"success": true}` the reply is a final message naming the error, and no count.
Any other word ("subtract 1", "double it") is not understood and left out of the plan, so the
answer is wrong and the env's reward 0 (the demo's lesson in a wrong answer).

A task that says "report partial usage" gets replies whose `usage` holds only `input_tokens`: an
invalid Responses object (the demo's lesson in a terminal failure, which no retry can fix).

A task it cannot parse, an `input` with no user message, or a tool output it cannot read gets a
final assistant message saying so (never an error status). `input` given as a string is read as
one user message. A body that is not a JSON object is HTTP 400 `{"error": {...}}`.

Every reply has `id, created_at (float seconds), model, object: "response", output, status,
parallel_tool_calls, tool_choice, tools, usage` with full usage (`input_tokens, output_tokens,
total_tokens, input_tokens_details.cached_tokens, output_tokens_details.reasoning_tokens`),
estimated at ~4 characters per token.

Run:  python -m gymweb.examples.counter_agent --host 127.0.0.1 --port 9102 [--latency-ms 50 | 500-1500]
      (prints "counter agent listening on http://127.0.0.1:9102" when ready)
      (a range MIN-MAX sleeps a uniformly drawn time per call, like a model's varying latency)
In-process: `make_app(latency_ms=0)` returns the aiohttp Application.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import secrets
import time
from typing import Any

from aiohttp import web

from gymweb.examples._serve import add_fallback_routes, json_response, read_json, serve_forever

COOKIE_NAME = "agent_session"
CALL_HEADER = "X-Agent-Call"
COOKIES_HEADER = "X-Agent-Cookies"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9102
DEFAULT_MODEL = "counter-agent"
MAX_TRACKED_SESSIONS = 100_000  # call counters kept; the oldest are forgotten past this

_ADD = re.compile(r"\badd\s+(-?\d+)", re.IGNORECASE)
_GET = re.compile(r"\bget\s+the\s+count\b", re.IGNORECASE)
_RESET = re.compile(r"\breset\s+the\s+counter\b", re.IGNORECASE)
_PARTIAL_USAGE = re.compile(r"\breport\s+partial\s+usage\b", re.IGNORECASE)
_COUNT = re.compile(r'"count"\s*:\s*(-?\d+)')

CALLS_KEY = web.AppKey("agent_calls", dict)
LATENCY_KEY = web.AppKey("agent_latency_s", tuple)

_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def new_id(prefix: str) -> str:
    """A random id like `call_3f9a...` (24 hex digits), unique enough for call and item ids."""
    return f"{prefix}_{secrets.token_hex(12)}"


def as_items(value: Any) -> list[Any]:
    """`input` as a list of items: a string becomes one user message (contract rule 7)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return value
    return []


def message_text(item: dict[str, Any]) -> str:
    """The text of a message item: `content` as a string, or the texts of its content parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text") or "" for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def assistant_message(text: str) -> dict[str, Any]:
    """A final assistant `message` output item with one `output_text` part."""
    return {
        "type": "message",
        "role": "assistant",
        "id": new_id("msg"),
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An unpaired `function_call` ask; `arguments` is serialised to a JSON string."""
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": new_id("call"),
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def output_text(output: Any) -> str:
    """A `function_call_output`'s `output` as text (it may be a string or a list of content parts)."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return " ".join(p.get("text") or "" for p in output if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if output is None else json.dumps(output)


def user_texts(items: list[Any]) -> list[str]:
    """The texts of the user messages among `items`, in order."""
    return [
        message_text(item)
        for item in items
        if isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") == "user"
    ]


def decide(items: list[Any]) -> list[dict[str, Any]]:
    """The next output items for a conversation (see the module docstring for the plan)."""
    texts = user_texts(items)
    task = texts[0] if texts else ""
    numbers = [int(n) for n in _ADD.findall(task)]
    if not numbers or not _GET.search(task):
        shown = task[:200] if task else "(no user message)"
        return [
            assistant_message(
                f"I cannot parse this task: {shown!r}. I only solve tasks like 'add 1 then add 2 then get the count'."
            )
        ]

    calls = {}  # call_id -> name, of this agent's own earlier asks
    outputs = {}  # call_id -> output text
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            calls[item.get("call_id")] = item.get("name")
        elif kind == "function_call_output":
            outputs[item.get("call_id")] = output_text(item.get("output"))

    get_calls = [cid for cid, name in calls.items() if name == "get_counter_value"]
    if "increment_counter" not in calls.values():
        return [function_call("increment_counter", {"count": n}) for n in numbers]
    if _RESET.search(task):
        resets = [cid for cid, name in calls.items() if name == "reset_counter"]
        if not resets:
            return [function_call("reset_counter", {})]
        reset_output = outputs.get(resets[-1], "")
        if '"success":true' not in reset_output.replace(" ", ""):
            return [
                assistant_message(
                    f"The reset_counter tool answered an error ({reset_output[:200]!r}), so I cannot finish the task."
                )
            ]
    if not get_calls:
        return [function_call("get_counter_value", {})]
    answered = [cid for cid in get_calls if cid in outputs]
    if not answered:
        return [assistant_message("I asked for get_counter_value but no result came back.")]
    last = outputs[answered[-1]]
    match = _COUNT.search(last)
    if match is None:
        return [assistant_message(f"I could not read the count from the tool result: {last[:200]!r}")]
    return [assistant_message(f"The count is {int(match.group(1))}.")]


def _is_agent_item(item: Any) -> bool:
    return isinstance(item, dict) and (
        item.get("type") in ("function_call", "reasoning") or item.get("role") == "assistant"
    )


def estimate_usage(body_bytes: int, items: list[Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    """Plausible full usage at ~4 characters per token.

    input_tokens ~ the request body; cached_tokens ~ the conversation before this agent's latest
    output items (what a provider's prompt cache would have seen on the previous call).
    """
    input_tokens = max(1, body_bytes // 4)
    agent_positions = [i for i, item in enumerate(items) if _is_agent_item(item)]
    cached = 0
    if agent_positions:
        start = agent_positions[-1]
        while start > 0 and _is_agent_item(items[start - 1]):
            start -= 1  # back to the first item of the agent's latest batch
        cached = min(input_tokens, len(_compact(items[:start])) // 4)
    output_tokens = max(1, len(_compact(output)) // 4)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    params: dict[str, Any], output: list[dict[str, Any]], usage: dict[str, Any] | None, default_model: str
) -> dict[str, Any]:
    """A complete Responses API object around `output`, echoing the request's model/tools/tool_choice."""
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": time.time(),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": params.get("model") or default_model,
        "output": output,
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": params.get("tools") if isinstance(params.get("tools"), list) else [],
        "usage": usage,
    }


def bad_request(message: str) -> web.Response:
    """HTTP 400 with an OpenAI-style error body `{"error": {"message", "type"}}`."""
    return json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=400)


def track_call(request: web.Request, response: web.Response) -> None:
    """Count this call under the caller's `agent_session` cookie (setting one on a first call) and
    report the count in `X-Agent-Call` and the request's cookie names in `X-Agent-Cookies`."""
    calls: dict[str, int] = request.app[CALLS_KEY]
    cookies = request.cookies
    sid = cookies.get(COOKIE_NAME)
    if sid not in calls:
        sid = secrets.token_hex(16)
        calls[sid] = 0
        if len(calls) > MAX_TRACKED_SESSIONS:
            del calls[next(iter(calls))]
        response.headers["Set-Cookie"] = f"{COOKIE_NAME}={sid}; HttpOnly; Path=/; SameSite=lax"
    calls[sid] += 1
    response.headers[CALL_HEADER] = str(calls[sid])
    response.headers[COOKIES_HEADER] = ",".join(sorted(cookies))


async def responses(request: web.Request) -> web.Response:
    """POST /v1/responses: one step of the counter plan (see module docstring)."""
    # The request is read before the model "thinks", as a real agent does: a caller that gives up
    # meanwhile (a cancelled run) then costs a reply nobody reads, not a reset read and a traceback.
    params, error = await read_json(request)
    low, high = request.app[LATENCY_KEY]
    latency = random.uniform(low, high) if high > low else low
    if latency > 0:
        await asyncio.sleep(latency)
    if error:
        return bad_request(error)
    if not isinstance(params, dict):
        return bad_request("the request body must be a JSON object (responses_create_params)")
    items = as_items(params.get("input"))
    output = decide(items)
    usage = estimate_usage(len(await request.read()), items, output)  # read() is cached
    if any(_PARTIAL_USAGE.search(text) for text in user_texts(items)):
        usage = {"input_tokens": usage["input_tokens"]}  # on purpose: a partial usage object
    reply = json_response(response_object(params, output, usage, DEFAULT_MODEL))
    track_call(request, reply)
    return reply


def parse_latency_ms(text: str) -> tuple[float, float]:
    """`"50"` -> (50.0, 50.0); `"500-1500"` -> (500.0, 1500.0) milliseconds. Raises ValueError on
    anything else (a negative number, or MIN above MAX)."""
    low_text, _, high_text = text.strip().partition("-")
    low = float(low_text)
    high = float(high_text) if high_text else low
    if low < 0 or high < low:
        raise ValueError(f"latency {text!r}: give milliseconds, e.g. 50 or 500-1500 (MIN-MAX)")
    return low, high


def make_app(latency_ms: float | tuple[float, float] = 0) -> web.Application:
    """The counter agent as an aiohttp Application; `latency_ms` (milliseconds, or a (MIN, MAX)
    range drawn from uniformly per call) is slept on every call."""
    app = web.Application()
    app[CALLS_KEY] = {}
    low, high = latency_ms if isinstance(latency_ms, tuple) else (latency_ms, latency_ms)
    app[LATENCY_KEY] = (max(0.0, low / 1000.0), max(0.0, high / 1000.0))
    app.router.add_post("/v1/responses", responses)
    add_fallback_routes(app)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Scripted counter agent (POST /v1/responses)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument(
        "--latency-ms",
        type=parse_latency_ms,
        default=(0.0, 0.0),
        help="sleep this long on every call: milliseconds, or MIN-MAX drawn per call (e.g. 500-1500)",
    )
    args = parser.parse_args(argv)
    serve_forever(make_app(args.latency_ms), args.host, args.port, "counter agent")


if __name__ == "__main__":
    main()
