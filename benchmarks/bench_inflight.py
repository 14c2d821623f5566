"""Benchmark 4, many in flight: N rollouts all in flight at once in ONE dispatcher (one worker
process) against a slow agent (L ms per call, `calls` calls each). Prints:

- the most rollouts seen in flight at once;
- the agent span (first agent request to last reply, from the stored agent calls) against the
  ideal ceil(N / C) × calls × L with C = N, i.e. calls × L;
- the peak RSS of the process;
- the write backlog: sampled every 0.25 s, how long the oldest step not yet stored had been
  finished (an agent call counts from its reply; target: every step stored within 2 s);
- the process's CPU per rollout.

    python -m benchmarks.bench_inflight [--rollouts 1000] [--latency-ms 3000] [--calls 3] [--db sqlite|postgres]
    make bench-inflight10k   # --rollouts 10000 --latency-ms 30000 --calls 3

Targets: peak RSS under 600 MB at 1,000; at 10,000 (issue 14): span ≤ 1.05 × ideal, peak RSS under
1 GB, backlog ≤ 2 s, on SQLite and on PostgreSQL. The open-file limit is raised to its hard limit
(each rollout in flight holds an agent connection, and the env's while a tool runs).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import threading
import time

from benchmarks import _harness as h


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=3000.0)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()

    # One process holds them all: its capacity must not cap the run (GYMWEB_PROCESS_CAPACITY).
    os.environ["GYMWEB_PROCESS_CAPACITY"] = str(max(2000, args.rollouts))
    from benchmarks.fast_services import raise_fd_limit

    fds = raise_fd_limit()
    where = h.setup_django(args.db)
    from django.db import connection as main_connection

    from rollouts.models import AgentCall, Rollout
    from rollouts.workers.process import run_in_process

    rss_before = h.peak_rss_mb()
    gc_time = {"n": 0, "s": 0.0, "full": 0, "t0": 0.0}

    def gc_clock(phase: str, info: dict) -> None:  # Python's cyclic collector: how often, how long
        if phase == "start":
            gc_time["t0"] = time.perf_counter()
        else:
            gc_time["n"] += 1
            gc_time["full"] += info["generation"] == 2
            gc_time["s"] += time.perf_counter() - gc_time["t0"]

    gc.callbacks.append(gc_clock)
    agent_url, env_url, procs = h.start_services(args.calls, args.latency_ms)
    peak_inflight = 0
    samples: list[tuple[float, int]] = []  # (epoch s, agent calls stored)
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak_inflight
        from django.db import connection

        while not stop.wait(0.25):
            t = time.time()
            samples.append((t, AgentCall.objects.count()))
            peak_inflight = max(peak_inflight, Rollout.objects.filter(status="running").count())
        connection.close()

    try:
        run = h.make_run(args.rollouts, agent_url, env_url, args.rollouts, run_timeout_s=3600)
        main_connection.close()
        watcher = threading.Thread(target=watch)
        watcher.start()
        cpu0, t0 = h.cpu_seconds(), time.perf_counter()
        run_in_process(run.pk)
        wall, cpu = time.perf_counter() - t0, h.cpu_seconds() - cpu0
        stop.set()
        watcher.join()
    finally:
        h.stop(procs)
    calls = list(AgentCall.objects.filter(rollout__run=run).values_list("started", "latency_ms"))
    starts = [s.timestamp() for s, _ in calls]
    ends = sorted(s + ms / 1000 for s, ms in zip(starts, (ms for _, ms in calls)))
    span = ends[-1] - min(starts)
    ideal = math.ceil(args.rollouts / args.rollouts) * args.calls * args.latency_ms / 1000
    # Backlog: at each sample, the oldest finished-but-unstored call had finished ends[n] (n stored).
    lag = 0.0
    for t, n in samples:
        if n < len(ends) and ends[n] < t:
            lag = max(lag, t - ends[n])
    ok = Rollout.objects.filter(run=run, status="succeeded").count()
    t_first = min(starts)
    by_index: dict[int, list[tuple[float, float]]] = {}
    for i, s_, ms in AgentCall.objects.filter(rollout__run=run).values_list("index", "started", "latency_ms"):
        by_index.setdefault(i, []).append((s_.timestamp() - t_first, ms / 1000))
    for i, rows in sorted(by_index.items()):
        st = sorted(r[0] for r in rows)
        lat = sorted(r[1] for r in rows)
        print(
            f"  call {i + 1}: starts at +{st[0]:.2f} … +{st[len(st) // 2]:.2f} (median) … +{st[-1]:.2f} s; latency median {lat[len(lat) // 2]:.2f} s, max {lat[-1]:.2f} s"
        )
    print(f"many-in-flight benchmark — {h.machine()}; {where}; open-file limit {fds}")
    print(
        f"  rollouts {args.rollouts} (succeeded {ok}), agent latency {args.latency_ms:g} ms × {args.calls} calls; most in flight at once {peak_inflight}"
    )
    print(f"  agent span {span:.2f} s; ideal {ideal:.2f} s; span/ideal {span / ideal:.3f} (target ≤ 1.05 at 10,000)")
    print(
        f"  write backlog: the oldest unstored step had finished at most {lag:.2f} s before ({len(samples)} samples; target ≤ 2 s)"
    )
    print(
        f"  wall {wall:.1f} s; CPU {cpu:.1f} s ({1000 * cpu / args.rollouts:.2f} ms per rollout, "
        f"{1000 * cpu / (args.rollouts * args.calls):.2f} ms per rollout-step; target ≤ 1.0 at 10,000)"
    )
    print(f"  load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  garbage collector: {gc_time['n']} collections ({gc_time['full']} full), {gc_time['s']:.1f} s")
    print(
        f"  peak RSS {h.peak_rss_mb():.0f} MB (before the run {rss_before:.0f} MB; target < 600 MB at 1,000, < 1 GB at 10,000)"
    )


if __name__ == "__main__":
    main()
