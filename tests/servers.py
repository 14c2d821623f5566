"""Real local servers for the contract tests of ``rollouts.engine.loop`` (DESIGN.md, "Contract rules").

Everything binds to 127.0.0.1 on an ephemeral port and records what it received, so a test can
prove what the loop sent and, just as important, what it never sent:

- ``AgentService``: a scriptable ``POST /v1/responses`` service (aiohttp.web). Each call is
  answered by the next entry of its script (the last entry repeats): a reply dict (200 JSON), a
  ``Reply`` (any status, body, headers, delay) or a callable ``(request, n) -> dict | Reply``.
- ``EnvService``: a recording NeMo Gym-style resources server: ``/seed_session``, tools, ``/verify``;
  any other path answers 404 like a real env, and is recorded too.
- ``RawServer``: a bare asyncio socket server that drops or resets the first connections (or all of
  them) and can then answer with a canned HTTP/1.1 response; counts connections.
- ``free_url()``: an address where nothing listens (connection refused).

Plus reply builders (``reply``, ``message``, ``call``, ``call_output``, ``reasoning``, ``usage``),
a ``RecordingObserver`` and ``drive()`` that runs one rollout through a fresh ``make_client``.
Tests are plain sync functions; ``@async_test`` runs an ``async def`` test with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from aiohttp import web
from multidict import CIMultiDict

from rollouts.engine.http import make_client
from rollouts.engine.loop import LoopSettings, run_rollout
from rollouts.engine.targets import DEFAULT_MAX_REPLY_BYTES, TargetPolicy

# The tests' services run on 127.0.0.1: engine-level clients get this policy (local targets allowed).
LOCAL = TargetPolicy(allow_local=True)

_MISSING = object()


def async_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run an ``async def`` test body with ``asyncio.run`` (no pytest-asyncio in this project)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), timeout=20))

    return wrapper


# -- what a server received ---------------------------------------------------------------------
@dataclass
class Recorded:
    """One HTTP request as a test server saw it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def cookie_header(self) -> str | None:
        return self.headers.get("cookie")

    @property
    def cookies(self) -> dict[str, str]:
        """The request's ``Cookie`` header as ``{name: value}`` (empty when there is none)."""
        out: dict[str, str] = {}
        for part in (self.cookie_header or "").split(";"):
            name, eq, value = part.strip().partition("=")
            if eq:
                out[name] = value
        return out


@dataclass
class Reply:
    """How a test server answers one request. ``headers`` is a list of pairs (Set-Cookie may repeat)."""

    status: int = 200
    json: Any = _MISSING
    text: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    delay: float = 0.0
    raw: bytes | None = None  # the exact body bytes, when neither json nor text fits

    def body(self) -> tuple[bytes, str]:
        if self.raw is not None:
            return self.raw, "application/octet-stream"
        if self.json is not _MISSING:
            return json.dumps(self.json).encode(), "application/json"
        return (self.text or "").encode(), "text/plain"


Handler = Union[dict, list, Reply, Callable[..., Any]]


async def _resolve(handler: Handler, *args: Any) -> Reply:
    value = handler(*args) if callable(handler) else handler
    if inspect.isawaitable(value):
        value = await value
    if isinstance(value, Reply):
        return value
    return Reply(json=value)


