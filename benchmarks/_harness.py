"""Shared set-up for the benchmarks: a fresh database, the fast services, a dataset, a run."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def setup_django(db: str) -> str:
    """Point Django at a fresh database (``sqlite`` in a temp dir, or ``postgres`` — a new database
    on 127.0.0.1:5432) and migrate it. Returns a description. Call before importing models."""
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gymweb.settings")
    os.environ["GYMWEB_DISPATCH_IN_WORKERS"] = "0"
    # The fast services listen on 127.0.0.1: a local set-up allows local targets (README,
    # "Which hosts a run may reach"); without it every rollout fails with target_refused.
    os.environ["GYMWEB_ALLOW_LOCAL_TARGETS"] = "1"
    if db == "sqlite":
        tmp = tempfile.mkdtemp(prefix="gymweb-bench-")
        os.environ["GYMWEB_DATA_DIR"] = tmp
        os.environ.pop("DATABASE_URL", None)
        where = f"SQLite in {tmp}"
    else:
        import psycopg

        # GYMWEB_BENCH_PG_NAME: a database kept between runs (bench_search --keep), made if missing.
        kept = os.environ.get("GYMWEB_BENCH_PG_NAME", "")
        name = kept or f"gymweb_bench_{os.getpid()}"
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if not kept or not exists:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                conn.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
        where = f"PostgreSQL database {name}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return where


def start_services(
    calls: int, latency_ms: float = 0.0, tool_output_kb: float = 0.0, ports: tuple[int, int] = (0, 0), each: int = 1
):
    """Start the fast agent and env on ``ports`` (agent, env; 0: ``GYMWEB_BENCH_PORT`` and the next
    one when set, for a machine whose users each have a port range, else any free port), each as
    ``each`` processes sharing its port (SO_REUSEPORT; one process holds at most its open-file limit
    of connections). Returns (agent_url, env_url, procs)."""
    procs, urls = [], {}
    base = int(os.environ.get("GYMWEB_BENCH_PORT") or 0)
    if base and ports == (0, 0):
        ports = (base, base + 1)
    for only, port, _ in ((o, p, i) for o, p in zip(("agent", "env"), ports) for i in range(each)):
        if only in urls:
            port = int(urls[only].rsplit(":", 1)[1])
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.fast_services",
                "--only",
                only,
                "--calls",
                str(calls),
                "--latency-ms",
                str(latency_ms),
                "--tool-output-kb",
                str(tool_output_kb),
                f"--{only}-port",
                str(port),
                *(["--reuse-port"] if each > 1 else []),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = proc.stdout.readline()
        urls.setdefault(only, re.search(r"listening on (\S+)", line).group(1))
        procs.append(proc)
    return urls["agent"], urls["env"], procs


def stop(procs) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=10)


def make_run(n: int, agent_url: str, env_url: str, concurrency: int, launch: bool = True, **options):
    """A run of ``n`` distinct tasks (one rollout each), launched unless ``launch`` is false."""
    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl

    tools = [
        {
            "type": "function",
            "name": "increment_counter",
            "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}},
        }
    ]
    lines = [
        json.dumps(
            {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"task {i}: add 1 three times"}],
                    "tools": tools,
                },
                "expected_count": 3,
            }
        )
        for i in range(n)
    ]
    parsed = read_jsonl(lines)
    run = runs.create_run(
        parsed, name="bench", agent_url=agent_url, env_url=env_url, concurrency=concurrency, **options
    )
    if launch:
        runs.launch(run)
    return run


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    return f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}"
