"""The training-loop benchmark: consecutive batches of rollouts, submit to last result, gymweb's
client (``gymweb.client.Client.run_examples``) against NeMo Gym 0.7.0's
``RolloutCollectionHelper.run_examples``, side by side in one run, batch by batch in turn.

    python -m benchmarks.bench_trainer [--sizes 32,512] [--batches 20] [--latency-ms 200] [--db sqlite|postgres]
        [--ngpeer $NGPEER_WORK] [--port-base 20500] [--skip-nemo]

Both drive the same scripted agent (``../shared/nemo_gym_peer/scripted_agent.py``: a fixed sleep per
call, 4 calls per rollout) and NeMo Gym's own counter resources server code. NeMo Gym: its stack
(``gym env start``: its head server on 127.0.0.1:port-base+10, the counter, ``remote_agent`` with concurrency =
batch size) and a loop on ``run_examples`` in NeMo Gym's venv (``benchmarks/_nemo_trainer_loop.py``).
gymweb: gunicorn (gthread) + one ``qcluster`` worker on a fresh database, the counter served
standalone (``serve_counter.py``), and the client sending each batch inline and reading the results
stream. Ideal batch time = latency × 4 calls; "first" = time to the first result of a batch.
For gymweb it also prints where a batch's time went (``_phases``: the POST, the claim, the seed,
the agent calls, the time between them, verify, storing, reading) and the CPU seconds each of its
process groups (agent, env, gunicorn, the qcluster worker, the client) spent per batch.

Needs NeMo Gym's venv (``--ngpeer``/venv/bin/gym, see ../shared/nemo_gym_peer/README.md); the
ports must be free (``--skip-nemo`` measures gymweb alone). Every server binds 127.0.0.1 and is
stopped at the end. One untimed warm-up batch per system and size comes first.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import _harness as h

CALLS = 4  # the scripted agent without --parallel: two increments, a read, the answer
PEER = h.REPO.parent / "shared" / "nemo_gym_peer"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _start(cmd: list, log: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd or h.REPO,
        env=env or dict(os.environ),
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc, first: int = signal.SIGTERM) -> None:
    """Stop a process started by ``_start`` (its whole process group): ``first``, then SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((first, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait(check, what: str, procs: list, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc, log in procs:
            if proc.poll() is not None:
                raise SystemExit(f"{what}: a process exited early; its log ({log}):\n{Path(log).read_text()[-3000:]}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what}: not ready within {timeout} s")


def _group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group ``pgid`` (Linux /proc)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp, ..., utime (11), stime (12)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _http_ok(url: str, method: str = "GET") -> bool:
    import httpx

    return httpx.request(method, url, timeout=2).status_code < 500


def _rows(ngpeer: Path, n: int) -> list[dict]:
    src = [
        json.loads(line)
        for line in (ngpeer / "gymrun" / "data" / "example.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return [dict(src[i % len(src)]) for i in range(n)]


def _summary(times: list[float]) -> str:
    return f"median {statistics.median(times):.3f} s ({min(times):.3f}–{max(times):.3f})"


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32,512", help="batch sizes, comma-separated")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--redis-url", default=os.environ.get("GYMWEB_REDIS_URL", "redis://127.0.0.1:6379/5"))
    parser.add_argument(
        "--ngpeer",
        default=os.environ.get("NGPEER_WORK", os.path.join(os.environ.get("TMPDIR", "/tmp"), "ngpeer")),
        help="NeMo Gym's venv, counter and gymrun",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=20500,
        help="web, agent, env and NeMo Gym head server ports: base, base+1, base+2, base+10",
    )
    parser.add_argument("--skip-nemo", action="store_true")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="the qcluster worker's processes (GYMWEB_Q_WORKERS: each runs a dispatcher; gymweb's default is 2)",
    )
    parser.add_argument(
        "--env-max-in-flight",
        type=int,
        default=0,
        help="each batch's run setting env_max_in_flight, sent by the client (0: not sent)",
    )
    return parser.parse_args()


def _server_env(workers: int) -> dict:
    """The environment of gunicorn and the qcluster worker (``workers`` processes)."""
    env = dict(os.environ)
    env.update(
        {
            "GYMWEB_DEBUG": "0",
            "GYMWEB_SECRET_KEY": secrets.token_urlsafe(50),
            "GYMWEB_ALLOWED_HOSTS": "127.0.0.1",
            "GYMWEB_ALLOW_LOCAL_TARGETS": "1",
            "GYMWEB_DISPATCH_IN_WORKERS": "1",
            "GYMWEB_Q_WORKERS": str(workers),
            "GYMWEB_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _start_services(
    ngpeer: Path, ng_python: Path, ports: tuple[int, int, int, int], latency_ms: float, work: Path, env: dict
) -> list:
    """Start the scripted agent, the counter env, gunicorn and a qcluster worker; the processes."""
    web_port, agent_port, env_port, _head_port = ports
    agent = _start(
        [ng_python, PEER / "scripted_agent.py", "--port", agent_port, "--sleep-ms", latency_ms],
        work / "agent.log",
    )
    counter = _start(
        [ng_python, PEER / "serve_counter.py", "--app-dir", ngpeer / "counter", "--port", env_port],
        work / "env.log",
    )
    web = _start(
        [
            Path(sys.executable).parent / "gunicorn",
            "gymweb.wsgi",
            "--bind",
            f"127.0.0.1:{web_port}",
            "--workers",
            "1",
            "--worker-class",
            "gthread",
            "--threads",
            "16",
            "--timeout",
            "300",
        ],
        work / "gunicorn.log",
        env,
    )
    qcluster = [sys.executable, "manage.py", "qcluster"]
    if os.environ.get("GYMWEB_BENCH_PYSPY"):  # a py-spy raw profile of the worker and its children
        spy = Path(sys.executable).parent / "py-spy"
        out = os.environ["GYMWEB_BENCH_PYSPY"]
        spy_args = [spy, "record", "--nonblocking", "--subprocesses", "-r", "200", "-f", "raw", "-o", out]
        qcluster = [*spy_args, "-d", os.environ.get("GYMWEB_BENCH_PYSPY_S", "60"), "--", *qcluster]
    worker = _start(qcluster, work / "qcluster.log", env)
    return [agent, counter, web, worker]


def _wait_services(procs: list, ports: tuple[int, int, int, int], work: Path, workers: int) -> None:
    from rollouts.models import Worker

    web_port, agent_port, env_port, _head_port = ports
    logs = [(p, work / n) for p, n in zip(procs, ("agent.log", "env.log", "gunicorn.log", "qcluster.log"))]
    _wait(lambda: _http_ok(f"http://127.0.0.1:{agent_port}/health"), "the scripted agent", logs)
    _wait(lambda: _http_ok(f"http://127.0.0.1:{env_port}/get_counter_value", "POST"), "the counter", logs)
    _wait(lambda: _http_ok(f"http://127.0.0.1:{web_port}/api/v1/openapi.json"), "gunicorn", logs)
    _wait(lambda: Worker.objects.count() >= workers, "the qcluster worker's dispatchers", logs)


def _phases(run, w_submit: float, w_posted: float, reads: dict) -> dict:
    """Where one gymweb batch's time went, in seconds (wall clock; the medians over its rollouts
    unless said): the POST; POST answered → first rollout claimed; claim spread (first → last
    claimed); claimed → first agent call sent (seed); the agent calls' own time; the time between
    agent calls (tool calls and gymweb's own work); last agent reply → rollout ended (verify);
    ended → stored; stored → read by the client; and the batch's last read."""
    from rollouts.models import AgentCall

    rollouts = {
        r["id"]: r
        for r in run.rollouts.values("id", "task_index", "rollout_index", "started", "finished", "duration_ms")
    }
    calls: dict[int, list] = {}
    for c in AgentCall.objects.filter(rollout__run=run).order_by("index").values("rollout_id", "started", "latency_ms"):
        calls.setdefault(c["rollout_id"], []).append((c["started"].timestamp(), c["latency_ms"] / 1000))
    per: dict[str, list[float]] = {k: [] for k in ("seed", "agent", "between", "verify", "store", "read")}
    for rid, r in rollouts.items():
        started, stored = r["started"].timestamp(), r["finished"].timestamp()
        ended = started + (r["duration_ms"] or 0) / 1000
        cs = calls.get(rid, [])
        if cs:
            per["seed"].append(cs[0][0] - started)
            per["agent"].append(sum(lat for _, lat in cs))
            per["between"].append(sum(cs[i + 1][0] - (cs[i][0] + cs[i][1]) for i in range(len(cs) - 1)))
            per["verify"].append(ended - (cs[-1][0] + cs[-1][1]))
        per["store"].append(stored - ended)
        read = reads.get((r["task_index"], r["rollout_index"]))
        if read is not None:
            per["read"].append(read - stored)
    starts = [r["started"].timestamp() for r in rollouts.values()]
    out = {"post": w_posted - w_submit, "claim": min(starts) - w_posted, "spread": max(starts) - min(starts)}
    out.update({k: statistics.median(v) for k, v in per.items() if v})
    out["last_read"] = max(reads.values()) - w_submit
    return out


PHASES = ("post", "claim", "spread", "seed", "agent", "between", "verify", "store", "read", "last_read")


GROUPS = ("agent", "env", "web", "worker")


def _gymweb_batcher(client, agent_url: str, env_url: str, procs: list, settings: dict):
    """One batch through gymweb's client: its timings, rewards, phases (``_phases``) and the CPU
    seconds each process group spent on it (``GROUPS`` and the client)."""
    from django.db.models import Max, Min

    from rollouts.models import Run
    from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

    posted: list[float] = []

    def on_response(response) -> None:
        if response.request.method == "POST":
            posted.append(time.time())

    client.http.event_hooks["response"].append(on_response)

    def gymweb_batch(rows):
        posted.clear()
        cpu0 = [_group_cpu(p.pid) for p in procs]
        c0 = time.process_time()
        t0, w0 = time.monotonic(), time.time()
        first, rewards, reads = None, [], {}
        for _row, result in client.run_examples(rows, agent_url=agent_url, env_url=env_url, max_steps=10, **settings):
            if first is None:
                first = time.monotonic() - t0
            reads[(result.get(TASK_INDEX_KEY_NAME), result.get(ROLLOUT_INDEX_KEY_NAME))] = time.time()
            rewards.append(result.get("reward"))
        out = {"batch_s": time.monotonic() - t0, "first_s": first, "n": len(rewards), "rewards": rewards}
        out["cpu"] = {"client": time.process_time() - c0}
        out["cpu"].update({name: _group_cpu(p.pid) - c for name, p, c in zip(GROUPS, procs, cpu0)})
        # Where the time went: submit to the first rollout started, and the last stored to the last read.
        run = Run.objects.order_by("-id").first()
        spans = run.rollouts.aggregate(start=Min("started"), end=Max("finished"))
        out["start_s"] = spans["start"].timestamp() - w0
        out["tail_s"] = w0 + out["batch_s"] - spans["end"].timestamp()
        out["phases"] = _phases(run, w0, posted[0] if posted else w0, reads)
        return out

    return gymweb_batch


class _NemoLoop:
    """NeMo Gym's stack (``gym env start``) and its trainer loop (``_nemo_trainer_loop.py``), restarted
    for each concurrency."""

    def __init__(self, ngpeer: Path, ng_python: Path, agent_url: str, head_port: int, work: Path) -> None:
        self.ngpeer, self.ng_python, self.agent_url, self.head_port, self.work = (
            ngpeer,
            ng_python,
            agent_url,
            head_port,
            work,
        )
        self.stack = self.loop = None

    def start(self, concurrency: int) -> None:
        ngpeer, work, head_port = self.ngpeer, self.work, self.head_port
        _stop(self.loop)
        _stop(self.stack, signal.SIGINT)  # as stack.sh stops it
        run_dir = work / f"gymrun-{concurrency}"
        run_dir.mkdir()
        cfg = (ngpeer / "gymrun" / "remote_counter.yaml").read_text()
        cfg = "\n".join(
            f"      agent_base_url: {self.agent_url}"
            if line.strip().startswith("agent_base_url:")
            else f"      concurrency: {concurrency}"
            if line.strip().startswith("concurrency:")
            else line
            for line in cfg.splitlines()
        )
        cfg += f"\nhead_server:\n  host: 127.0.0.1\n  port: {head_port}\n"
        (run_dir / "remote_counter.yaml").write_text(cfg)
        os.symlink(ngpeer / "gymrun" / "data", run_dir / "data")
        ng_env = {
            **os.environ,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
        }
        self.stack = stack = _start(
            [ngpeer / "venv" / "bin" / "gym", "env", "start", "--config", "remote_counter.yaml"],
            work / f"gym_env-{concurrency}.log",
            ng_env,
            cwd=run_dir,
        )
        _wait(
            lambda: _http_ok(f"http://127.0.0.1:{head_port}/readyz"),
            "NeMo Gym's stack",
            [(stack, work / f"gym_env-{concurrency}.log")],
            600,
        )
        self.loop = subprocess.Popen(
            [str(self.ng_python), str(h.REPO / "benchmarks" / "_nemo_trainer_loop.py"), "--head-port", str(head_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(work / "nemo_loop.log", "ab"),
            text=True,
            cwd=run_dir,
            env=ng_env,
            start_new_session=True,
        )

    def batch(self, rows):
        loop = self.loop
        loop.stdin.write(json.dumps({"rows": rows}) + "\n")
        loop.stdin.flush()
        line = loop.stdout.readline()
        if not line:
            raise SystemExit(f"NeMo Gym's loop ended; see {self.work / 'nemo_loop.log'}")
        return json.loads(line)

    def stop(self) -> None:
        loop = self.loop
        if loop is not None and loop.poll() is None:
            try:
                loop.stdin.write("\n")
                loop.stdin.flush()
            except OSError:
                pass
        _stop(loop)
        _stop(self.stack, signal.SIGINT)


def _measure(systems: dict, size: int, batches: int, ngpeer: Path) -> dict:
    """``batches`` timed batches of ``size`` rows per system (after one warm-up), alternating
    which system goes first."""
    times = {name: [] for name in systems}
    for i in range(batches + 1):
        order = list(systems) if i % 2 == 0 else list(reversed(systems))
        for name in order:
            out = systems[name](_rows(ngpeer, size))
            if out["n"] != size:
                raise SystemExit(f"{name}: {out['n']} of {size} results in batch {i}")
            if i:  # batch 0 warms up
                times[name].append(out)
    return times


def _report(size: int, batches: int, times: dict, ideal: float, nemo: bool) -> None:
    for name, outs in times.items():
        batch = [o["batch_s"] for o in outs]
        first = [o["first_s"] for o in outs]
        ok = sum(1 for o in outs for r in o["rewards"] if r == 1.0)
        print(
            f"  {size:>4} × {batches} {name:>8}: batch {_summary(batch)}, {statistics.median(batch) / ideal:.2f} × ideal; "
            f"first result {_summary(first)}; reward 1.0 in {ok}/{size * batches}",
            flush=True,
        )
        if name == "gymweb":
            print(
                f"  {'':>4}   {'':>8}  submit → first rollout started {_summary([o['start_s'] for o in outs])}; "
                f"last stored → last read {_summary([o['tail_s'] for o in outs])}",
                flush=True,
            )
            print(
                f"  {'':>4}   {'':>8}  phases (ms, median over batches): "
                + ", ".join(
                    f"{k} {1000 * statistics.median(o['phases'][k] for o in outs):.0f}"
                    for k in PHASES
                    if all(k in o["phases"] for o in outs)
                ),
                flush=True,
            )
            print(
                f"  {'':>4}   {'':>8}  CPU per batch (ms, median): "
                + ", ".join(f"{k} {1000 * statistics.median(o['cpu'][k] for o in outs):.0f}" for k in outs[0]["cpu"]),
                flush=True,
            )
            # /proc counts clock ticks (10 ms): the mean over the batches resolves finer than one median
            print(
                f"  {'':>4}   {'':>8}  CPU per batch (ms, mean): "
                + ", ".join(f"{k} {1000 * statistics.fmean(o['cpu'][k] for o in outs):.1f}" for k in outs[0]["cpu"]),
                flush=True,
            )
    if nemo:
        g = statistics.median(o["batch_s"] for o in times["gymweb"])
        n = statistics.median(o["batch_s"] for o in times["nemo_gym"])
        print(f"  {size:>4}: gymweb / NeMo Gym median batch time = {g / n:.2f}", flush=True)


def main() -> None:
    args = _parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ngpeer = Path(args.ngpeer)
    ng_python = ngpeer / "venv" / "bin" / "python"
    if not (ngpeer / "venv" / "bin" / "gym").exists():
        raise SystemExit(
            f"NeMo Gym's venv is not at {ngpeer}/venv (see {PEER}/README.md); its agent and counter are needed"
        )
    nemo = not args.skip_nemo
    ports = (args.port_base, args.port_base + 1, args.port_base + 2, args.port_base + 10)
    web_port, agent_port, env_port, head_port = ports
    for port in ports:
        if not _port_free(port):
            raise SystemExit(f"port {port} is in use: pick another --port-base")

    work = Path(tempfile.mkdtemp(prefix="gymweb-bench-trainer-"))
    if args.db == "postgres":
        os.environ["GYMWEB_REDIS_URL"] = args.redis_url
        os.environ["GYMWEB_Q_NAME"] = f"gymweb-bench-trainer-{os.getpid()}"
    where = h.setup_django(args.db)
    from django.contrib.auth import get_user_model

    from gymweb.client import Client
    from rollouts.tokens import create_token

    user = get_user_model().objects.create_user(username="trainer", password=secrets.token_urlsafe(16))
    token = create_token(user, "bench")[1]
    env = _server_env(args.workers)
    procs: list = []
    agent_url, env_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{env_port}"
    nemo_loop = _NemoLoop(ngpeer, ng_python, agent_url, head_port, work)
    load_before = os.getloadavg()
    try:
        procs = _start_services(ngpeer, ng_python, ports, args.latency_ms, work, env)
        _wait_services(procs, ports, work, args.workers)
        client = Client(f"http://127.0.0.1:{web_port}", token)
        run_settings = {"env_max_in_flight": args.env_max_in_flight} if args.env_max_in_flight else {}
        gymweb_batch = _gymweb_batcher(client, agent_url, env_url, procs, run_settings)
        ideal = args.latency_ms / 1000 * CALLS
        print(
            f"training-loop benchmark — {h.machine()}; {where}; {args.workers} worker process(es); env_max_in_flight {args.env_max_in_flight or 'not sent'}; agent latency {args.latency_ms:g} ms × {CALLS} calls "
            f"(ideal batch {ideal:.2f} s); load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}",
            flush=True,
        )
        for size in sizes:
            if nemo:
                nemo_loop.start(size)
            systems = {"gymweb": gymweb_batch, **({"nemo_gym": nemo_loop.batch} if nemo else {})}
            times = _measure(systems, size, args.batches, ngpeer)
            _report(size, args.batches, times, ideal, nemo)
        load_after = os.getloadavg()
        print(f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    finally:
        nemo_loop.stop()
        for proc in reversed(procs):
            _stop(proc)
        print(f"logs: {work}")


if __name__ == "__main__":
    main()