class _Service:
    """An aiohttp.web app on 127.0.0.1:0 that records every request (any method, any path)."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rec = Recorded(
            method=request.method,
            path=request.raw_path.split("?", 1)[0],
            query=request.query_string,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(),
        )
        self.requests.append(rec)
        answer = await self.answer(rec)
        if answer.delay:
            await asyncio.sleep(answer.delay)
        body, content_type = answer.body()
        headers = CIMultiDict(answer.headers)
        headers.setdefault("Content-Type", content_type)
        return web.Response(status=answer.status, body=body, headers=headers)

    async def answer(self, rec: Recorded) -> Reply:  # pragma: no cover - overridden
        raise NotImplementedError

    async def __aenter__(self) -> _Service:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class AgentService(_Service):
    """A scripted agent: call n (0-based) is answered by ``script[n]`` (the last entry repeats).

    An entry is a reply dict, a ``Reply``, or a callable ``(request: Recorded, n: int)`` returning
    either (sync or async). Any path other than ``/v1/responses`` answers 404.
    """

    def __init__(self, *script: Handler) -> None:
        super().__init__()
        self.script = list(script)

    @property
    def calls(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == "/v1/responses"]

    async def answer(self, rec: Recorded) -> Reply:
        if rec.path != "/v1/responses" or rec.method != "POST":
            return Reply(404, text="404: Not Found")
        n = len(self.calls) - 1
        if not self.script:
            return Reply(500, text="the test gave this agent no script")
        entry = self.script[min(n, len(self.script) - 1)]
        if callable(entry):
            return await _resolve(entry, rec, n)
        return await _resolve(entry)


def default_verify(rec: Recorded) -> dict:
    return {**(rec.json or {}), "reward": 1.0}


def echo_verify(drop: tuple[str, ...] = (), **fields: Any) -> Callable[[Recorded], dict]:
    """A ``/verify`` handler answering as NeMo Gym's envs do: the request body echoed (without the
    keys in ``drop``) with ``fields`` set (``reward`` among them, any JSON value)."""

    def handler(rec: Recorded) -> dict:
        body = {k: v for k, v in (rec.json or {}).items() if k not in drop}
        return {**body, **fields}

    return handler


class EnvService(_Service):
    """A recording resources server.

    ``tools``: name → handler (dict, ``Reply`` or callable ``(request)``); ``seed`` and ``verify``
    handlers likewise (defaults: ``{}`` and the request body plus ``reward: 1.0``, like NeMo Gym's
    envs which echo the row back). Any other path answers ``404: Not Found`` (aiohttp's own text).
    """

    def __init__(self, tools: dict[str, Handler] | None = None, *, seed: Handler = None, verify: Handler = None):
        super().__init__()
        self.tools = dict(tools or {})
        self.seed = seed if seed is not None else {}
        self.verify = verify if verify is not None else default_verify

    def at(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path == path]

    @property
    def tool_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path not in ("/seed_session", "/verify")]

    @property
    def verify_body(self) -> dict:
        (rec,) = self.at("/verify")
        return rec.json

    async def answer(self, rec: Recorded) -> Reply:
        name = rec.path[1:]
        if name == "seed_session":
            return await _resolve(self.seed, rec)
        if name == "verify":
            return await _resolve(self.verify, rec)
        if name in self.tools:
            return await _resolve(self.tools[name], rec)
        return Reply(404, text="404: Not Found")


# -- a bare socket server for transport failures ------------------------------------------------
class RawServer:
    """A TCP server that misbehaves below HTTP (rule 11).

    The first ``fail_first`` connections (all of them when None) are dropped: ``mode="drop"`` reads
    the request and closes without a byte of reply; ``mode="reset"`` reads it and resets the
    connection (RST); ``mode="accept_close"`` closes right after accepting; ``mode="garbage"`` reads
    it and answers bytes that are not HTTP. Later connections get
    ``respond(path, body) -> (status, json_body)`` as an HTTP/1.1 reply (``Connection: close``), or
    are dropped when ``respond`` returns None.
    """

    def __init__(
        self,
        mode: str = "drop",
        fail_first: int | None = None,
        respond: Callable[[str, bytes], tuple[int, Any] | None] | None = None,
    ) -> None:
        self.mode = mode
        self.fail_first = fail_first
        self.respond = respond
        self.connections = 0
        self.paths: list[str] = []
        self.url = ""
        self._server: asyncio.base_events.Server | None = None

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else ""
        length = 0
        for line in lines[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        return path, body

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = self.connections
        self.connections += 1
        sock = writer.get_extra_info("socket")
        try:
            failing = self.fail_first is None or n < self.fail_first
            if failing and self.mode == "accept_close":
                writer.close()
                return
            path, body = await self._read_request(reader)
            self.paths.append(path)
            answer = None if failing or self.respond is None else self.respond(path, body)
            if answer is None:
                if self.mode == "garbage":
                    writer.write(b"HELLO, THIS IS NOT HTTP\r\n\r\n")
                    await writer.drain()
                if self.mode == "reset" and sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.close()
                return
            status, payload = answer
            data = json.dumps(payload).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
            writer.close()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            writer.close()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()


def free_url() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens: connecting is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- reply builders -----------------------------------------------------------------------------
def usage(input_tokens: int = 10, output_tokens: int = 5, cached: int = 0, reasoning_tokens: int = 0) -> dict:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def message(text: str = "done", id: str = "msg_1") -> dict:
    return {
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(name: str, arguments: Any = None, call_id: str = "call_1", **extra: Any) -> dict:
    """A ``function_call`` item; ``arguments`` given as a non-string is JSON-encoded."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, **extra}


def call_output(call_id: str = "call_1", output: Any = "ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def reasoning(text: str = "thinking", id: str = "rs_1") -> dict:
    return {"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": text}]}


