"""Benchmark 9, scale-out (issue 27): ONE run served by K worker processes, each a real
`gymweb qcluster` worker process (a cluster of K workers, started as a machine starts it, sharing
one database; PostgreSQL + Redis or SQLite). Modes:

- ``spread``: no-latency work (1,000 rollouts × 3 calls against the fast services) with K=1 and
  K=2 processes, alternated, ``--repeat`` times: throughput (succeeded rollouts over the span from
  the first claim to the last end), each process's share of the run's rollouts, and the run's
  concurrency respected in total (the run's running attempts sampled every 50 ms over every
  process; the most seen against the run's concurrency). Medians; the load average is printed.
- ``inflight``: N rollouts all in flight (30 s agent latency, 3 calls) over K processes: agent
  span / ideal, the write backlog (oldest finished step not yet stored, sampled every 0.25 s),
  peak RSS and CPU of each worker process.
- ``fleet``: two worker groups started as two machines would be (each its own session and process
  group, its own environment file), one run; the first group is SIGKILLed when half the run has
  ended; reports throughput before and after, how long until the lost group's rollouts were
  running again (bounded by ``GYMWEB_LEASE_S``, short here: ``--lease-s``), and checks that every
  key ended exactly once (one succeeded attempt per key, no key run twice).

    python -m benchmarks.bench_scale spread [--db postgres|sqlite] [--rollouts 1000] [--repeat 3]
    python -m benchmarks.bench_scale inflight [--db postgres] --rollouts 10000 --workers 2
    python -m benchmarks.bench_scale fleet [--rollouts 5000] [--lease-s 5]
    make bench-scale      # spread on PostgreSQL + Redis and on SQLite

PostgreSQL: the database ``GYMWEB_BENCH_PG_NAME`` (default ``gymweb_bench_scale_out``) is made afresh;
Redis: ``GYMWEB_BENCH_REDIS_URL`` (default redis://127.0.0.1:6379/8).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks import _harness as h

GYMWEB = str(Path(sys.executable).with_name("gymweb"))


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def proc_stat(pid: int) -> tuple[float, float, int] | None:
    """(CPU seconds, peak RSS MB, process group) of a live process, from /proc; None once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return (int(fields[11]) + int(fields[12])) / tick, hwm / 1024, int(fields[2])


def machine_cpu() -> dict[str, float]:
    """CPU seconds so far, by who used them: the whole machine (busy, and of that at nice > 0, i.e.
    other engineers' niced work), this benchmark's PostgreSQL backends (of its database), every
    other PostgreSQL process, Redis, this process and its children (the fast agent, the fast env).
    Read twice and subtracted: what each used over an interval (processes that end meanwhile drop
    out, so the groups are a lower bound)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[:8])
    out = {"machine busy": (user + nice + system + irq + softirq + steal) / tick, "machine at nice > 0": nice / tick}
    db = os.environ.get("GYMWEB_BENCH_PG_NAME", "gymweb_bench_scale_out")
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        used = (int(fields[11]) + int(fields[12])) / tick
        if int(name) == me:
            group = "this benchmark (sampler)"
        elif int(fields[1]) == me and "fast_services" in cmd:
            group = "fast " + ("agent" if "--only agent" in cmd else "env")
        elif cmd.startswith("postgres:"):
            group = f"PostgreSQL backends of {db}" if f" {db} " in cmd else "PostgreSQL, the rest"
        elif "redis-server" in cmd:
            group = "Redis"
        else:
            continue
        out[group] = out.get(group, 0.0) + used
    return out


def set_autogroup_nice(pid: int | str, nice: int | None) -> str:
    """Give the scheduler autogroup of ``pid``'s session the nice value ``nice`` (Linux with
    ``kernel.sched_autogroup_enabled=1``: CPU is shared between sessions first, so another session's
    ``nice -n 19`` does not yield to this one's work unless this session's group is favoured; root
    only). Returns the group's line before, "" when not changed."""
    if nice is None:
        return ""
    path = Path(f"/proc/{pid}/autogroup")
    before = path.read_text().strip()
    path.write_text(str(nice))
    return before


