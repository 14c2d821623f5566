"""Awkward JSON for the lossless-storage tests, and an agent and an env that send it.

``corpus()`` is valid JSON that databases mangle: U+0000 in values and keys, every control
character, U+2028/U+2029, astral characters, gymweb's own escape character, a 1 MB string,
nesting 500 deep, huge and tiny numbers, ``-0.0``, integers past 64 bits, keys in a non-sorted
order. ``make_agent()``/``make_env()`` are aiohttp apps (run them with
``gymweb.examples._serve.BackgroundServer``) that put it everywhere a rollout can carry it: task rows, the
agent's reply items and extra fields, call ids, arguments, usage extra keys, incomplete_details,
tool outputs (a binary-looking body), verify replies, agent error bodies and /aggregate_metrics.
They answer deterministically, so a rollout run twice gives the same bytes.

Tasks are picked by the first user message: ``"task ok"`` (two steps, a success), ``"task
incomplete"`` (a reply with incomplete_details, a success), ``"task fail"`` (HTTP 500 with an awkward
body: an ``agent_http_error`` failure).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

CONTROLS = "".join(chr(c) for c in range(0x20)) + "\x7f" + "".join(chr(c) for c in range(0x80, 0xA0))
AWKWARD = "NUL>\x00< " + CONTROLS + ' \u2028\u2029 😀𝄞\U0010ffff \ufdd0\ufdd00\ufdd0 \ufeff <b>&amp;</b> \\u0000 "q"'
BIG = 1_000_000
DEPTH = 500
NUMBERS = [
    1e308,
    -1e308,
    1.7976931348623157e308,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    -0.0,
    0.0,
    1.0,
    1,
    0,
    -1,
    10**30,
    -(10**30),
    2**63,
    2**64 + 1,
    0.1,
    1e-7,
    1e16,
    123456789.123456789,
    3.141592653589793,
]


def deep(depth: int = DEPTH) -> Any:
    """Lists and objects nested ``depth`` levels, with U+0000 in the innermost key and value."""
    value: Any = {"\x00inner\x00": "\x00", "n": -0.0}
    for level in range(depth):
        value = [value] if level % 2 else {"d\x00": value}
    return value


def corpus(big: bool = True) -> dict[str, Any]:
    """The awkward JSON object; ``big=False`` leaves out the 1 MB string and the deep nesting."""
    out: dict[str, Any] = {
        "z last-sorted key first": 1,
        "\x00": "a key that is U+0000",
        "key\x00with NUL": AWKWARD,
        "": "the empty key",
        "\ufdd0": "gymweb's escape character as a key",
        "controls": CONTROLS,
        "separators": "\u2028\u2029",
        "astral": "😀𝄞\U0010ffff",
        "numbers": NUMBERS,
        "literals": [True, False, None, [], {}, ""],
        "a": {"z": 1, "a": 2, "m": -0.0},
    }
    if big:
        out["big"] = "\x00" + "x" * BIG + "\x00"
        out["deep"] = deep()
    return out


def task_rows() -> list[dict[str, Any]]:
    """Dataset rows (JSON objects) for the three tasks, awkward env fields included."""
    rows = []
    for name in ("task ok", "task incomplete", "task fail"):
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"{name} \x00 {AWKWARD}"}],
                    "tools": [
                        {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}
                    ],
                },
                "env \x00 field": corpus(big=False),
                "expected": -0.0,
            }
        )
    return rows


def dataset_text() -> str:
    """The dataset as JSONL text (one row per line)."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in task_rows())


def _message(text: str, id: str = "msg_1", **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
        **extra,
    }


def _usage(**extra: Any) -> dict[str, Any]:
    return {
        "input_tokens": 7,
        "output_tokens": 3,
        "total_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 1},
        **extra,
    }


def _reply(items: list[dict[str, Any]], id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": id,
        "created_at": 1700000000.0,
        "model": "corpus\x00model",
        "object": "response",
        "output": items,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _usage(),
        **extra,
    }


def agent_reply(body: dict[str, Any]) -> tuple[int, Any]:
    """``(status, reply)`` for one ``/v1/responses`` request (deterministic)."""
    items = body.get("input") or []
    first = items[0]["content"] if items and isinstance(items[0].get("content"), str) else ""
    outputs = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
    if first.startswith("task fail"):
        return 500, "Internal Server Error \x00 " + AWKWARD
    if first.startswith("task incomplete"):
        return 200, _reply(
            [
                _message("cut \x00 short " + AWKWARD),
                {"type": "function_call", "call_id": "never\x00run", "name": "read_file", "arguments": "{}"},
            ],
            id="resp_incomplete\x00",
            incomplete_details={"reason": "max_output_tokens", "x\x00": NUMBERS, "deep": deep(50)},
        )
    if outputs == 0:
        return 200, _reply(
            [
                {
                    "type": "reasoning",
                    "id": "rs\x00",
                    "summary": [{"type": "summary_text", "text": "thinks \x00 " + AWKWARD}],
                },
                {
                    "type": "function_call",
                    "call_id": "call\x00A",
                    "name": "read_file",
                    "arguments": json.dumps({"path": "/bin/ls\x00", "corpus": corpus(big=False)}, ensure_ascii=False),
                },
                {"type": "function_call", "call_id": "call\x00B", "name": "bad\x00name", "arguments": "{}"},
                {"type": "function_call", "call_id": "own\x00", "name": "mine", "arguments": '{"a": "\\u0000"}'},
                {"type": "function_call_output", "call_id": "own\x00", "output": "agent's own \x00 output"},
            ],
            id="resp_1\x00",
            x_corpus=corpus(big=False),
            usage=_usage(cost=-0.0, note="\x00", big=10**30),
        )
    return 200, _reply([_message("done \x00 " + AWKWARD, x_big=corpus(big=True))], id="resp_2")


def tool_output() -> bytes:
    """What ``read_file`` answers: a binary file's start (``ELF``, U+0000, control bytes) and more."""
    return b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00>\x00 " + AWKWARD.encode("utf-8")


def verify_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The env's /verify reply: the row echoed (as NeMo Gym's envs do), a reward and extra fields."""
    return {**body, "reward": 1.0, "\x00verify key": corpus(big=False), "details": {"nums": NUMBERS, "deep": deep(60)}}


def aggregate_reply() -> dict[str, Any]:
    return {
        "group_level_metrics": [],
        "agent_metrics": {"mean/reward": -0.0, "\x00": AWKWARD},
        "key_metrics": {"n": 10**30},
    }


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data, ensure_ascii=False).encode(), status=status, content_type="application/json"
    )


def make_agent() -> web.Application:
    async def responses(request: web.Request) -> web.Response:
        status, data = agent_reply(json.loads(await request.read()))
        if status != 200:
            return web.Response(body=data.encode(), status=status, content_type="text/plain")
        return _json(data)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/responses", responses)
    return app


def make_env() -> web.Application:
    async def seed(request: web.Request) -> web.Response:
        return _json({})

    async def read_file(request: web.Request) -> web.Response:
        return web.Response(body=tool_output(), content_type="application/octet-stream")

    async def verify(request: web.Request) -> web.Response:
        return _json(verify_reply(json.loads(await request.read())))

    async def aggregate(request: web.Request) -> web.Response:
        return _json(aggregate_reply())

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/seed_session", seed)
    app.router.add_post("/read_file", read_file)
    app.router.add_post("/verify", verify)
    app.router.add_post("/aggregate_metrics", aggregate)
    return app
