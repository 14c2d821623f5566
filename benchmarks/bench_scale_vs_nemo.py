"""NeMo Gym 0.7.0 and gymweb at scale, side by side in one run (issue 27, target 4): N rollouts all in
flight at once (concurrency = N), the same scripted agent sleeping L ms per call (3 calls a rollout,
``scripted_agent.py --parallel``), NeMo Gym's own counter resources server code, the same N rows.

    python -m benchmarks.bench_scale_vs_nemo [--sizes 2000,10000] [--latency-ms 30000] [--repeats 1]
        [--db sqlite|postgres] [--ngpeer $NGPEER_WORK] [--nemo-per-host-limit 0]

NeMo Gym: its stack (``gym env start``: head server on 127.0.0.1:11000, the counter, ``remote_agent`` with
concurrency = the largest N, per-call/run timeouts 1800/2100 s as gymweb's defaults, and its aiohttp pool's
per-host cap lifted: ``--nemo-per-host-limit``, default 0 = none; NeMo Gym's own default, 1024, caps the agent
calls in flight at 1,024) started once, then ``gym eval run --no-serve`` with ``+num_samples_in_parallel=N``.
gymweb: ``manage.py collect --concurrency N`` (one process, ``GYMWEB_PROCESS_CAPACITY=N``) against the counter
served standalone (``serve_counter.py``). For each system and size it prints: agent span (first agent request
to last reply, by the agent's clock) over ideal = 3 × L; peak RSS of the collector's processes (the largest
sum sampled every 0.5 s, and the largest single process); CPU per rollout (utime + stime); rollouts succeeded
/ failed; wall; the load average before and after. The collector's processes: NeMo Gym — every process of
``gym env start`` except the counter env, plus the ``gym eval run`` client and its children; gymweb — the
``collect`` process. The agent and the counter are not counted for either.

Needs NeMo Gym's venv (``../shared/nemo_gym_peer/README.md``); NeMo Gym binds fixed ports (9000 is not
used here, 11000 is), so run it under ``flock /tmp/ngpeer.lock`` where others share the machine. The
open-file limit is raised to 65,536 (root) or the hard limit, for every process started.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import _harness as h
from benchmarks.bench_trainer import PEER, _http_ok, _port_free, _start, _stop, _wait
from benchmarks.fast_services import raise_fd_limit

CALLS = 3  # scripted_agent.py --parallel: both increments in call 1, the read, the answer
HEAD_PORT = 11000  # NeMo Gym's head server; `gym eval run --no-serve` looks for it there
PAGE_KB = os.sysconf("SC_PAGE_SIZE") / 1024
TICK = os.sysconf("SC_CLK_TCK")


def _procs(pgids: set[int]) -> dict[int, tuple[str, float, float]]:
    """Every process in ``pgids``: pid → (command line, RSS MB, CPU s incl. reaped children)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[2]) not in pgids:
                continue
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            rss = int(Path(f"/proc/{name}/statm").read_text().split()[1]) * PAGE_KB / 1024
        except (OSError, IndexError, ValueError):
            continue
        out[int(name)] = (cmd, rss, sum(int(x) for x in fields[11:15]) / TICK)
    return out


class Sampler:
    """Samples the RSS of the collector's processes every 0.5 s: the peak sum and the peak single process.
    ``exclude``: command-line substrings of processes that are not the collector's (the env)."""

    def __init__(self, pgids: set[int], exclude: tuple[str, ...] = ()) -> None:
        self.pgids, self.exclude = pgids, exclude
        self.peak_sum = self.peak_one = 0.0
        self.nprocs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, pgid: int) -> None:
        self.pgids = self.pgids | {pgid}

    def cpu(self) -> dict[int, float]:
        return {pid: cpu for pid, (cmd, _rss, cpu) in _procs(self.pgids).items() if not self._excluded(cmd)}

    def _excluded(self, cmd: str) -> bool:
        return any(e in cmd for e in self.exclude)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            rss = [r for cmd, r, _cpu in _procs(self.pgids).values() if not self._excluded(cmd)]
            if rss:
                self.peak_sum = max(self.peak_sum, sum(rss))
                self.peak_one = max(self.peak_one, max(rss))
                self.nprocs = max(self.nprocs, len(rss))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _wait_or_cut(
    proc: subprocess.Popen, sampler: Sampler, cpu0: dict[int, float], timeout_s: float
) -> tuple[float, bool]:
    """Wait for ``proc`` at most ``timeout_s``; (CPU s of the sampler's processes since ``cpu0``, cut).
    Finished: the leader's own CPU from its rusage (with its reaped descendants). Cut: every process's
    CPU so far from /proc, then the process group is stopped."""
    t0 = time.monotonic()
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            cpu1 = sampler.cpu()
            rest = sum(c - cpu0.get(p, 0.0) for p, c in cpu1.items() if p != proc.pid)
            return usage.ru_utime + usage.ru_stime + rest, False
        if time.monotonic() - t0 > timeout_s:
            cpu1 = sampler.cpu()
            _stop(proc)
            return sum(c - cpu0.get(p, 0.0) for p, c in cpu1.items()), True
        time.sleep(0.5)