class Cluster:
    """One `gymweb qcluster` started as a machine starts it: its own session (process group) and
    environment file."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path, autogroup_nice: int | None = None):
        self.name = name
        self.env_file = workdir / f"{name}.env"
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
        self.log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed in stop)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GYMWEB_", "DATABASE_URL"))}
        # The code of this checkout, not the one the venv's `gymweb` script was installed from
        # (an editable install of another worktree would otherwise be what is measured).
        base["PYTHONPATH"] = os.pathsep.join(p for p in (str(h.REPO), base.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            ["bash", "-c", f'set -a; . "{self.env_file}"; set +a; exec "{GYMWEB}" qcluster'],
            env=base,
            cwd=h.REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        set_autogroup_nice(self.proc.pid, autogroup_nice)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def worker_env(args, workers: int, capacity: int) -> dict[str, str]:
    env = {
        "GYMWEB_Q_WORKERS": str(workers),
        "GYMWEB_PROCESS_CAPACITY": str(capacity),
        "GYMWEB_ALLOW_LOCAL_TARGETS": "1",
        "GYMWEB_DISPATCH_IN_WORKERS": "1",
        "GYMWEB_LEASE_S": str(args.lease_s),
        "GYMWEB_HEARTBEAT_S": str(min(2.0, args.lease_s / 3)),
        "GYMWEB_LOG_LEVEL": "WARNING",
        "GYMWEB_Q_LOG_LEVEL": "WARNING",
    }
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
        env["GYMWEB_REDIS_URL"] = os.environ.get("GYMWEB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
    else:
        env["GYMWEB_DATA_DIR"] = os.environ["GYMWEB_DATA_DIR"]
    return env


class Sampler:
    """A thread sampling, every ``every`` s: the run's running attempts (over all processes), its
    ended attempts, the agent calls stored, and /proc figures of every live worker process."""

    def __init__(self, run_id: int, every: float, calls: bool = False):
        self.run_id, self.every, self.calls = run_id, every, calls
        self.running: list[int] = []
        self.ended: list[tuple[float, int]] = []
        self.stored: list[tuple[float, int]] = []
        self.procs: dict[int, tuple[float, float, int]] = {}  # pid -> last (cpu, hwm, pgrp)
        self.names: dict[str, int] = {}  # worker name -> pid
        self.connections = 0  # most connections to the database at once (PostgreSQL)
        # The database's locks, probed every sample: PostgreSQL: samples in which a backend of this
        # database waited for a lock; SQLite: seconds a BEGIN IMMEDIATE of the sampler's own waited
        # for the one write lock (the share of time some writer held it).
        self.lock_samples = 0
        self.lock_waited = 0
        self.write_lock_wait = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        from django.db import connection
        from django.db.models import Count

        from rollouts.models import AgentCall, Rollout, Worker

        n = 0
        probe = None
        if connection.vendor == "sqlite":
            import sqlite3

            probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=60, isolation_level=None)
        while not self._stop.wait(self.every):
            t = time.time()
            self.lock_samples += 1
            if probe is not None:
                t_lock = time.perf_counter()
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                waited = time.perf_counter() - t_lock
                self.write_lock_wait += waited
                self.lock_waited += waited > 0.001
            else:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    )
                    self.lock_waited += cursor.fetchone()[0] > 0
            counts = dict(
                Rollout.objects.filter(run_id=self.run_id, status__in=["running", "succeeded", "failed"])
                .values_list("status")
                .annotate(n=Count("id"))
            )
            self.running.append(counts.get("running", 0))
            self.ended.append((t, counts.get("succeeded", 0) + counts.get("failed", 0)))
            if self.calls:
                self.stored.append((t, AgentCall.objects.filter(rollout__run_id=self.run_id).count()))
            n += 1
            if n % max(1, round(1.0 / self.every)) == 0:
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()")
                        self.connections = max(self.connections, cursor.fetchone()[0])
                for name, pid in Worker.objects.values_list("name", "pid"):
                    self.names.setdefault(name, pid)
                for pid in set(self.names.values()):
                    st = proc_stat(pid)
                    if st is not None:
                        self.procs[pid] = st
        if probe is not None:
            probe.close()
        connection.close()


def wait_for_workers(n: int, since, timeout: float = 120.0) -> list[str]:
    from rollouts.models import Worker

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = list(Worker.objects.filter(started__gte=since).values_list("name", flat=True))
        if len(names) >= n:
            return names
        time.sleep(0.2)
    raise SystemExit(f"only {len(names)} of {n} worker processes registered within {timeout:.0f} s")


def wait_for_end(run_id: int, timeout: float) -> None:
    from rollouts.models import Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Run.objects.filter(pk=run_id).values_list("status", flat=True).first() != "running":
            return
        time.sleep(0.2)
    raise SystemExit(f"run {run_id} did not end within {timeout:.0f} s")


def one_run(args, workers: int, n: int, concurrency: int, agent_url: str, env_url: str, workdir: Path, tag: str):
    """Start a K-process cluster, launch a run of ``n`` at ``concurrency``, wait for its end, stop
    the cluster. Returns a dict of figures."""
    from django.db.models import Max, Min
    from django.utils import timezone

    from rollouts.collection import runs
    from rollouts.models import Rollout, Worker

    since = timezone.now()
    # Each process's capacity: its fair share of the run and a margin, so that the open-file limit
    # (two connections a rollout) holds.
    capacity = max(2000, -(-concurrency // workers) + 100)
    cluster = Cluster(tag, worker_env(args, workers, capacity), workdir, args.autogroup_nice)
    try:
        wait_for_workers(workers, since)
        pids = list(Worker.objects.filter(started__gte=since).values_list("pid", flat=True))
        cpu0 = {pid: st[0] for pid in pids if (st := proc_stat(pid)) is not None}
        services0 = sum(st[0] for pid in SERVICE_PIDS if (st := proc_stat(pid)) is not None)
        run = h.make_run(n, agent_url, env_url, concurrency, launch=False, run_timeout_s=3600)
        sampler = Sampler(run.pk, args.sample_s, calls=args.mode == "inflight").start()
        t0 = time.perf_counter()
        used0 = machine_cpu()
        runs.launch(run)
        wait_for_end(run.pk, args.timeout)
        wall = time.perf_counter() - t0
        used1 = machine_cpu()
        sampler.stop()
        for pid in set(sampler.names.values()):  # the run has ended: what each process used for it
            st = proc_stat(pid)
            if st is not None:
                sampler.procs[pid] = st
    finally:
        cluster.stop()
    rows = Rollout.objects.filter(run=run)
    agg = rows.aggregate(a=Min("started"), b=Max("finished"))
    span = (agg["b"] - agg["a"]).total_seconds()
    ok = rows.filter(status="succeeded").count()
    share = Counter(rows.exclude(worker="").values_list("worker", flat=True))
    return {
        "run": run,
        "ok": ok,
        "span": span,
        "wall": wall,
        "tput": ok / span,
        "max_running": max(sampler.running, default=0),
        "share": share,
        "sampler": sampler,
        "load": load(),
        "cpu": sum(cpu - cpu0.get(pid, 0.0) for pid, (cpu, _, _) in sampler.procs.items()),
        "used": {k: v - used0.get(k, 0.0) for k, v in used1.items()},
        "services_cpu": sum(st[0] for pid in SERVICE_PIDS if (st := proc_stat(pid)) is not None) - services0,
        "lock": lock_figure(sampler),
    }


def lock_figure(sampler: Sampler) -> str:
    share = 100 * sampler.lock_waited / max(1, sampler.lock_samples)
    if sampler.write_lock_wait:
        return (
            f"a probe's BEGIN IMMEDIATE waited in {share:.0f} % of {sampler.lock_samples} samples "
            f"(mean {1000 * sampler.write_lock_wait / max(1, sampler.lock_samples):.1f} ms)"
        )
    return f"a backend waited for a lock in {share:.0f} % of {sampler.lock_samples} samples"


SERVICE_PIDS: list[int] = []  # the fast agent and env (their CPU is measured per run)


def mode_spread(args, agent_url, env_url, workdir) -> None:
    ks = [int(k) for k in args.workers.split(",")]
    results: dict[int, list[dict]] = {k: [] for k in ks}
    for i in range(args.repeat):
        for k in ks:
            r = one_run(args, k, args.rollouts, args.concurrency, agent_url, env_url, workdir, f"spread-k{k}-{i}")
            results[k].append(r)
            shares = ", ".join(f"{100 * c / r['ok']:.0f} %" for _, c in sorted(r["share"].items()))
            print(
                f"  K={k} #{i + 1}: {r['ok']} ok, span {r['span']:.2f} s, {r['tput']:.0f} rollouts/s; "
                f"shares {shares}; most running at once {r['max_running']} (concurrency {args.concurrency}); "
                f"workers' CPU {1000 * r['cpu'] / r['ok']:.1f} ms per rollout ({r['cpu'] / r['span']:.2f} cores), "
                f"agent + env {r['services_cpu'] / r['span']:.2f} cores; {r['lock']}; {r['load']}",
                flush=True,
            )
    med = {k: statistics.median(r["tput"] for r in results[k]) for k in ks}
    print(
        f"spread — {h.machine()}; {args.where}; {args.rollouts} × {args.calls} calls, no latency, C={args.concurrency}"
    )
    for k in ks:
        runs_k = ", ".join(f"{r['tput']:.0f}" for r in results[k])
        print(
            f"  K={k}: median {med[k]:.0f} rollouts/s (runs: {runs_k}); "
            f"most running at once {max(r['max_running'] for r in results[k])} ≤ {args.concurrency}"
        )
    if 1 in med:
        for k in ks:
            if k != 1:
                ratios = [b["tput"] / a["tput"] for a, b in zip(results[1], results[k])]
                print(
                    f"  K={k} / K=1: {med[k] / med[1]:.2f} × (medians); paired ratios "
                    f"{', '.join(f'{x:.2f}' for x in ratios)} (target ≥ 1.7 at K=2)"
                )
    print(f"  {load()}")


def mode_inflight(args, agent_url, env_url, workdir) -> None:
    import math

    from rollouts.models import AgentCall

    for i in range(args.repeat):
        cap = math.ceil(args.rollouts / args.workers)
        r = one_run(args, args.workers, args.rollouts, args.rollouts, agent_url, env_url, workdir, f"inflight-{i}")
        run, sampler = r["run"], r["sampler"]
        calls = list(AgentCall.objects.filter(rollout__run=run).values_list("started", "latency_ms", "index"))
        starts = [s.timestamp() for s, _, _ in calls]
        ends = sorted(s + ms / 1000 for s, (_, ms, _) in zip(starts, calls))
        span = ends[-1] - min(starts)
        ideal = args.calls * args.latency_ms / 1000
        lag = 0.0
        for t, n in sampler.stored:
            if n < len(ends) and ends[n] < t:
                lag = max(lag, t - ends[n])
        print(f"in flight over K={args.workers} — {h.machine()}; {args.where}; #{i + 1}; process capacity ≥ {cap}")
        print(
            f"  rollouts {args.rollouts} (succeeded {r['ok']}), {args.latency_ms:g} ms × {args.calls} calls; "
            f"most running at once {r['max_running']}"
        )
        print(f"  agent span {span:.2f} s; ideal {ideal:.2f} s; span/ideal {span / ideal:.3f} (target ≤ 1.15)")
        print(f"  write backlog: at most {lag:.2f} s ({len(sampler.stored)} samples; target ≤ 2 s)")
        shares = ", ".join(f"{100 * c / max(1, r['ok']):.1f} %" for _, c in sorted(r["share"].items()))
        print(f"  shares of the run: {shares}")
        for pid, (cpu, hwm, _pg) in sorted(sampler.procs.items()):
            print(f"  worker process {pid}: CPU {cpu:.1f} s (all its life), peak RSS {hwm:.0f} MB (target < 1 GB)")
        # The floor a wave of N replies sets on 2 cores: CPU per rollout-step × N / cores.
        per_step = r["cpu"] / max(1, len(calls))
        cores = os.cpu_count() or 1
        print(
            f"  workers' CPU over the run {r['cpu']:.1f} s = {1000 * per_step:.2f} ms per rollout-step "
            f"({len(calls)} agent calls); floor of a wave: {per_step * args.rollouts / cores:.1f} s on {cores} cores "
            f"→ span/ideal ≥ {(ideal + per_step * args.rollouts / cores) / ideal:.3f} if the last wave pays it once"
        )
        for k in range(args.calls):
            wave = sorted(t for t, (_, _, idx) in zip(starts, calls) if idx == k)
            if wave:
                p99 = wave[min(len(wave) - 1, int(0.99 * len(wave)))]
                print(
                    f"  agent call {k + 1}: {len(wave)} started from +{wave[0] - min(starts):.1f} s over "
                    f"{wave[-1] - wave[0]:.1f} s (99 % within {p99 - wave[0]:.1f} s)"
                )
        print(f"  database connections at most {sampler.connections} (this benchmark's own included)")
        cores_s = cores * r["wall"]
        print(
            f"  CPU from launch to the run's end ({r['wall']:.1f} s × {cores} cores = {cores_s:.0f} core-s): workers "
            f"{r['cpu']:.1f} s; "
            + "; ".join(f"{k} {v:.1f} s" for k, v in sorted(r["used"].items(), key=lambda kv: -kv[1]))
        )
        print(f"  wall {r['wall']:.1f} s; {r['load']}", flush=True)


def mode_fleet(args, agent_url, env_url, workdir) -> None:
    from django.utils import timezone

    from rollouts.collection import runs
    from rollouts.models import AgentCall, Rollout, Worker

    since = timezone.now()
    env = worker_env(args, args.workers, max(2000, args.concurrency))
    machines = [Cluster(f"machine-{m}", dict(env, GYMWEB_Q_NAME=f"machine-{m}"), workdir) for m in "ab"]
    try:
        wait_for_workers(2 * args.workers, since)
        pgrp_of = {}
        for name, pid in Worker.objects.filter(started__gte=since).values_list("name", "pid"):
            st = proc_stat(pid)
            pgrp_of[name] = st[2] if st else None
        lost = {n for n, g in pgrp_of.items() if g == machines[0].proc.pid}
        run = h.make_run(args.rollouts, agent_url, env_url, args.concurrency, launch=False, run_timeout_s=3600)
        sampler = Sampler(run.pk, 0.25).start()
        t0 = time.time()
        runs.launch(run)
        while not sampler.ended or sampler.ended[-1][1] < args.rollouts // 2:
            time.sleep(0.05)
        held = list(
            Rollout.objects.filter(run=run, status="running", worker__in=lost).values_list(
                "id", "task_index", "rollout_index"
            )
        )
        t_kill = time.time()
        machines[0].kill()
        wait_for_end(run.pk, args.timeout)
        t_end = time.time()
        sampler.stop()
    finally:
        for m in machines:
            m.stop()
    rows = Rollout.objects.filter(run=run)
    ended = Counter(rows.filter(status__in=["succeeded", "failed"]).values_list("task_index", "rollout_index"))
    twice = sum(1 for c in ended.values() if c > 1)
    missing = args.rollouts - len(ended)
    interrupted = rows.filter(status="interrupted").count()
    back = []
    for rid, ti, ri in held:
        first = (
            rows.filter(task_index=ti, rollout_index=ri, id__gt=rid, started__isnull=False)
            .order_by("started")
            .values_list("started", flat=True)
            .first()
        )
        if first is not None:
            back.append(first.timestamp() - t_kill)
    ended_at = sampler.ended

    def rate(a: float, b: float) -> float:
        pts = [(t, n) for t, n in ended_at if a <= t <= b]
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else 0.0

    warm = t0 + 0.1 * (t_kill - t0)
    share = Counter(rows.filter(status="succeeded").values_list("worker", flat=True))
    print(f"fleet loses a machine — {h.machine()}; {args.where}")
    print(
        f"  two groups (qcluster, {args.workers} worker processes each, own session and env file); run of "
        f"{args.rollouts} at concurrency {args.concurrency}, {args.latency_ms:g} ms × {args.calls} calls; "
        f"GYMWEB_LEASE_S={args.lease_s:g}"
    )
    print(f"  SIGKILL to machine-a's process group at +{t_kill - t0:.1f} s, holding {len(held)} running rollouts")
    print(
        f"  throughput before {rate(warm, t_kill):.1f} rollouts/s, after {rate(t_kill + args.lease_s + 1, t_end):.1f} "
        f"(and {rate(t_kill, t_end):.1f} over the whole rest, lease wait included); run ended at +{t_end - t0:.1f} s"
    )
    if back:
        back.sort()
        print(
            f"  lost rollouts running again after: median {statistics.median(back):.1f} s, last {back[-1]:.1f} s "
            f"({len(back)} of {len(held)}; bound: lease {args.lease_s:g} s + a poll)"
        )
    print(
        f"  keys ended {len(ended)} of {args.rollouts}; missing {missing}; ended twice {twice}; "
        f"interrupted attempts {interrupted}; agent calls stored {AgentCall.objects.filter(rollout__run=run).count()}"
    )
    print(
        "  succeeded by worker: "
        + ", ".join(f"{w.split(':')[1]}{' (lost)' if w in lost else ''} {c}" for w, c in sorted(share.items()))
    )
    print(f"  most running at once {max(sampler.running, default=0)} (concurrency {args.concurrency}); {load()}")
    print(f"  database connections at most {sampler.connections} (this benchmark's own included)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["spread", "inflight", "fleet"])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--workers", default=None, help="spread: K values (1,2); else processes per group")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--lease-s", type=float, default=None)
    parser.add_argument("--sample-s", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--agent-port", type=int, default=0, help="the fast agent's port (0: any free one)")
    parser.add_argument("--env-port", type=int, default=0, help="the fast env's port (0: any free one)")
    parser.add_argument(
        "--autogroup-nice",
        type=int,
        default=None,
        help="nice value of the scheduler autogroups of this benchmark's session and of each worker cluster's "
        "(e.g. -10: favoured over other sessions' work; restored at the end; root only)",
    )
    parser.add_argument(
        "--db-autogroup-nice",
        type=int,
        default=None,
        help="nice value of the PostgreSQL server's scheduler autogroup during the benchmark (e.g. -10, as the "
        "workers' with --autogroup-nice: otherwise favoured workers leave the server a tenth of the CPU in a "
        "wave and the writers wait for it; restored at the end; root only; the server is shared)",
    )
    parser.add_argument(
        "--service-procs",
        type=int,
        default=None,
        help="processes of the fast agent and of the env, sharing a port (default: one per 15,000 rollouts in "
        "flight: a process holds at most its open-file limit of connections, 20,000 here)",
    )
    args = parser.parse_args()
    defaults = {
        "spread": dict(rollouts=1000, latency_ms=0.0, concurrency=100, workers="1,2", repeat=3, lease_s=30.0),
        "inflight": dict(rollouts=10000, latency_ms=30000.0, concurrency=0, workers="2", repeat=1, lease_s=30.0),
        "fleet": dict(rollouts=5000, latency_ms=2000.0, concurrency=1000, workers="2", repeat=1, lease_s=5.0),
    }[args.mode]
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.mode != "spread":
        args.workers = int(args.workers)
    if args.mode == "inflight":
        args.sample_s = 0.25
    if args.service_procs is None:
        args.service_procs = -(-max(args.rollouts, args.concurrency or 0) // 15000) if args.mode == "inflight" else 1
    from benchmarks.fast_services import raise_fd_limit

    raise_fd_limit()
    if args.db == "postgres":
        name = os.environ.setdefault("GYMWEB_BENCH_PG_NAME", "gymweb_bench_scale_out")
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        import redis

        redis.Redis.from_url(os.environ.get("GYMWEB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")).flushdb()
    args.where = h.setup_django(args.db)
    if args.db == "postgres":
        args.where += " + Redis"
    from django.db import connection

    workdir = Path(tempfile.mkdtemp(prefix="gymweb-scale-"))
    print(f"{args.mode}: {h.machine()}; {args.where}; logs in {workdir}; {load()}", flush=True)
    before = set_autogroup_nice("self", args.autogroup_nice)
    if before:
        print(f"scheduler: autogroup of this session and of each cluster at nice {args.autogroup_nice} (was: {before})")
    db_pid, db_before = "", ""
    if args.db_autogroup_nice is not None and args.db == "postgres":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        db_pid = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1]  # the server's main process
        db_before = set_autogroup_nice(db_pid, args.db_autogroup_nice)
        print(f"scheduler: autogroup of the PostgreSQL server at nice {args.db_autogroup_nice} (was: {db_before})")
    agent_url, env_url, procs = h.start_services(
        args.calls, args.latency_ms, ports=(args.agent_port, args.env_port), each=args.service_procs
    )
    SERVICE_PIDS.extend(p.pid for p in procs)
    try:
        connection.close()
        {"spread": mode_spread, "inflight": mode_inflight, "fleet": mode_fleet}[args.mode](
            args, agent_url, env_url, workdir
        )
    finally:
        h.stop(procs)
        if before:
            set_autogroup_nice("self", int(before.rsplit(" ", 1)[1]))
        if db_before:
            set_autogroup_nice(db_pid, int(db_before.rsplit(" ", 1)[1]))


if __name__ == "__main__":
    main()
