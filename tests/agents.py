"""Agents for the durability tests: the example counter agent, slowed down, counted and broken on purpose."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from pathlib import Path

from aiohttp import web

from gymweb.examples import counter_agent
from gymweb.examples._serve import add_fallback_routes

TOOLS = json.loads(
    (Path(__file__).resolve().parents[1] / "gymweb" / "examples" / "data" / "counter_tasks.jsonl")
    .read_text()
    .splitlines()[0]
)["responses_create_params"]["tools"]


def counter_tasks(path: Path, n: int) -> Path:
    """Write ``n`` distinct counter tasks ("add a then add b then get the count") to ``path``."""
    with path.open("w") as fh:
        for i in range(n):
            a, b, start = i % 97 + 1, i // 97 + 1, i % 13
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"add {a} then add {b} then get the count"}],
                    "tools": TOOLS,
                },
                "initial_count": start,
                "expected_count": start + a + b,
                "case": i,
            }
            fh.write(json.dumps(row) + "\n")
    return path


class Stats:
    """What the agent saw: requests, the most it ever had in flight at once, faults it injected."""

    def __init__(self):
        self.inflight = 0
        self.max_inflight = 0
        self.requests = 0
        self.faults: dict[str, list[str]] = {}
        self.round = 1


class Gate:
    """Holds the agent's replies until the test lets them through: every task's (``open``) or
    chosen tasks' (``let_through``), a task named by the text of its user message (``task_text``).
    ``held`` is how many calls it is holding now, by task text. Thread-safe: the agent serves in
    its own thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open = False
        self._through: set[str] = set()
        self._held: dict[str, int] = {}

    def open(self) -> None:
        with self._lock:
            self._open = True

    def let_through(self, texts) -> None:
        with self._lock:
            self._through |= set(texts)

    def passes(self, text: str) -> bool:
        with self._lock:
            return self._open or text in self._through

    def held(self) -> dict[str, int]:
        with self._lock:
            return {t: n for t, n in self._held.items() if n}

    async def wait(self, text: str) -> None:
        """Return once calls of the task ``text`` may be answered."""
        with self._lock:
            self._held[text] = self._held.get(text, 0) + 1
        try:
            while not self.passes(text):
                await asyncio.sleep(0.02)
        finally:
            with self._lock:
                self._held[text] -= 1


def task_text(row: dict) -> str:
    """The user message of a counter task row (what ``Gate`` names a task by)."""
    return row["responses_create_params"]["input"][0]["content"]


FAULTS = (("http_500", 0.10), ("slow", 0.05), ("invalid", 0.05), ("drop", 0.05))


def pick_fault(text: str, round_: int) -> str | None:
    """Deterministic per (task text, round): about 10% 500, 5% slow, 5% invalid, 5% dropped."""
    roll = int(hashlib.sha256(f"{round_}:{text}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    edge = 0.0
    for name, share in FAULTS:
        edge += share
        if roll < edge:
            return name
    return None


def make_app(
    stats: Stats, latency_s: float = 0.0, faulty: bool = False, slow_s: float = 2.0, gate: Gate | None = None
) -> web.Application:
    """The counter agent behind a wrapper that counts concurrency and, when ``faulty``, breaks the
    first call of some rollouts (see ``pick_fault``) while ``stats.round`` is 1. With ``gate``,
    each call waits until the gate lets its task through."""

    async def responses(request: web.Request) -> web.StreamResponse:
        stats.requests += 1
        stats.inflight += 1
        stats.max_inflight = max(stats.max_inflight, stats.inflight)
        try:
            if gate is not None:
                body = await request.json()
                await gate.wait(body["input"][0]["content"])
            if latency_s:
                await asyncio.sleep(latency_s)
            if faulty and stats.round == 1 and counter_agent.COOKIE_NAME not in request.cookies:
                body = await request.json()
                text = body["input"][0]["content"]
                fault = pick_fault(text, stats.round)
                if fault:
                    stats.faults.setdefault(fault, []).append(text)
                if fault == "http_500":
                    return web.Response(status=500, text="injected failure")
                if fault == "slow":
                    await asyncio.sleep(slow_s)
                elif fault == "invalid":
                    return web.json_response({"this is": "not a Responses API object"})
                elif fault == "drop":
                    request.transport.abort()  # hang up before any reply
                    raise asyncio.CancelledError
            return await counter_agent.responses(request)
        finally:
            stats.inflight -= 1

    app = web.Application()
    app[counter_agent.CALLS_KEY] = {}
    app[counter_agent.LATENCY_KEY] = (0.0, 0.0)
    app.router.add_post("/v1/responses", responses)
    add_fallback_routes(app)
    return app
