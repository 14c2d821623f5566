"""The fault runs of issue 28, on the production set-up (gunicorn with DEBUG off, a ``qcluster``
worker with 2 processes, SQLite): each fault happens during a run, and for each the script prints
the keys expected, present (a final row), duplicated (more than one success), failed (by failure
kind), the peak RSS of any one gymweb process (web or worker), and the longest page time a
signed-in user polling the runs list and the run's page every second saw during it (and how many
of those pages failed).

    python -m benchmarks.bench_faults [--only worker-stop,env-restart,redis-down,hostile,uploads]
        [--rollouts 300] [--calls 3] [--latency-ms 100] [--concurrency 32] [--port 19500]
        [--redis-port 19579] [--hostile-mb 200] [--upload-rows 50000]

- ``worker-stop``: one worker process SIGKILLed, then SIGTERM to the cluster's main process (as
  ``kill PID`` and ``docker stop`` do): seconds to exit; a new cluster then finishes the run.
- ``env-restart``: the env killed and started again on its port 5 s later, mid-run.
- ``redis-down``: the web cache on a Redis of the benchmark's own (``redis-server --port
  --redis-port``, never the shared one) stopped for 15 s mid-run, then started again.
- ``hostile``: the agent answers 1% of calls with ``--hostile-mb`` MB.
- ``uploads``: three users upload a ``--upload-rows``-row dataset at once through the new-run
  form (background tasks in the worker) while a run collects.

Every process talks to 127.0.0.1 only and is stopped at the end (its own process group).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks import _harness as h
from benchmarks.bench_team import _server_env, _start, _stop, _wait_http, _wait_worker

PASSWORD = "bench-faults-password-1"
FAULTS = ("worker-stop", "env-restart", "redis-down", "hostile", "uploads")


# -- processes ---------------------------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    """``pid`` and its living descendants (/proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def _services(port_agent: int, port_env: int, calls: int, latency_ms: float, **agent_flags) -> dict:
    procs = {}
    for only, port in (("agent", port_agent), ("env", port_env)):
        procs[only] = _service(only, port, calls, latency_ms, **(agent_flags if only == "agent" else {}))
    return procs


def _service(only: str, port: int, calls: int, latency_ms: float, **flags) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "benchmarks.fast_services", "--only", only, "--calls", str(calls)]
    cmd += ["--latency-ms", str(latency_ms), f"--{only}-port", str(port)]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, cwd=h.REPO, stdout=subprocess.PIPE, text=True, start_new_session=True)
    proc.stdout.readline()  # "… listening on URL"
    return proc


# -- what a fault run reports ------------------------------------------------------------------------
class Watch:
    """While a fault runs: the peak RSS of any one process of the watched trees (sampled every
    0.25 s), and a signed-in user's page times (the runs list and the run's page, one a second)."""

    def __init__(self, base: str, username: str, pages: list[str]):
        self.base, self.username, self.pages = base, username, pages
        self.roots: list[int] = []
        self.peak_rss = 0.0
        self.longest = (0.0, "")
        self.failed_pages: Counter = Counter()
        self.requests = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._sample, daemon=True),
            threading.Thread(target=self._browse, daemon=True),
        ]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for root in list(self.roots):
                for pid in _tree(root):
                    self.peak_rss = max(self.peak_rss, _rss_mb(pid))
            self._stop.wait(0.25)

    def _browse(self) -> None:
        import httpx

        with httpx.Client(base_url=self.base, timeout=60) as client:
            login(client, self.username)
            while not self._stop.is_set():
                for page in self.pages:
                    t0 = time.perf_counter()
                    try:
                        status = client.get(page).status_code
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    seconds = time.perf_counter() - t0
                    self.requests += 1
                    if seconds > self.longest[0]:
                        self.longest = (seconds, page)
                    if status != 200:
                        self.failed_pages[f"{page} {status}"] += 1
                self._stop.wait(1.0)


def login(client, username: str) -> None:
    r = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', r.text).group(1)
    client.post(
        "/accounts/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": str(client.base_url) + "/accounts/login/"},
    )


