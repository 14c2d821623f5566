"""Benchmark 7, a busy team: gunicorn serves gymweb (DEBUG off, the README's production settings)
while a worker (``qcluster``) collects a 2,000-rollout run against the fast services, and 20
signed-in users browse for 60 s. Prints per-page p50/p95 and the collection rate (rollouts/s)
without browsing (run A) and with browsing (run B).

    python -m benchmarks.bench_team [--db sqlite|postgres] [--rollouts 2000] [--users 20]
        [--browse-s 60] [--gunicorn-workers 5] [--port 9300] [--redis-url redis://127.0.0.1:6379/0]

Every process talks to 127.0.0.1 only; every request loop is bounded in time and stops by itself.

The simulated users behave as a browser on gymweb's pages does: each opens a page, fetches what the
page's markup loads by itself (the run page's charts and evaluation sections), makes the polls its
markup asks for while it stays there (the live partial every 2 s with ``seen=``, re-fetching the
rollout table when the answer says ``rollouts-changed``; the charts every 10 s; the runs list
every 5 s while a run is active), and after a 3–8 s stay clicks on to another page: the live
run's page (most often), the runs list, a rollout page, the run's profile page, the finished run's
page. Static files are left out (browsers keep them: hashed names, cached for good).

Collection rate = rollouts / (last ``finished`` − first ``started``) of the run's rows, so the
worker's start-up and polling delay are left out.

With ``--db postgres`` the worker's queue is Redis (``--redis-url``, default ``$GYMWEB_REDIS_URL``
or db 0) and the database a fresh one on 127.0.0.1:5432, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import _harness as h

PASSWORD = "bench-team-password-1"
PAGES_WITH_TARGET = (
    "runs list",
    "run page",
    "live partial",
    "table partial",
    "charts partial",
    "evaluation partial",
    "rollout page",
)


# -- processes -------------------------------------------------------------------------------------
def _server_env(args, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "gymweb.settings",
            "GYMWEB_DEBUG": "0",
            "GYMWEB_SECRET_KEY": secrets.token_urlsafe(50),
            "GYMWEB_ALLOWED_HOSTS": "127.0.0.1",
            "GYMWEB_CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}",
            "GYMWEB_ALLOW_LOCAL_TARGETS": "1",
            "GYMWEB_DISPATCH_IN_WORKERS": "1",
            "GYMWEB_Q_NAME": f"gymweb-bench-team-{os.getpid()}",
            "GYMWEB_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if args.db == "postgres":
        env["GYMWEB_REDIS_URL"] = args.redis_url
        env["GYMWEB_CACHE_URL"] = args.cache_url or args.redis_url  # the benchmark never clears it
    else:
        env.pop("GYMWEB_REDIS_URL", None)
    return env


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")
    return subprocess.Popen(cmd, cwd=h.REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its living descendants (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early; its log ({log}):\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit(f"server did not answer on {url} within {timeout} s")


def _wait_worker(proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    """Until a dispatcher has sent its first heartbeat (the worker is ready to claim)."""
    from rollouts.models import Worker

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"qcluster exited early; its log ({log}):\n{log.read_text()[-3000:]}")
        if Worker.objects.exists():
            return
        time.sleep(0.3)
    raise SystemExit("no dispatcher heartbeat from qcluster")


def _wait_final(run, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_final:
            return
        time.sleep(0.5)
    raise SystemExit(f"run {run.pk} not final after {timeout} s (status {run.status})")


def _collection_rate(run) -> tuple[float, float, float]:
    """(rollouts/s, first started, last finished) over the run's rows (epoch seconds)."""
    from django.db.models import Max, Min

    from rollouts.models import Rollout

    agg = Rollout.objects.filter(run=run).aggregate(t0=Min("started"), t1=Max("finished"), n=Min("id"))
    n = Rollout.objects.filter(run=run, status__in=("succeeded", "failed")).count()
    t0, t1 = agg["t0"].timestamp(), agg["t1"].timestamp()
    return n / max(t1 - t0, 1e-6), t0, t1


