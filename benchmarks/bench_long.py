"""Benchmark 7, long trajectories: R rollouts of S agent calls each, every tool output padded to
K KB, so the conversation re-sent on every agent call grows by about K KB a step (step 60 sends
about 600 KB). Prints gymweb's CPU per step against the step number.

    python -m benchmarks.bench_long [--rollouts 200] [--steps 60] [--tool-kb 10] [--latency-ms 200] [--db sqlite|postgres]

How CPU is given to steps: the process's CPU time is sampled every 0.1 s; each interval's CPU is
shared among the agent calls whose replies arrived in it, by their step number (the work after a
reply is that step's: parse, store, run the tool, send the next request). With the agent's latency
the rollouts move in waves, so an interval holds replies of one or two step numbers. Target: flat
(step 60 costs about what step 1 costs), or the growth explained.
"""

from __future__ import annotations

import argparse
import bisect
import threading
import time

from benchmarks import _harness as h


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--tool-kb", type=float, default=10.0)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()

    where = h.setup_django(args.db)
    from django.db import connection

    from rollouts.models import AgentCall, Rollout
    from rollouts.workers.process import run_in_process

    agent_url, env_url, procs = h.start_services(args.steps, args.latency_ms, tool_output_kb=args.tool_kb)
    samples: list[tuple[float, float]] = []  # (epoch s, process CPU s)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            samples.append((time.time(), h.cpu_seconds()))

    try:
        run = h.make_run(args.rollouts, agent_url, env_url, args.rollouts, run_timeout_s=3600)
        connection.close()
        watcher = threading.Thread(target=watch)
        samples.append((time.time(), h.cpu_seconds()))
        watcher.start()
        t0 = time.perf_counter()
        run_in_process(run.pk)
        wall = time.perf_counter() - t0
        stop.set()
        watcher.join()
        samples.append((time.time(), h.cpu_seconds()))
    finally:
        h.stop(procs)
    calls = list(AgentCall.objects.filter(rollout__run=run).values_list("index", "started", "latency_ms"))
    times = [t for t, _ in samples]
    per_step = [0.0] * args.steps
    buckets: dict[int, list[int]] = {}
    for index, started, ms in calls:
        end = started.timestamp() + ms / 1000
        buckets.setdefault(bisect.bisect_left(times, end), []).append(index)
    for b, indexes in buckets.items():
        if b <= 0 or b >= len(samples):
            continue
        cpu = samples[b][1] - samples[b - 1][1]
        for index in indexes:
            per_step[index] += cpu / len(indexes)
    ok = Rollout.objects.filter(run=run, status="succeeded").count()
    total = samples[-1][1] - samples[0][1]
    print(f"long-trajectory benchmark — {h.machine()}; {where}")
    print(
        f"  rollouts {args.rollouts} (succeeded {ok}) × {args.steps} agent calls, tool outputs {args.tool_kb:g} KB, agent latency {args.latency_ms:g} ms"
    )
    print(
        f"  wall {wall:.1f} s; CPU {total:.1f} s ({1000 * total / (args.rollouts * args.steps):.2f} ms per step on average)"
    )
    print("  CPU per step (ms, mean over the rollouts), by step number:")
    for lo in range(0, args.steps, 10):
        part = per_step[lo : lo + 10]
        print(f"    steps {lo + 1:>2}–{lo + len(part):<2}: {1000 * sum(part) / len(part) / args.rollouts:6.2f}")


if __name__ == "__main__":
    main()
