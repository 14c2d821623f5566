"""Minimal, fast agent and env for the benchmarks, so they are not the bottleneck.

The agent answers each rollout in ``--calls`` agent calls: calls 1..k-1 each ask one
``increment_counter`` (an unpaired function_call), the last returns an assistant message.
``--latency-ms`` sleeps per agent call (the latency-bound benchmark). The env seeds a session
cookie, counts, and verifies reward 1.0; ``--tool-output-kb N`` pads each tool output to about N KB
(long trajectories); ``--hostile-share 0.01 --hostile-mb 200`` answers 1% of agent calls with a
200 MB reply (``bench_faults``). Both print ``… listening on URL`` lines. Each raises its open-file limit to
the hard limit (10,000 rollouts in flight hold 10,000 connections) and listens with a 16,384
backlog (the kernel caps it at ``net.core.somaxconn``); ``--reuse-port`` lets several processes share
one port, for more connections than one process may open.

    python -m benchmarks.fast_services --calls 4 --latency-ms 0
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random

from aiohttp import web

USAGE = {
    "input_tokens": 10,
    "output_tokens": 5,
    "total_tokens": 15,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}
_ids = itertools.count()
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _reply(output):
    return {
        "id": f"r{next(_ids)}",
        "created_at": 0.0,
        "model": "fast",
        "object": "response",
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": USAGE,
    }


def make_agent(calls: int, latency_s: float, hostile_share: float = 0.0, hostile_mb: float = 0.0) -> web.Application:
    hostile = random.Random(7)

    async def oversized(request: web.Request) -> web.StreamResponse:
        """A hostile reply: ``hostile_mb`` MB of one JSON string, streamed (never held here)."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"id":"huge","output":[],"pad":"')
        chunk = b"x" * (1024 * 1024)
        try:
            for _ in range(int(hostile_mb)):
                await resp.write(chunk)
            await resp.write(b'"}')
        except (ConnectionError, RuntimeError):  # the client stopped reading: its cap
            pass
        return resp

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if hostile_share and hostile.random() < hostile_share:
            return await oversized(request)
        # Count tool results without a full parse: the benchmark is about gymweb, not this agent.
        done = body.count(b'"function_call_output"')
        if latency_s:
            await asyncio.sleep(latency_s)
        if done < calls - 1:
            n = next(_ids)
            out = [
                {"type": "function_call", "call_id": f"c{n}", "name": "increment_counter", "arguments": '{"count":1}'}
            ]
        else:
            out = [
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "m",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                }
            ]
        return web.Response(body=_dumps(_reply(out)), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    return app


def make_env(tool_output_kb: float = 0.0) -> web.Application:
    sessions: dict[str, int] = {}
    pad = "x" * int(tool_output_kb * 1024)
    ok = _dumps({"success": True, "pad": pad}).encode() if pad else b'{"success":true}'

    async def seed(request: web.Request) -> web.Response:
        await request.read()
        sid = str(next(_ids))
        sessions[sid] = 0
        resp = web.Response(body=b"{}", content_type="application/json")
        resp.headers["Set-Cookie"] = f"s={sid}; Path=/"
        return resp

    async def increment(request: web.Request) -> web.Response:
        await request.read()
        sid = request.cookies.get("s")
        sessions[sid] = sessions.get(sid, 0) + 1
        return web.Response(body=ok, content_type="application/json")

    async def verify(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        sessions.pop(request.cookies.get("s"), None)
        body["reward"] = 1.0
        return web.Response(body=_dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/seed_session", seed)
    app.router.add_post("/increment_counter", increment)
    app.router.add_post("/verify", verify)
    return app


async def _serve(app: web.Application, port: int, label: str, reuse_port: bool = False) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=16384, reuse_port=reuse_port or None)
    await site.start()
    real = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"{label} listening on http://127.0.0.1:{real}", flush=True)


def raise_fd_limit(want: int = 65536) -> int:
    """Raise this process's open-file limit to ``want`` (root may raise the hard limit too), else
    its soft limit to its hard limit. Returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))
    except (ValueError, OSError):
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--agent-port", type=int, default=0)
    parser.add_argument("--env-port", type=int, default=0)
    parser.add_argument("--only", choices=["agent", "env"], default=None)
    parser.add_argument("--tool-output-kb", type=float, default=0.0)
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="share the port with other such processes (SO_REUSEPORT): more connections than one process's open files",
    )
    parser.add_argument("--hostile-share", type=float, default=0.0, help="share of agent calls answered oversized")
    parser.add_argument("--hostile-mb", type=float, default=200.0, help="size of such an answer, MB")
    args = parser.parse_args()
    raise_fd_limit()
    if args.reuse_port:  # ids distinct across the processes sharing the port
        global _ids
        _ids = itertools.count(os.getpid() * 10**9)

    async def run() -> None:
        if args.only in (None, "env"):
            await _serve(make_env(args.tool_output_kb), args.env_port, "env", args.reuse_port)
        if args.only in (None, "agent"):
            await _serve(
                make_agent(args.calls, args.latency_ms / 1000, args.hostile_share, args.hostile_mb),
                args.agent_port,
                "agent",
                args.reuse_port,
            )
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
