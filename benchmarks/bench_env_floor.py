"""The env's floor under ``bench_trainer``: how long NeMo Gym's counter env (served standalone, as
``bench_trainer`` serves it) takes to answer one request alone, and the last of ``n`` seeds sent at
once. Every rollout of a batch needs its seed before its first agent call, so no collector can end
a batch sooner than that burst plus the agent calls' ideal (benchmarks/README.md, "the env's floor").

usage: python -m benchmarks.bench_env_floor [--sizes 16,32] [--ngpeer DIR] [--port 19702]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.bench_trainer import PEER, _http_ok, _start, _stop, _wait


async def _seed(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(f"{url}/seed_session", json={}) as reply:
        await reply.read()


async def _measure(url: str, sizes: list[int], alone_n: int = 200, bursts: int = 40) -> None:
    """Print the median time of one seed alone, and of the last answer of each burst size (seconds)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for _ in range(20):  # warm: connections open, the env's first-call imports done
            await _seed(session, url)
        alone = []
        for _ in range(alone_n):
            t0 = time.perf_counter()
            await _seed(session, url)
            alone.append(time.perf_counter() - t0)
        print(f"one request alone: median {statistics.median(alone) * 1000:.2f} ms ({alone_n} requests)")
        for n in sizes:
            drains = []
            for _ in range(bursts):
                t0 = time.perf_counter()
                await asyncio.gather(*(_seed(session, url) for _ in range(n)))
                drains.append(time.perf_counter() - t0)
                await asyncio.sleep(0.2)  # an agent call's time: the env idles between bursts
            print(
                f"{n} seeds at once, the last answer: median {statistics.median(drains) * 1000:.1f} ms, "
                f"fastest {min(drains) * 1000:.1f} ms ({bursts} bursts)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,32", help="burst sizes, comma-separated")
    parser.add_argument("--ngpeer", default=str(Path(tempfile.gettempdir()) / "ngpeer"), help="NeMo Gym's venv")
    parser.add_argument("--port", type=int, default=19702)
    args = parser.parse_args()
    ngpeer = Path(args.ngpeer)
    ng_python = ngpeer / "venv" / "bin" / "python"
    if not ng_python.exists():
        sys.exit(f"NeMo Gym's venv is not at {ngpeer}/venv (see {PEER}/README.md)")
    log = Path(tempfile.mkdtemp(prefix="gymweb-env-floor-")) / "env.log"
    env = _start([ng_python, PEER / "serve_counter.py", "--app-dir", ngpeer / "counter", "--port", args.port], log)
    url = f"http://127.0.0.1:{args.port}"
    try:
        _wait(lambda: _http_ok(f"{url}/get_counter_value", "POST"), "the counter", [(env, log)])
        asyncio.run(_measure(url, [int(s) for s in args.sizes.split(",")]))
    finally:
        _stop(env)


if __name__ == "__main__":
    main()