# -- simulated users -------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # page → (t_start, seconds, status)
        self.errors: dict[str, int] = defaultdict(int)

    def add(self, page: str, t0: float, seconds: float, status: int) -> None:
        self.samples[page].append((t0, seconds, status))
        if status >= 400:
            self.errors[page] += 1


_SEEN = re.compile(r'seen=([^"&]+)"')


class User:
    """One signed-in browser: pages, the partials they load, the polls their markup asks for."""

    def __init__(
        self,
        client,
        rec: Recorder,
        live_run: int,
        done_run: int,
        rollout_ids: list[int],
        deadline: float,
        rng: random.Random,
    ):
        self.c, self.rec, self.live_run, self.done_run = client, rec, live_run, done_run
        self.rollout_ids, self.deadline, self.rng = rollout_ids, deadline, rng

    async def get(self, page: str, url: str, target: str = "", current: str = "") -> tuple[int, str, dict]:
        """GET as the browser does; ``target`` (the id of the element htmx swaps) makes it an htmx
        request with htmx's headers."""
        headers = (
            {
                "HX-Request": "true",
                "HX-Current-URL": str(self.c.base_url) + (current or url),
                "HX-Target": target,
                "HX-Trigger": target,
            }
            if target
            else {}
        )
        t0 = time.time()
        start = time.perf_counter()
        try:
            r = await self.c.get(url, headers=headers)
            text, status, rh = r.text, r.status_code, r.headers
        except Exception as exc:  # a refused or timed-out request counts as an error, not a crash
            text, status, rh = repr(exc), 599, {}
        self.rec.add(page, t0, time.perf_counter() - start, status)
        return status, text, rh

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    async def stay(self, seconds: float, polls: list[tuple[float, callable]]) -> None:
        """Stay on a page for ``seconds``, running each poll every its period."""
        end = min(time.monotonic() + seconds, self.deadline)
        due = [time.monotonic() + period for period, _ in polls]
        while True:
            now = time.monotonic()
            nxt = min(due + [end])
            if nxt >= end:
                await asyncio.sleep(max(0.0, end - now))
                return
            await asyncio.sleep(max(0.0, nxt - now))
            for i, (period, poll) in enumerate(polls):
                if due[i] <= time.monotonic():
                    due[i] = time.monotonic() + period
                    if time.monotonic() < end:
                        await poll()

    async def run_page(self, run_id: int) -> None:
        url = f"/runs/{run_id}/"
        status, text, _ = await self.get("run page", url)
        if status != 200:
            return
        live = 'hx-get="/runs/%d/live/' % run_id in text
        await self.get("charts partial", f"/runs/{run_id}/charts/", target="run-charts", current=url)
        await self.get("evaluation partial", f"/runs/{run_id}/evaluation/", target="evaluation", current=url)
        state = {"seen": (_SEEN.search(text).group(1) if _SEEN.search(text) else None), "live": live}

        async def poll_live():
            if not state["live"]:
                return
            q = f"?seen={state['seen']}" if state["seen"] else ""
            status, body, headers = await self.get(
                "live partial", f"/runs/{run_id}/live/{q}", target="run-live", current=url
            )
            if status == 200:
                m = _SEEN.search(body)
                state["seen"] = m.group(1) if m else state["seen"]
                state["live"] = 'hx-get="/runs/%d/live/' % run_id in body
            if "rollouts-changed" in headers.get("HX-Trigger", ""):
                await self.get("table partial", url, target="rollout-table", current=url)

        async def poll_charts():
            if state["live"]:
                await self.get("charts partial", f"/runs/{run_id}/charts/", target="run-charts", current=url)

        await self.stay(self.rng.uniform(3, 8), [(2.0, poll_live), (10.0, poll_charts)])

    async def runs_list(self) -> None:
        status, text, _ = await self.get("runs list", "/")
        active = 'hx-trigger="every 5s"' in text

        async def poll():
            if active:
                await self.get("runs list poll", "/", target="run-list")

        await self.stay(self.rng.uniform(3, 8), [(5.0, poll)])

    async def rollout_page(self) -> None:
        rid = self.rng.choice(self.rollout_ids)
        await self.get("rollout page", f"/runs/{self.live_run}/rollouts/{rid}/")
        await self.stay(self.rng.uniform(3, 8), [])

    async def profile_page(self) -> None:
        await self.get("profile page", f"/runs/{self.live_run}/profile/")
        await self.stay(self.rng.uniform(3, 8), [])

    async def browse(self) -> None:
        await asyncio.sleep(self.rng.uniform(0, 3))  # users do not all arrive in the same instant
        choices = [
            (self.live_run_page, 40),
            (self.runs_list, 15),
            (self.rollout_page, 25),
            (self.profile_page, 10),
            (self.done_run_page, 10),
        ]
        while self._left() > 0:
            action = self.rng.choices([a for a, _ in choices], weights=[w for _, w in choices])[0]
            await action()

    async def live_run_page(self) -> None:
        await self.run_page(self.live_run)

    async def done_run_page(self) -> None:
        await self.run_page(self.done_run)