def keys_report(run) -> dict:
    """Keys expected, present (the latest attempt is final), duplicated (more than one success),
    failed by failure kind (the latest attempt failed), and every failed attempt by kind (those
    retried automatically included)."""
    from django.db.models import Count

    from rollouts.models import Rollout

    run.refresh_from_db()
    latest: dict[tuple[int, int], tuple[int, str, str]] = {}
    for key_task, key_rollout, pk, status, kind in Rollout.objects.filter(run=run).values_list(
        "task_index", "rollout_index", "id", "status", "failure_kind"
    ):
        if (key_task, key_rollout) not in latest or pk > latest[(key_task, key_rollout)][0]:
            latest[(key_task, key_rollout)] = (pk, status, kind or "")
    dup = (
        Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED)
        .values("task_index", "rollout_index")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    failed = Counter(kind or "?" for _pk, status, kind in latest.values() if status == Rollout.Status.FAILED)
    attempts = Counter(
        Rollout.objects.filter(run=run, status=Rollout.Status.FAILED).values_list("failure_kind", flat=True)
    )
    return {
        "run status": run.status,
        "expected": run.num_keys,
        "present": sum(1 for _pk, status, _k in latest.values() if status in ("succeeded", "failed")),
        "succeeded": sum(1 for _pk, status, _k in latest.values() if status == "succeeded"),
        "duplicated": dup,
        "failed": dict(failed),
        "failed attempts retried or final, by kind": dict(attempts),
    }


