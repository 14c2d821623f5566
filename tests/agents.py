"""Agents for the durability tests: the example counter agent, slowed down, counted and broken on purpose."""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from aiohttp import web

from examples import counter_agent
from examples._serve import add_fallback_routes

TOOLS = json.loads((Path(__file__).resolve().parents[1] / "examples" / "data" / "counter_tasks.jsonl").read_text().splitlines()[0])[
    "responses_create_params"
]["tools"]


def counter_tasks(path: Path, n: int) -> Path:
    """Write ``n`` distinct counter tasks ("add a then add b then get the count") to ``path``."""
    with path.open("w") as fh:
        for i in range(n):
            a, b, start = i % 97 + 1, i // 97 + 1, i % 13
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": f"add {a} then add {b} then get the count"}], "tools": TOOLS},
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


def make_app(stats: Stats, latency_s: float = 0.0, faulty: bool = False, slow_s: float = 2.0) -> web.Application:
    """The counter agent behind a wrapper that counts concurrency and, when ``faulty``, breaks the
    first call of some rollouts (see ``pick_fault``) while ``stats.round`` is 1."""

    async def responses(request: web.Request) -> web.StreamResponse:
        stats.requests += 1
        stats.inflight += 1
        stats.max_inflight = max(stats.max_inflight, stats.inflight)
        try:
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
    app[counter_agent.LATENCY_KEY] = 0.0
    app.router.add_post("/v1/responses", responses)
    add_fallback_routes(app)
    return app