async def _sign_in(client, username: str) -> None:
    r = await client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', r.text).group(1)
    r = await client.post(
        "/accounts/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": str(client.base_url) + "/accounts/login/"},
    )
    if r.status_code != 302:
        raise SystemExit(f"sign-in of {username} failed: {r.status_code}")


async def _browse(
    base: str, users: list[str], live_run: int, done_run: int, rollout_ids: list[int], seconds: float, on_start
) -> Recorder:
    import httpx

    rec = Recorder()
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    clients = [httpx.AsyncClient(base_url=base, timeout=300, limits=limits, follow_redirects=False) for _ in users]
    try:
        # Four at a time: each sign-in hashes the password (slow on purpose), and on a busy machine
        # twenty at once take minutes.
        gate = asyncio.Semaphore(4)

        async def sign_in(client, user):
            async with gate:
                await _sign_in(client, user)

        await asyncio.gather(*(sign_in(c, u) for c, u in zip(clients, users)))
        await asyncio.to_thread(on_start)
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            *(
                User(c, rec, live_run, done_run, rollout_ids, deadline, random.Random(i)).browse()
                for i, c in enumerate(clients)
            )
        )
    finally:
        for c in clients:
            await c.aclose()
    return rec


# -- report ----------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = max(0, min(len(values) - 1, int(round(q / 100 * (len(values) - 1)))))
    return values[k]


def _report(rec: Recorder, window: tuple[float, float]) -> None:
    print(
        f"  {'page':<20} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'errors':>6}   during collection: {'n':>4} {'p95 ms':>7}   target"
    )
    order = [
        "runs list",
        "runs list poll",
        "run page",
        "live partial",
        "table partial",
        "charts partial",
        "evaluation partial",
        "rollout page",
        "profile page",
    ]
    for page in order + sorted(set(rec.samples) - set(order)):
        rows = rec.samples.get(page, [])
        if not rows:
            continue
        ms = [s * 1000 for _, s, _ in rows]
        during = [s * 1000 for t, s, _ in rows if window[0] <= t <= window[1]]
        target = "p95 < 500" if page in PAGES_WITH_TARGET or page == "runs list poll" else "—"
        mark = ("ok" if _pct(ms, 95) < 500 else "MISS") if target != "—" else ""
        print(
            f"  {page:<20} {len(ms):>5} {_pct(ms, 50):>8.0f} {_pct(ms, 95):>8.0f} {max(ms):>8.0f} {rec.errors.get(page, 0):>6}"
            f"   {'':>18}{len(during):>4} {_pct(during, 95) if during else float('nan'):>7.0f}   {target} {mark}"
        )