def reply(*items: dict, id: str = "resp_1", model: str = "test-model", use: Any = _MISSING, **extra: Any) -> dict:
    """A valid Responses API object with ``items`` as its output (``use``: the usage; default a
    complete usage of 10+5 tokens; pass None for ``usage: null``)."""
    out = {
        "id": id,
        "created_at": 1700000000.0,
        "model": model,
        "object": "response",
        "output": list(items),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage() if use is _MISSING else use,
    }
    out.update(extra)
    return out


COUNTER_TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_counter_value",
        "parameters": {"type": "object", "properties": {}},
        "strict": True,
    },
]


def task_row(input: Any = None, **extra: Any) -> dict:
    """A task row like NeMo Gym's counter dataset: ``responses_create_params`` plus env fields."""
    row = {
        "responses_create_params": {
            "input": input if input is not None else [{"role": "user", "content": "add 1 then get the count"}],
            "tools": COUNTER_TOOLS,
            "parallel_tool_calls": True,
        },
        "expected_count": 1,
        "verifier_metadata": {"answer_key": "SECRET-ANSWER-KEY"},
    }
    row.update(extra)
    return row


# -- running the loop ---------------------------------------------------------------------------
class RecordingObserver:
    """Keeps every callback in order: ``("seeded", ms)``, ``("step", StepRecord, items)``,
    ``("items", items)``."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_seeded(self, latency_ms: float) -> None:
        self.events.append(("seeded", latency_ms))

    def on_step(self, step: Any, items: list) -> None:
        self.events.append(("step", step, list(items)))

    def on_items(self, items: list) -> None:
        self.events.append(("items", list(items)))

    @property
    def steps(self) -> list:
        return [e[1] for e in self.events if e[0] == "step"]

    @property
    def items(self) -> list:
        """Every ItemRecord, in the order the observer received them."""
        out = []
        for e in self.events:
            if e[0] == "step":
                out.extend(e[2])
            elif e[0] == "items":
                out.extend(e[1])
        return out


def settings(agent_url: str, env_url: str, **overrides: Any) -> LoopSettings:
    """LoopSettings for tests: short pauses and bounds so failures show fast."""
    values: dict[str, Any] = dict(
        agent_base_url=agent_url,
        env_base_url=env_url,
        retry_pause_s=0.01,
        remote_responses_timeout_s=5.0,
        run_timeout_s=10.0,
    )
    values.update(overrides)
    return LoopSettings(**values)


async def drive(
    agent: Any,
    env: Any,
    row: dict | None = None,
    observer: Any = None,
    *,
    policy: TargetPolicy = LOCAL,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    reply_budget_bytes: int | None = None,
    **overrides: Any,
):
    """Run one rollout of ``row`` (default ``task_row()``) against ``agent`` and ``env`` (servers or
    URLs) through a fresh shared client with the target ``policy`` (default: local targets allowed)
    and reply cap; returns the ``RolloutOutcome``."""
    agent_url = agent if isinstance(agent, str) else agent.url
    env_url = env if isinstance(env, str) else env.url
    client = make_client(4, policy=policy, max_reply_bytes=max_reply_bytes, reply_budget_bytes=reply_budget_bytes)
    try:
        return await run_rollout(
            client, row if row is not None else task_row(), settings(agent_url, env_url, **overrides), observer
        )
    finally:
        await client.aclose()