def _wait(predicate, timeout: float, what: str, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(what)


def _done(run) -> int:
    from rollouts.models import Rollout

    return Rollout.objects.filter(run=run, status__in=("succeeded", "failed")).count()


# -- the faults --------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args, tmp: Path):
        self.args, self.tmp = args, tmp
        self.base = f"http://127.0.0.1:{args.port}"
        self.agent_port, self.env_port = args.port + 1, args.port + 2
        self.secret = secrets.token_urlsafe(50)  # one key: the web signs the tasks the worker reads

    def env(self, **extra) -> dict[str, str]:
        env = _server_env(argparse.Namespace(db="sqlite"), self.args.port)
        env["GYMWEB_SECRET_KEY"] = self.secret
        env.update({"GYMWEB_DATA_DIR": str(self.tmp), "GYMWEB_STATIC_ROOT": str(self.tmp / "static")})
        env.update({"GYMWEB_RELEASE_TIMEOUT_S": "5", "GYMWEB_AUTO_RETRY_DELAY_S": "2"})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def web(self, name: str, **extra) -> subprocess.Popen:
        gunicorn = [
            str(Path(sys.executable).parent / "gunicorn"),
            "gymweb.wsgi",
            "--bind",
            f"127.0.0.1:{self.args.port}",
        ]
        gunicorn += ["--workers", "3", "--timeout", "300"]
        proc = _start(gunicorn, self.env(**extra), self.tmp / f"{name}-gunicorn.log")
        _wait_http(self.base + "/accounts/login/", proc, self.tmp / f"{name}-gunicorn.log")
        return proc

    def worker(self, name: str, **extra) -> subprocess.Popen:
        from rollouts.models import Worker

        Worker.objects.all().delete()  # a fresh heartbeat tells this cluster is up
        proc = _start([sys.executable, "manage.py", "qcluster"], self.env(**extra), self.tmp / f"{name}-qcluster.log")
        _wait_worker(proc, self.tmp / f"{name}-qcluster.log")
        return proc

    def run(self, agent: str, env: str, n: int | None = None):
        return h.make_run(n or self.args.rollouts, agent, env, self.args.concurrency, auto_retry=True, max_attempts=3)

    def report(self, fault: str, run, watch: Watch, extra: dict | None = None) -> dict:
        out = {"fault": fault, **(keys_report(run) if run is not None else {})}
        out["peak RSS of one gymweb process (MB)"] = round(watch.peak_rss)
        out["longest page (s)"] = round(watch.longest[0], 2)
        out["longest page"] = watch.longest[1]
        out["pages requested"] = watch.requests
        out["pages failed"] = dict(watch.failed_pages)
        out.update(extra or {})
        print(json.dumps(out), flush=True)
        return out

    def pages(self, run) -> list[str]:
        return ["/", f"/runs/{run.pk}/"]

    # Each fault: its own services, web server and worker, stopped at its end.
    def worker_stop(self) -> dict:
        services = _services(self.agent_port, self.env_port, self.args.calls, self.args.latency_ms)
        web = worker = None
        try:
            web, worker = self.web("stop"), self.worker("stop")
            run = self.run(f"http://127.0.0.1:{self.agent_port}", f"http://127.0.0.1:{self.env_port}")
            with Watch(self.base, "faults", self.pages(run)) as watch:
                watch.roots = [web.pid, worker.pid]
                _wait(lambda: _done(run) >= run.num_keys // 5, 300, "a fifth of the run done")
                from rollouts.models import Worker

                victim = Worker.objects.order_by("id").first()
                os.kill(victim.pid, signal.SIGKILL)
                time.sleep(2)
                t0 = time.monotonic()
                os.kill(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(timeout=120)
                    stop_s = round(time.monotonic() - t0, 1)
                except subprocess.TimeoutExpired:
                    stop_s = "did not exit in 120 s"
                _stop(worker)
                from rollouts.models import Rollout

                left_running = Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).count()
                worker = self.worker("stop-2")
                watch.roots = [web.pid, worker.pid]
                _wait(lambda: run.refresh_from_db() or run.is_final, 600, "the run final")
            extra = {
                "SIGTERM to exit (s)": stop_s,
                "rows still running after the stop (the SIGKILLed worker's: its lease runs out)": left_running,
            }
            return self.report("worker SIGKILL then SIGTERM", run, watch, extra)
        finally:
            for p in (worker, web, *services.values()):
                if p is not None:
                    _stop(p)

    def env_restart(self) -> dict:
        services = _services(self.agent_port, self.env_port, self.args.calls, self.args.latency_ms)
        web = worker = None
        try:
            web, worker = self.web("env"), self.worker("env")
            run = self.run(f"http://127.0.0.1:{self.agent_port}", f"http://127.0.0.1:{self.env_port}")
            with Watch(self.base, "faults", self.pages(run)) as watch:
                watch.roots = [web.pid, worker.pid]
                _wait(lambda: _done(run) >= run.num_keys // 4, 300, "a quarter of the run done")
                _stop(services["env"])
                time.sleep(5)
                services["env"] = _service("env", self.env_port, self.args.calls, self.args.latency_ms)
                _wait(lambda: run.refresh_from_db() or run.is_final, 600, "the run final")
            return self.report("env killed, back 5 s later", run, watch)
        finally:
            for p in (worker, web, *services.values()):
                if p is not None:
                    _stop(p)

    def redis_down(self) -> dict:
        port = self.args.redis_port
        redis_cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        redis = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL, start_new_session=True)
        services = _services(self.agent_port, self.env_port, self.args.calls, self.args.latency_ms)
        web = worker = None
        cache = {"GYMWEB_CACHE_URL": f"redis://127.0.0.1:{port}/12"}
        try:
            time.sleep(0.5)
            web, worker = self.web("redis", **cache), self.worker("redis", **cache)
            run = self.run(f"http://127.0.0.1:{self.agent_port}", f"http://127.0.0.1:{self.env_port}")
            with Watch(self.base, "faults", self.pages(run)) as watch:
                watch.roots = [web.pid, worker.pid]
                _wait(lambda: _done(run) >= run.num_keys // 5, 300, "a fifth of the run done")
                _stop(redis)
                time.sleep(15)
                redis = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL, start_new_session=True)
                _wait(lambda: run.refresh_from_db() or run.is_final, 600, "the run final")
                time.sleep(3)  # pages after Redis is back
            return self.report("Redis (the web cache) down 15 s", run, watch)
        finally:
            for p in (worker, web, redis, *services.values()):
                if p is not None:
                    _stop(p)

    def hostile(self) -> dict:
        flags = {"hostile_share": 0.01, "hostile_mb": self.args.hostile_mb}
        services = _services(self.agent_port, self.env_port, self.args.calls, self.args.latency_ms, **flags)
        web = worker = None
        try:
            web, worker = self.web("hostile"), self.worker("hostile")
            run = self.run(f"http://127.0.0.1:{self.agent_port}", f"http://127.0.0.1:{self.env_port}")
            with Watch(self.base, "faults", self.pages(run)) as watch:
                watch.roots = [web.pid, worker.pid]
                _wait(lambda: run.refresh_from_db() or run.is_final, 900, "the run final")
                time.sleep(2)
                after = max((_rss_mb(p) for p in _tree(worker.pid)), default=0.0)
            extra = {"worker RSS after the run (MB)": round(after), "agent reply cap (MB)": 64}
            return self.report(f"hostile agent: {self.args.hostile_mb:g} MB on 1% of calls", run, watch, extra)
        finally:
            for p in (worker, web, *services.values()):
                if p is not None:
                    _stop(p)

    def uploads(self) -> dict:
        import httpx

        from rollouts.models import BackgroundTask

        services = _services(self.agent_port, self.env_port, self.args.calls, self.args.latency_ms)
        web = worker = None
        data = self.tmp / "upload.jsonl"
        from benchmarks.bench_upload_rss import write_dataset

        size_mb = write_dataset(data, self.args.upload_rows) / 1024**2
        try:
            web, worker = self.web("uploads"), self.worker("uploads")
            run = self.run(f"http://127.0.0.1:{self.agent_port}", f"http://127.0.0.1:{self.env_port}")
            statuses: dict[str, int | str] = {}

            def upload(user: str) -> None:
                with httpx.Client(base_url=self.base, timeout=300) as client:
                    login(client, user)
                    page = client.get("/runs/new/")
                    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
                    fields = {
                        "csrfmiddlewaretoken": token,
                        "name": f"upload of {user}",
                        "agent_url": f"http://127.0.0.1:{self.agent_port}/",
                        "env_url": f"http://127.0.0.1:{self.env_port}",
                        "agent_name": "remote_agent",
                        "concurrency": "8",
                        "num_repeats": "1",
                        "max_attempts": "3",
                        "remote_responses_timeout_s": "60",
                        "run_timeout_s": "120",
                    }
                    with data.open("rb") as fh:
                        t0 = time.perf_counter()
                        r = client.post(
                            "/runs/new/",
                            data=fields,
                            files={"dataset_file": ("tasks.jsonl", fh, "application/jsonl")},
                            headers={"Referer": self.base + "/runs/new/"},
                        )
                    statuses[user] = f"{r.status_code} in {time.perf_counter() - t0:.1f} s"

            with Watch(self.base, "faults", self.pages(run)) as watch:
                watch.roots = [web.pid, worker.pid]
                _wait(lambda: _done(run) >= run.num_keys // 10, 300, "a tenth of the run done")
                threads = [threading.Thread(target=upload, args=(f"uploader{i}",)) for i in range(3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                _wait(
                    lambda: not BackgroundTask.objects.filter(status__in=BackgroundTask.ACTIVE).exists(),
                    1800,
                    "the uploads' tasks done",
                    step=1,
                )
                _wait(lambda: run.refresh_from_db() or run.is_final, 900, "the run final")
            from rollouts.collection import runs
            from rollouts.models import Run

            for uploaded in Run.objects.exclude(pk=run.pk).filter(status=Run.Status.RUNNING):
                runs.cancel(uploaded)  # the uploads are measured, not the runs they launched
            tasks = [f"{t.status}: {t.message[:80]}" for t in BackgroundTask.objects.order_by("id")]
            extra = {"upload file (MB)": round(size_mb, 1), "upload POSTs": statuses, "upload tasks": tasks}
            return self.report(f"three concurrent uploads of {self.args.upload_rows:,} rows", run, watch, extra)
        finally:
            for p in (worker, web, *services.values()):
                if p is not None:
                    _stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(FAULTS))
    ap.add_argument("--rollouts", type=int, default=300)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=100)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--port", type=int, default=19500)
    ap.add_argument("--redis-port", type=int, default=19579)
    ap.add_argument("--hostile-mb", type=float, default=200)
    ap.add_argument("--upload-rows", type=int, default=50_000)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # the finally blocks stop the servers
    where = h.setup_django("sqlite")
    tmp = Path(os.environ["GYMWEB_DATA_DIR"])
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.core.management import call_command

    settings.STATIC_ROOT = tmp / "static"
    call_command("collectstatic", "--noinput", verbosity=0)
    hashed = make_password(PASSWORD)
    User = get_user_model()
    for name in ("faults", "uploader0", "uploader1", "uploader2"):
        User.objects.create(username=name, password=hashed)
    load = os.getloadavg()
    print(f"fault runs — {h.machine()}; {where}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(
        f"each run: {args.rollouts} rollouts × {args.calls} agent calls, {args.latency_ms:g} ms a call, "
        f"concurrency {args.concurrency}, auto-retry on (max_attempts 3)"
    )
    bench = Bench(args, tmp)
    for fault in args.only.split(","):
        try:
            getattr(bench, fault.strip().replace("-", "_"))()
        except Exception as exc:  # one fault's failure is reported, the others still run
            print(json.dumps({"fault": fault, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; logs in {tmp}")


if __name__ == "__main__":
    tempfile.tempdir = None
    main()
