"""Benchmark 4, many in flight: N rollouts all in flight at once in one dispatcher against a slow
agent. Prints the peak RSS of the process and the most rollouts seen in flight.

    python -m benchmarks.bench_inflight [--rollouts 1000] [--latency-ms 3000] [--calls 3] [--db sqlite|postgres]

Target: peak RSS under 600 MB.
"""
from __future__ import annotations

import argparse
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

    where = h.setup_django(args.db)
    from rollouts.collection.dispatch import run_in_process
    from rollouts.models import Rollout

    rss_before = h.peak_rss_mb()
    agent_url, env_url, procs = h.start_services(args.calls, args.latency_ms)
    peak_inflight = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak_inflight
        from django.db import connection

        while not stop.wait(0.5):
            peak_inflight = max(peak_inflight, Rollout.objects.filter(status="running").count())
        connection.close()

    try:
        run = h.make_run(args.rollouts, agent_url, env_url, args.rollouts, run_timeout_s=600)
        watcher = threading.Thread(target=watch)
        watcher.start()
        t0 = time.perf_counter()
        run_in_process(run.pk)
        wall = time.perf_counter() - t0
        stop.set()
        watcher.join()
    finally:
        h.stop(procs)
    ok = Rollout.objects.filter(run=run, status="succeeded").count()
    print(f"many-in-flight benchmark — {h.machine()}; {where}")
    print(f"  rollouts {args.rollouts} (succeeded {ok}), agent latency {args.latency_ms:g} ms × {args.calls} calls; most in flight at once {peak_inflight}")
    print(f"  wall {wall:.1f} s; peak RSS {h.peak_rss_mb():.0f} MB (before the run {rss_before:.0f} MB; target < 600 MB)")


if __name__ == "__main__":
    main()