def _agent(url: str, path: str, method: str = "GET") -> dict:
    import httpx

    return httpx.request(method, url + path, timeout=10).json()


def _count(path: Path) -> tuple[int, int]:
    """(rows, rows with reward 1.0) of a JSONL file, (0, 0) when it is missing."""
    if not path.exists():
        return 0, 0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return len(rows), sum(1 for r in rows if r.get("reward") == 1.0)


def _result(name, n, latency_ms, stats, wall, cpu, sampler, ok_path, fail_path, load0) -> dict:
    ok, reward1 = _count(ok_path)
    failed, _ = _count(fail_path)
    span = (stats["last_t"] or 0) - (stats["first_t"] or 0)
    ideal = math.ceil(n / n) * CALLS * latency_ms / 1000
    return {
        "system": name,
        "rollouts": n,
        "succeeded": ok,
        "reward_1": reward1,
        "failed": failed,
        "agent_calls": stats["calls"],
        "span_s": round(span, 2),
        "ideal_s": round(ideal, 2),
        "span_over_ideal": round(span / ideal, 3),
        "agent_calls_per_s": round(stats["calls"] / span, 1) if span else None,
        "wall_s": round(wall, 1),
        "peak_rss_sum_mb": round(sampler.peak_sum),
        "peak_rss_largest_mb": round(sampler.peak_one),
        "processes": sampler.nprocs,
        "cpu_ms_per_rollout": round(1000 * cpu / n, 2),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _nemo_log(log: Path) -> dict:
    """From ``gym eval run``'s log: rollouts its progress bar last showed done, and how many of its
    requests hit a connection error and were retried (it prints every 100th: "Hit N global ...")."""
    text = log.read_text(errors="replace") if log.exists() else ""
    done = re.findall(r"Collecting rollouts:.*?(\d+)/\d+", text)
    errors = [int(x) for x in re.findall(r"Hit (\d+) global `(?:ClientOSError|\w+)`", text)]
    return {"progress_done": int(done[-1]) if done else None, "connection_errors_retried": max(errors, default=0)}


def _write_rows(ngpeer: Path, n: int, path: Path) -> None:
    src = [line for line in (ngpeer / "gymrun" / "data" / "example.jsonl").read_text().splitlines() if line.strip()]
    path.write_text("".join(src[i % len(src)] + "\n" for i in range(n)))


class Nemo:
    """NeMo Gym's stack, started once in a run dir of its own, and ``gym eval run`` against it."""

    def __init__(self, ngpeer: Path, agent_url: str, concurrency: int, per_host: int, work: Path) -> None:
        self.ngpeer, self.work = ngpeer, work
        self.run_dir = work / "gymrun"
        self.run_dir.mkdir()
        overrides = {
            "agent_base_url:": agent_url,
            "concurrency:": concurrency,
            "remote_responses_timeout_secs:": 1800.0,
            "run_timeout_secs:": 2100.0,
        }
        lines = []
        for line in (ngpeer / "gymrun" / "remote_counter.yaml").read_text().splitlines():
            key = line.strip().split(" ", 1)[0]
            lines.append(
                f"{line[: len(line) - len(line.lstrip())]}{key} {overrides[key]}" if key in overrides else line
            )
        # NeMo Gym's servers share one aiohttp pool capped at 1,024 connections per host by default:
        # without raising it no more than 1,024 agent calls are ever in flight.
        lines.insert(0, f"global_aiohttp_connector_limit_per_host: {per_host}")
        (self.run_dir / "remote_counter.yaml").write_text("\n".join(lines) + "\n")
        os.symlink(ngpeer / "gymrun" / "data", self.run_dir / "data")
        self.env = {
            **os.environ,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
        }
        self.stack = self.client = None

    def start(self) -> None:
        log = self.work / "gym_env.log"
        gym = self.ngpeer / "venv" / "bin" / "gym"
        self.stack = _start([gym, "env", "start", "--config", "remote_counter.yaml"], log, self.env, self.run_dir)
        _wait(lambda: _http_ok(f"http://127.0.0.1:{HEAD_PORT}/readyz"), "NeMo Gym's stack", [(self.stack, log)], 600)

    def run(self, n: int, rows: Path, out: Path, sampler: Sampler, timeout_s: float) -> tuple[float, float, bool]:
        """``gym eval run`` over ``rows``; (wall s, CPU s of the stack's processes and the client, timed out).
        Past ``timeout_s`` the client is stopped (its CPU so far read from /proc) and the run counts as cut."""
        cpu0 = sampler.cpu()
        t0 = time.monotonic()
        self.client = client = _start(
            [
                self.ngpeer / "venv" / "bin" / "gym",
                "eval",
                "run",
                "--no-serve",
                "+agent_name=remote_agent",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={out}",
                f"+num_samples_in_parallel={n}",
            ],
            out.with_suffix(".log"),
            self.env,
            self.run_dir,
        )
        sampler.add(client.pid)
        cpu, cut = _wait_or_cut(client, sampler, cpu0, timeout_s)
        wall = time.monotonic() - t0
        if cut:
            print(f"# gym eval run stopped after {timeout_s:g} s; see {out.with_suffix('.log')}", flush=True)
        elif client.returncode:
            print(f"# gym eval run exited {client.returncode}; see {out.with_suffix('.log')}", flush=True)
        return wall, cpu, cut

    def stop(self) -> None:
        _stop(self.client)
        _stop(self.stack, signal.SIGINT)  # as stack.sh stops it


def _gymweb(
    n: int, rows: Path, out: Path, agent_url: str, env_url: str, env: dict, timeout_s: float
) -> tuple[float, float, Sampler, bool]:
    """``manage.py collect`` over ``rows``; (wall s, CPU s, its RSS sampler, cut after ``timeout_s``)."""
    t0 = time.monotonic()
    proc = _start(
        [
            sys.executable,
            "manage.py",
            "collect",
            "--agent-url",
            agent_url,
            "--env-url",
            env_url,
            "--input",
            rows,
            "--output",
            out,
            "--concurrency",
            n,
            "--max-steps",
            10,
            "--remote-responses-timeout-s",
            1800,
            "--run-timeout-s",
            2100,
            "--no-progress",
        ],
        out.with_suffix(".log"),
        env,
    )
    with Sampler({proc.pid}) as sampler:
        cpu, cut = _wait_or_cut(proc, sampler, {}, timeout_s)
    wall = time.monotonic() - t0
    if cut:
        print(f"# gymweb collect stopped after {timeout_s:g} s; see {out.with_suffix('.log')}", flush=True)
    elif proc.returncode:
        print(f"# gymweb collect exited {proc.returncode}; see {out.with_suffix('.log')}", flush=True)
    return wall, cpu, sampler, cut


def _gymweb_env(db: str, work: Path, n: int) -> dict:
    env = {
        **os.environ,
        "GYMWEB_ALLOW_LOCAL_TARGETS": "1",
        "GYMWEB_DISPATCH_IN_WORKERS": "0",
        "GYMWEB_PROCESS_CAPACITY": str(n),
        # A run's concurrency is capped at 4,096 by default (a setting for fleets): N in flight needs N.
        "GYMWEB_MAX_RUN_CONCURRENCY": str(max(n, 4096)),
        "GYMWEB_LOG_LEVEL": "WARNING",
    }
    if db == "postgres":
        name = os.environ.get("GYMWEB_BENCH_PG_NAME", "gymweb_ngpeer")
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
    else:
        env["DATABASE_URL"] = f"sqlite:///{work}/db.sqlite3"
    return env


def _fresh_db(env: dict, db: str) -> None:
    if db == "postgres":
        import psycopg

        name = env["DATABASE_URL"].rsplit("/", 1)[1]
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    else:
        Path(env["DATABASE_URL"].removeprefix("sqlite:///")).unlink(missing_ok=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=h.REPO, env=env, check=True)


def _line(r: dict) -> str:
    return (
        f"  {r['rollouts']:>6} {r['system']:>14}: span {r['span_s']:.1f} s = {r['span_over_ideal']:.3f} × ideal; "
        f"peak RSS {r['peak_rss_sum_mb']} MB summed over {r['processes']} process(es), "
        f"largest {r['peak_rss_largest_mb']} MB; "
        f"CPU {r['cpu_ms_per_rollout']:.2f} ms/rollout; succeeded {r['succeeded']} (reward 1.0: {r['reward_1']}), "
        f"failed {r['failed']}; agent calls {r['agent_calls']} ({r['agent_calls_per_s']}/s); "
        f"wall {r['wall_s']:.0f} s; load {r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}"
        + (
            f"; NeMo Gym's progress bar {r['progress_done']} done, {r['connection_errors_retried']}+ requests retried"
            if "progress_done" in r
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--latency-ms", type=float, default=30000.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--ngpeer", default=os.environ.get("NGPEER_WORK", os.path.join(os.environ.get("TMPDIR", "/tmp"), "ngpeer"))
    )
    parser.add_argument(
        "--nemo-per-host-limit",
        type=int,
        default=0,
        help="NeMo Gym's global_aiohttp_connector_limit_per_host (its default 1024 caps calls in flight; 0: none)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=3600,
        help="stop either system's command after this long: reported as cut, with the agent calls made by then",
    )
    parser.add_argument("--order", choices=("alternate", "gymweb-first", "nemo-first"), default="alternate")
    parser.add_argument(
        "--systems",
        default="gymweb,nemo_gym",
        help="which systems to run, comma-separated (gymweb, nemo_gym); gymweb alone does not start NeMo Gym's stack",
    )
    parser.add_argument("--agent-port", type=int, default=19301)
    parser.add_argument("--env-port", type=int, default=19302)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    if not systems or systems - {"gymweb", "nemo_gym"}:
        raise SystemExit(f"--systems: gymweb and/or nemo_gym, got {args.systems!r}")
    ngpeer = Path(args.ngpeer)
    ng_python = ngpeer / "venv" / "bin" / "python"
    if not (ngpeer / "venv" / "bin" / "gym").exists():
        raise SystemExit(f"NeMo Gym's venv is not at {ngpeer}/venv (see {PEER}/README.md)")
    for port in (args.agent_port, args.env_port, HEAD_PORT):
        if not _port_free(port):
            raise SystemExit(f"port {port} is in use")
    fds = raise_fd_limit()
    # Started in the background SIGINT may be ignored: SIGTERM too stops every server started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="gymweb-bench-scale-"))
    agent_url, env_url = f"http://127.0.0.1:{args.agent_port}", f"http://127.0.0.1:{args.env_port}"
    print(
        f"scale side-by-side benchmark — {h.machine()}; gymweb on {args.db}; agent latency {args.latency_ms:g} ms × "
        f"{CALLS} calls, concurrency = rollouts; open-file limit {fds}; load average {os.getloadavg()}; logs {work}",
        flush=True,
    )
    agent = _start(
        [ng_python, PEER / "scripted_agent.py", "--port", args.agent_port, "--sleep-ms", args.latency_ms, "--parallel"],
        work / "agent.log",
    )
    counter = _start(
        [ng_python, PEER / "serve_counter.py", "--app-dir", ngpeer / "counter", "--port", args.env_port],
        work / "env.log",
    )
    nemo = Nemo(ngpeer, agent_url, max(sizes), args.nemo_per_host_limit, work)
    results: list[dict] = []
    try:
        logs = [(agent, work / "agent.log"), (counter, work / "env.log")]
        _wait(lambda: _http_ok(f"{agent_url}/health"), "the scripted agent", logs)
        _wait(lambda: _http_ok(f"{env_url}/get_counter_value", "POST"), "the counter", logs)
        if "nemo_gym" in systems:
            nemo.start()
        for rep in range(args.repeats):
            for n in sizes:
                rows = work / f"in-{n}.jsonl"
                _write_rows(ngpeer, n, rows)
                first_nemo = rep % 2 == 0 if args.order == "alternate" else args.order == "nemo-first"
                order = ("nemo_gym", "gymweb") if first_nemo else ("gymweb", "nemo_gym")
                for system in (s for s in order if s in systems):
                    out = work / f"{system}-{n}-{rep}" / "rollouts.jsonl"
                    out.parent.mkdir()
                    _agent(agent_url, "/reset", "POST")
                    load0 = os.getloadavg()
                    if system == "nemo_gym":
                        with Sampler({nemo.stack.pid}, exclude=("example_session_state_mgmt",)) as sampler:
                            wall, cpu, cut = nemo.run(n, rows, out, sampler, args.timeout_s)
                        name = "nemo_gym_0.7.0" + (" (cut)" if cut else "")
                    else:
                        env = _gymweb_env(args.db, work, n)
                        _fresh_db(env, args.db)
                        wall, cpu, sampler, cut = _gymweb(n, rows, out, agent_url, env_url, env, args.timeout_s)
                        name = "gymweb" + (" (cut)" if cut else "")
                    fail = out.with_name(out.stem + "_failures.jsonl")
                    r = _result(
                        name, n, args.latency_ms, _agent(agent_url, "/stats"), wall, cpu, sampler, out, fail, load0
                    )
                    if system == "nemo_gym":
                        r.update(_nemo_log(out.with_suffix(".log")))
                    results.append(r)
                    print(_line(r), flush=True)
                    print("#", json.dumps(r), flush=True)
    finally:
        nemo.stop()
        _stop(counter)
        _stop(agent)
    if args.repeats > 1:
        print("medians:")
        for n in sizes:
            for name in ("nemo_gym_0.7.0", "gymweb"):
                rs = [r for r in results if r["rollouts"] == n and r["system"] == name]
                med = {
                    k: statistics.median(r[k] for r in rs)
                    for k in ("span_over_ideal", "peak_rss_sum_mb", "cpu_ms_per_rollout")
                }
                print(f"  {n:>6} {name:>14}: " + ", ".join(f"{k} {v}" for k, v in med.items()))
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
