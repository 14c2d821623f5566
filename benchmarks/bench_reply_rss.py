"""A worker's memory across a spike of hostile agent replies, and whether it comes back down.

    python -m benchmarks.bench_reply_rss [--calls 3000] [--concurrency 64] [--hostile-share 0.01]
        [--hostile-mb 200] [--port 19211] [--quiet-s 10]

The agent (``fast_services``, its own process) answers ``--hostile-share`` of the calls with
``--hostile-mb`` MB streamed without a length, the rest with a small reply. One event loop in a
thread of this process (as a worker's dispatcher) sends ``--calls`` calls, ``--concurrency`` at a
time, through the engine's client (``engine.http.make_client``: the 64 MB per-reply cap and the
512 MiB budget of the settings' defaults) and parses each small reply as the loop does. Then small
calls only, for ``--quiet-s`` seconds (the run goes on), then idle. RSS (``/proc/self/status``)
and glibc's own figures (``mallinfo2``: bytes in use, free but kept, in mmapped chunks) are sampled
before, at the peak, at the end of the spike, after the quiet phase and after 5 s idle.
``--no-trim`` turns off the budget's ``malloc_trim`` after a spike; ``--mmap-threshold-kb N`` fixes
glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``, which also stops its dynamic rise) before
anything is read: the two ways of giving freed memory back, compared. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import threading
import time

MB = 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def malloc_mb() -> dict[str, float]:
    """glibc's heap: in use (``uordblks``), free but kept (``fordblks``), mmapped (``hblkhd``), MB."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "in_use": round(info.uordblks / MB),
        "free_kept": round(info.fordblks / MB),
        "mmapped": round(info.hblkhd / MB),
    }


def snapshot() -> dict[str, float]:
    return {"rss": round(rss_mb()), **malloc_mb()}


async def drive(url: str, calls: int, concurrency: int, until: float | None, stats: dict) -> None:
    import orjson

    from rollouts.engine.http import make_client
    from rollouts.engine.targets import ReplyTooLarge, TargetPolicy

    client = make_client(concurrency, TargetPolicy(allow_local=True), 64 * MB, 512 * MB)
    body = orjson.dumps({"input": [{"role": "user", "content": "add 1"}], "tools": []})
    left = iter(range(calls)) if until is None else None

    async def one() -> None:
        held: list = []  # a refusal lives on with its rollout's failure until the row is written
        while True:
            if left is not None and next(left, None) is None:
                return
            if until is not None and time.monotonic() >= until:
                return
            try:
                reply = await client.post_bytes(url, body, {"content-type": "application/json"})
                orjson.loads(reply.content)
                stats["ok"] += 1
                held.clear()
            except ReplyTooLarge as exc:  # the cap or the budget: the reply's own failure
                stats["refused"] += 1
                held[:] = [exc]

    try:
        await asyncio.gather(*(one() for _ in range(concurrency)))
    finally:
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--hostile-share", type=float, default=0.01)
    ap.add_argument("--hostile-mb", type=float, default=200)
    ap.add_argument("--port", type=int, default=19211)
    ap.add_argument("--quiet-s", type=float, default=10.0)
    ap.add_argument("--no-trim", action="store_true")
    ap.add_argument("--mmap-threshold-kb", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, os.getcwd())
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.fast_services",
            "--only",
            "agent",
            "--agent-port",
            str(args.port),
            "--hostile-share",
            str(args.hostile_share),
            "--hostile-mb",
            str(args.hostile_mb),
            "--calls",
            "1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        agent.stdout.readline()  # "... listening on URL"
        url = f"http://127.0.0.1:{args.port}/v1/responses"
        out: dict = {"calls": args.calls, "concurrency": args.concurrency, "hostile_mb": args.hostile_mb}
        stats = {"ok": 0, "refused": 0}
        peak = {"rss": 0.0}
        done = threading.Event()

        def worker() -> None:  # the dispatcher's thread
            if args.no_trim:
                from rollouts.engine import budget

                budget.TRIM_AFTER_BYTES = 1 << 62
            if args.mmap_threshold_kb:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                libc.mallopt(-3, args.mmap_threshold_kb * 1024)  # M_MMAP_THRESHOLD
            asyncio.run(drive(url, 50, 8, None, {"ok": 0, "refused": 0}))  # warm up: small replies only
            out["before"] = snapshot()
            phase["t"] = time.monotonic()
            asyncio.run(drive(url, args.calls, args.concurrency, None, stats))
            out["spike_s"] = round(time.monotonic() - phase["t"], 1)
            out["end_of_spike"] = snapshot()
            quiet = dict(stats)
            asyncio.run(drive(url, 0, 8, time.monotonic() + args.quiet_s, quiet))  # the run goes on
            out["after_quiet"] = snapshot()
            time.sleep(5)
            out["after_idle_5s"] = snapshot()
            done.set()

        phase: dict = {}
        thread = threading.Thread(target=worker, name="gymweb-dispatcher")
        thread.start()
        while not done.wait(0.05):
            if "t" in phase:
                now = rss_mb()
                if now > peak["rss"]:
                    peak = {"rss": now, **malloc_mb()}
        thread.join()
        out["peak"] = {k: round(v) for k, v in peak.items()}
        out.update(stats)
        out["load"] = os.getloadavg()[0]
        out["trim"] = not args.no_trim
        out["mmap_threshold_kb"] = args.mmap_threshold_kb or "dynamic"
        print(json.dumps(out))
    finally:
        agent.terminate()
        agent.wait()


if __name__ == "__main__":
    main()