def _page_of(method: str, path: str, query: str, target: str) -> str:
    """The benchmark's page name of one access-log line."""
    if re.fullmatch(r"/runs/\d+/live/", path):
        return "live partial"
    if re.fullmatch(r"/runs/\d+/charts/", path):
        return "charts partial"
    if re.fullmatch(r"/runs/\d+/evaluation/", path):
        return "evaluation partial"
    if re.fullmatch(r"/runs/\d+/profile/", path):
        return "profile page"
    if re.fullmatch(r"/runs/\d+/rollouts/\d+/", path):
        return "rollout page"
    if re.fullmatch(r"/runs/\d+/", path):
        return "table partial" if target == "rollout-table" else "run page"
    if path == "/":
        return "runs list poll" if target == "run-list" else "runs list"
    return f"{method} {path}"


def _server_report(log: Path, window: tuple[float, float]) -> None:
    """Per page, the server's own time (gunicorn's %(D)s: from accepting the request to the last
    byte), over the browsing window."""
    times: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        parts = line.split("|")
        if len(parts) != 7:
            continue
        _, method, path, query, status, micros, target = parts
        if target == "-":
            target = ""
        times[_page_of(method, path, query, target)].append(int(micros) / 1000)
    print("  server time (gunicorn, accept → last byte), ms:")
    for page in sorted(times, key=lambda p: -statistics.median(times[p])):
        if page.startswith(("GET /accounts", "POST /accounts")):
            continue
        ms = times[page]
        print(f"    {page:<20} n {len(ms):>5}   p50 {_pct(ms, 50):7.0f}   p95 {_pct(ms, 95):7.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--browse-s", type=float, default=60.0)
    parser.add_argument("--gunicorn-workers", type=int, default=5)
    parser.add_argument("--gunicorn-args", default="", help="extra gunicorn arguments, e.g. '--threads 4'")
    parser.add_argument("--port", type=int, default=int(os.environ.get("BENCH_PORT", 9300)))
    parser.add_argument("--redis-url", default=os.environ.get("GYMWEB_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument(
        "--cache-url",
        default=os.environ.get("GYMWEB_CACHE_URL", ""),
        help="Redis for Django's cache with --db postgres (default: --redis-url)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (logs, SQLite file)")
    args = parser.parse_args()
    # SIGTERM (a stopped benchmark) stops the servers it started too (the ``finally`` below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

    os.environ["GYMWEB_ALLOW_LOCAL_TARGETS"] = "1"
    if args.db == "postgres":
        os.environ["GYMWEB_REDIS_URL"] = args.redis_url
    where = h.setup_django(args.db)
    tmp = Path(os.environ.get("GYMWEB_DATA_DIR") or __import__("tempfile").mkdtemp(prefix="gymweb-bench-team-"))
    os.environ["GYMWEB_DATA_DIR"] = str(tmp)
    os.environ["GYMWEB_STATIC_ROOT"] = str(tmp / "static")
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from rollouts.models import Rollout

    settings.STATIC_ROOT = tmp / "static"
    call_command("collectstatic", "--noinput", verbosity=0)
    User_ = get_user_model()
    users = [f"user{i:02d}" for i in range(args.users)]
    from django.contrib.auth.hashers import make_password

    hashed = make_password(PASSWORD)  # once: the hasher is slow on purpose
    User_.objects.bulk_create([User_(username=name, password=hashed) for name in users])

    base = f"http://127.0.0.1:{args.port}"
    env = _server_env(args, args.port)
    gunicorn = [
        str(Path(sys.executable).parent / "gunicorn"),
        "gymweb.wsgi",
        "--bind",
        f"127.0.0.1:{args.port}",
        "--workers",
        str(args.gunicorn_workers),
        "--timeout",
        "300",
        *args.gunicorn_args.split(),
        # Server-side time of each request (µs), to tell the server's time from the driver's.
        "--access-logfile",
        str(tmp / "access.log"),
        "--access-logformat",
        "%(t)s|%(m)s|%(U)s|%(q)s|%(s)s|%(D)s|%({hx-target}i)s",
    ]
    qcluster = [sys.executable, "manage.py", "qcluster"]
    agent_url, env_url, services = h.start_services(args.calls)
    web = worker = None
    try:
        web = _start(gunicorn, env, tmp / "gunicorn.log")
        worker = _start(qcluster, env, tmp / "qcluster.log")
        _wait_http(base + "/accounts/login/", web, tmp / "gunicorn.log")
        _wait_worker(worker, tmp / "qcluster.log")

        # A: collection alone.
        run_a = h.make_run(args.rollouts, agent_url, env_url, args.concurrency)
        _wait_final(run_a, timeout=1800)
        rate_a, _, _ = _collection_rate(run_a)
        print(f"  (collection alone: {rate_a:.1f} rollouts/s; now browsing)", flush=True)

        # B: the same collection while the team browses (users signed in first; the run starts
        # as the browsing starts).
        from rollouts.collection import runs as runs_mod

        run_b = h.make_run(args.rollouts, agent_url, env_url, args.concurrency, launch=False)
        ids = list(Rollout.objects.filter(run=run_b).values_list("id", flat=True))
        browse_t0 = time.time()
        web_cpu0, worker_cpu0 = _tree_cpu_s(web.pid), _tree_cpu_s(worker.pid)
        rec = asyncio.run(_browse(base, users, run_b.pk, run_a.pk, ids, args.browse_s, lambda: runs_mod.launch(run_b)))
        browse_window = (browse_t0, time.time())
        web_cpu = _tree_cpu_s(web.pid) - web_cpu0
        _wait_final(run_b, timeout=1800)
        rate_b, t0, t1 = _collection_rate(run_b)
        worker_cpu_b = _tree_cpu_s(worker.pid) - worker_cpu0
        worker_cpu1 = _tree_cpu_s(worker.pid)
        print(f"  (collection + browsing: {rate_b:.1f} rollouts/s; collection alone again)", flush=True)
        # A again: the machine is shared, so the rate alone is taken before and after B.
        run_a2 = h.make_run(args.rollouts, agent_url, env_url, args.concurrency)
        _wait_final(run_a2, timeout=1800)
        rate_a2, _, _ = _collection_rate(run_a2)
        worker_cpu_a2 = _tree_cpu_s(worker.pid) - worker_cpu1
    finally:
        for proc in (web, worker):
            if proc is not None:
                _stop(proc)
        h.stop(services)

    print(
        f"busy-team benchmark — {h.machine()}; {where}; gunicorn {' '.join(gunicorn[2:])}; qcluster workers {settings.Q_CLUSTER['workers']}"
    )
    print(
        f"  {args.users} users browsing {args.browse_s:.0f} s; runs of {args.rollouts} rollouts × {args.calls} agent calls, concurrency {args.concurrency}"
    )
    alone = (rate_a + rate_a2) / 2
    print(f"  collection alone       {rate_a:7.1f} rollouts/s before, {rate_a2:.1f} after (mean {alone:.1f})")
    print(
        f"  collection + browsing  {rate_b:7.1f} rollouts/s  ({100 * rate_b / alone:.0f}% of alone; target ≥ 90%)  [{t1 - t0:.1f} s]"
    )
    total = sum(len(v) for v in rec.samples.values())
    print(
        f"  requests {total} ({total / args.browse_s:.1f}/s); web CPU while browsing {web_cpu:.1f} s = {1000 * web_cpu / max(total, 1):.0f} ms per request"
    )
    print(
        f"  worker CPU per rollout: {1000 * worker_cpu_b / args.rollouts:.1f} ms with browsing, {1000 * worker_cpu_a2 / args.rollouts:.1f} ms alone (idle polling included)"
    )
    print(f"  load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (other sessions' work included)")
    _report(rec, (t0, t1))
    _server_report(tmp / "access.log", browse_window)
    if args.db == "postgres":
        from django.db import connection

        name = connection.settings_dict["NAME"]
        connection.close()
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if args.keep:
        print(f"  logs and files in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
