"""Benchmark 2, latency-bound efficiency: the agent sleeps L ms per call; N rollouts × calls agent
calls at concurrency C. Ideal wall time = ceil(N / C) × calls × L. Prints measured / ideal, measured
from the first agent request to the last reply (from the stored agent-call timings).

    python -m benchmarks.bench_latency [--rollouts 1000] [--calls 4] [--concurrency 50] [--latency-ms 200] [--db sqlite|postgres]

Target: ratio ≤ 1.10 on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import argparse
import math
import time

from benchmarks import _harness as h


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()

    where = h.setup_django(args.db)
    from django.db.models import Min

    from rollouts.models import AgentCall, Rollout
    from rollouts.workers.process import run_in_process

    agent_url, env_url, procs = h.start_services(args.calls, args.latency_ms)
    try:
        run = h.make_run(args.rollouts, agent_url, env_url, args.concurrency)
        t0 = time.perf_counter()
        run_in_process(run.pk)
        wall = time.perf_counter() - t0
    finally:
        h.stop(procs)
    calls = AgentCall.objects.filter(rollout__run=run)
    first = calls.aggregate(Min("started"))["started__min"]
    # The last reply: the latest start plus its latency (latency is stored per call, in ms).
    last_end = max(
        c.started.timestamp() + c.latency_ms / 1000 for c in calls.order_by("-started")[: args.concurrency * 2]
    )
    measured = last_end - first.timestamp()
    ideal = math.ceil(args.rollouts / args.concurrency) * args.calls * args.latency_ms / 1000
    ok = Rollout.objects.filter(run=run, status="succeeded").count()
    print(f"latency-bound benchmark — {h.machine()}; {where}")
    print(
        f"  rollouts {args.rollouts} (succeeded {ok}) × {args.calls} calls, agent latency {args.latency_ms:g} ms, concurrency {args.concurrency}"
    )
    print(
        f"  first request → last reply {measured:.2f} s; ideal {ideal:.2f} s; ratio {measured / ideal:.3f} (target ≤ 1.10)"
    )
    print(f"  whole command incl. start-up and final writes {wall:.2f} s")


if __name__ == "__main__":
    main()
