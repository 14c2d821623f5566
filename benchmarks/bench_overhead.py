"""Benchmark 1, overhead: zero-latency agent and env, N rollouts × calls agent calls, concurrency C,
through the real dispatcher and database. Prints rollouts/s, gymweb CPU per agent call, peak RSS.

    python -m benchmarks.bench_overhead [--rollouts 2000] [--calls 4] [--concurrency 64] [--db sqlite|postgres]

gymweb's CPU is this process's (the dispatcher, its DB thread and Django); the agent and env run in
processes of their own. Target: under 1.5 ms of gymweb CPU per agent call, persisting included.
"""

from __future__ import annotations

import argparse
import time

from benchmarks import _harness as h


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()

    where = h.setup_django(args.db)
    from rollouts.models import AgentCall, Rollout, TrajectoryItem
    from rollouts.workers.process import run_in_process

    agent_url, env_url, procs = h.start_services(args.calls)
    try:
        run = h.make_run(args.rollouts, agent_url, env_url, args.concurrency)
        cpu0, t0 = h.cpu_seconds(), time.perf_counter()
        run_in_process(run.pk)
        wall, cpu = time.perf_counter() - t0, h.cpu_seconds() - cpu0
    finally:
        h.stop(procs)
    ok = Rollout.objects.filter(run=run, status="succeeded").count()
    calls = AgentCall.objects.filter(rollout__run=run).count()
    items = TrajectoryItem.objects.filter(rollout__run=run).count()
    print(f"overhead benchmark — {h.machine()}; {where}")
    print(
        f"  rollouts {args.rollouts} (succeeded {ok}), agent calls {calls}, items stored {items}, concurrency {args.concurrency}"
    )
    print(f"  wall {wall:.2f} s   rollouts/s {args.rollouts / wall:.1f}   agent calls/s {calls / wall:.0f}")
    print(
        f"  gymweb CPU {cpu:.2f} s = {cpu / max(calls, 1) * 1e6:.0f} µs per agent call (target < 1500 µs; NeMo Gym's remote_agent ≈ 2500 µs)"
    )
    print(f"  peak RSS {h.peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
