"""Misbehaving agent services for the conformance check's tests (``rollouts.evaluation.conformance``).

Each bad agent is the example counter agent (``gymweb.examples.counter_agent``: it solves the counter
tasks and answers anything else with a message) with ONE breach of the contract added, so a test
can show that exactly that breach is found and nothing else. They run on 127.0.0.1:<free port>
through ``gymweb.examples._serve.BackgroundServer``:

    with serve("undeclared_tool") as agent:
        report = check_agent_sync(agent.url, policy=LOCAL)

``BAD_AGENTS`` maps a name to a twist ``(reply, params, n) -> dict | web.Response`` (sync or async):
``reply`` is the good agent's Responses object for the request ``params``, ``n`` the 0-based call
number; the twist returns the (mutated) object to send as JSON, or a whole response.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gymweb.examples import counter_agent as good
from gymweb.examples._serve import BackgroundServer, read_json

Twist = Callable[[dict, dict, int], Any]

SLOW_DELAY_S = 0.4
REQUESTS = web.AppKey("requests", list)


def _asks(reply: dict) -> list[dict]:
    return [i for i in reply["output"] if i.get("type") == "function_call"]


def ask(name: str, arguments: str = "{}", call_id: str = "call_bad_1") -> dict:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def _redirect(reply, params, n):
    return web.Response(status=307, headers={"Location": "http://127.0.0.1:1/elsewhere/v1/responses"})


def _server_error(reply, params, n):
    return web.Response(status=500, text="Traceback (most recent call last):\n  KeyError: 'input'")


def _html(reply, params, n):
    return web.Response(text="<html><body><h1>Welcome to nginx!</h1></body></html>", content_type="text/html")


def _json_list(reply, params, n):
    return web.json_response([reply])


def _missing_fields(reply, params, n):
    for key in ("id", "created_at", "model"):
        reply.pop(key)
    return reply


def _bad_item(reply, params, n):
    # arguments as an object (must be a string) and no call_id; plus an item of an unknown type
    reply["output"] = [
        {"type": "function_call", "name": "increment_counter", "arguments": {"count": 1}},
        {"type": "thought", "text": "hmm"},
    ]
    return reply


def _partial_usage(reply, params, n):
    reply["usage"] = {"input_tokens": 10, "output_tokens": 5}
    return reply


def _no_usage(reply, params, n):
    del reply["usage"]
    return reply


def _null_usage(reply, params, n):
    reply["usage"] = None
    return reply


def _undeclared_tool(reply, params, n):
    reply["output"] = [ask("delete_everything", "{}", f"call_undeclared_{n}")]
    return reply


def _duplicate_call_ids(reply, params, n):
    asks = _asks(reply)
    if len(asks) >= 2:
        for item in asks:
            item["call_id"] = "call_same"
    return reply


def _orphan_output(reply, params, n):
    reply["output"].append({"type": "function_call_output", "call_id": "call_never_made", "output": "42"})
    return reply


def _bad_arguments(reply, params, n):
    for item in _asks(reply):
        item["arguments"] = "{count: 1"
    return reply


def _unsafe_tool_name(reply, params, n):
    reply["output"] = [ask("../seed_session", "{}", f"call_unsafe_{n}")]
    return reply


def _reserved_tool_name(reply, params, n):
    reply["output"] = [ask("verify", "{}", f"call_reserved_{n}")]
    return reply


def _repeated_call_id(reply, params, n):
    earlier = [
        i["call_id"] for i in params.get("input") or [] if isinstance(i, dict) and i.get("type") == "function_call"
    ]
    for item in _asks(reply):
        if earlier:
            item["call_id"] = earlier[0]
    return reply


def _no_progress(reply, params, n):
    reply["output"] = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "still thinking"}]}
    ]
    return reply


async def _slow(reply, params, n):
    await asyncio.sleep(SLOW_DELAY_S)
    return reply


def _sets_cookie(reply, params, n):
    response = web.json_response(reply)
    response.set_cookie("agent_state", f"call{n}")
    return response


BAD_AGENTS: dict[str, Twist] = {
    "redirect": _redirect,
    "server_error": _server_error,
    "html": _html,
    "json_list": _json_list,
    "missing_fields": _missing_fields,
    "bad_item": _bad_item,
    "partial_usage": _partial_usage,
    "no_usage": _no_usage,
    "null_usage": _null_usage,
    "undeclared_tool": _undeclared_tool,
    "duplicate_call_ids": _duplicate_call_ids,
    "orphan_output": _orphan_output,
    "bad_arguments": _bad_arguments,
    "unsafe_tool_name": _unsafe_tool_name,
    "reserved_tool_name": _reserved_tool_name,
    "repeated_call_id": _repeated_call_id,
    "no_progress": _no_progress,
    "slow": _slow,
    "sets_cookie": _sets_cookie,
}


def make_bad_agent(twist: Twist) -> web.Application:
    """The counter agent's ``/v1/responses`` with ``twist`` applied to every reply. Records the
    requests it received (``app[REQUESTS]``: list of ``(cookie header, body dict)``)."""
    requests: list[tuple[str, Any]] = []

    async def responses(request: web.Request) -> web.StreamResponse:
        params, error = await read_json(request)
        requests.append((request.headers.get("Cookie", ""), params))
        if error or not isinstance(params, dict):
            return web.json_response({"error": {"message": error or "not an object"}}, status=400)
        items = good.as_items(params.get("input"))
        output = good.decide(items)
        usage = good.estimate_usage(len(json.dumps(params)), items, output)
        reply = good.response_object(params, output, usage, "bad-agent")
        result = twist(reply, params, len(requests) - 1)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)

    app = web.Application()
    app[REQUESTS] = requests
    app.router.add_post("/v1/responses", responses)
    return app


def serve(name: str) -> BackgroundServer:
    """A ``BackgroundServer`` (use it with ``with``) for the bad agent ``name`` of ``BAD_AGENTS``."""
    return BackgroundServer(make_bad_agent(BAD_AGENTS[name]))
