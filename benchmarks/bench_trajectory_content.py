"""Trajectory page: server time and HTML weight of the rollout page with content rendering (issue
11), on a synthetic 500-item rollout and on NeMo Gym's real traces.

    python -m benchmarks.bench_trajectory_content [--repeat 7] [--repo PATH]   (make bench-trajectory-content)

A fresh SQLite database in a temp dir. Pages go through Django's whole request path (test client,
signed in). ``--repo`` runs the same measurement against another checkout (e.g. a clean clone of main, to
compare with the code before this change): its directory goes first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent.parent / "shared" / "data" / "nemo_gym"


def setup(repo: Path) -> None:
    sys.path.insert(0, str(repo))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gymweb.settings")
    os.environ["GYMWEB_DISPATCH_IN_WORKERS"] = "0"
    os.environ["GYMWEB_DATA_DIR"] = tempfile.mkdtemp(prefix="gymweb-bench-traj-")
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    # No collectstatic here: plain static storage, as the test suite uses.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }

    call_command("migrate", verbosity=0)


def synthetic_500():
    """The query-budget test's shape: 125 steps of reasoning, a call with JSON arguments, a JSON
    tool output and an assistant message."""
    from django.utils import timezone

    from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

    run = Run.objects.create(name="bench 500", status=Run.Status.COMPLETED)
    task = Task.objects.create(run=run, task_index=0, row_json=json.dumps({"responses_create_params": {"input": "go"}}))
    rollout = Rollout.objects.create(
        run=run,
        task=task,
        task_index=0,
        rollout_index=0,
        attempt=1,
        status=Rollout.Status.SUCCEEDED,
        reward=1.0,
        verify_json=json.dumps({"reward": 1.0}),
        finished=timezone.now(),
    )
    now = timezone.now()
    AgentCall.objects.bulk_create(
        AgentCall(rollout=rollout, index=i, started=now, latency_ms=10.0, http_status=200) for i in range(125)
    )
    items = []
    for step in range(125):
        items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking " * 20}]})
        items.append(
            {
                "type": "function_call",
                "call_id": f"c{step}",
                "name": "increment_counter",
                "arguments": json.dumps({"count": step, "note": "x" * 200}),
            }
        )
        items.append(
            {
                "type": "function_call_output",
                "call_id": f"c{step}",
                "output": json.dumps({"success": True, "log": ["line"] * 30}),
            }
        )
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "progress " * 30, "annotations": []}],
            }
        )
    TrajectoryItem.objects.bulk_create(
        TrajectoryItem(
            rollout=rollout, seq=s, step=s // 4, kind=p["type"], call_id=p.get("call_id", ""), payload=p, origin="gym"
        )
        for s, p in enumerate(items)
    )
    return rollout


def timed(client, url: str, repeat: int) -> tuple[float, float, int]:
    """Median wall and process-CPU milliseconds of GET ``url`` (the test client runs the view in
    this process, so CPU time is the server's own work, less sensitive to a busy machine), and the
    HTML's size in bytes."""
    client.get(url)
    times, cpu, size = [], [], 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        size = len(response.content)
    return statistics.median(times), statistics.median(cpu), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--repo", type=Path, default=HERE)
    args = parser.parse_args()
    setup(args.repo.resolve())
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from rollouts.collection.importer import import_rollouts

    user = get_user_model().objects.create_user("bench", password="x" * 12)
    client = Client()
    client.force_login(user)
    pages = []
    long = synthetic_500()
    pages.append(("synthetic, 500 items (125 steps)", reverse("rollout", args=[long.run_id, long.pk])))
    for name in ("mini_swe_agent_2", "tau2", "workplace_assistant", "example_tool_call_multireward"):
        with (SHARED / name / "example_rollouts.jsonl").open("rb") as fh:
            run = import_rollouts(fh).run
        rollouts = list(run.rollouts.order_by("task_index", "rollout_index"))
        biggest = max(rollouts, key=lambda r: r.num_items or 0)
        pages.append((f"{name}, biggest ({biggest.num_items} items)", reverse("rollout", args=[run.pk, biggest.pk])))
    print(f"trajectory benchmark — code: {args.repo}; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}")
    print(f"  {'page':<52} {'wall ms':>9} {'CPU ms':>8} {'HTML KB':>9}")
    for label, url in pages:
        ms, cpu, size = timed(client, url, args.repeat)
        print(f"  {label:<52} {ms:>9.1f} {cpu:>8.1f} {size / 1024:>9.1f}")


if __name__ == "__main__":
    main()
