"""Benchmark 7, the trajectory page (issue 11): server time and HTML weight of a rollout page with
its outline, folding wrappers and search, and of its live tail.

    python -m benchmarks.bench_trajectory_page [--db sqlite|postgres] [--repeat 15] [--items 500]

Seeds, in a fresh database, the 500-item rollout of benchmark 3 (167 timed steps of call, output,
message: same payloads) and NeMo Gym's real mini_swe_agent_2 task 0 (55 items; imported) when
its example file is beside the checkout (or ``GYMWEB_NEMO_GYM_DATA``). Reports the median server
time of GET (Django test client: view + template, no network) and the HTML's size in bytes, for
the page, the page with ``?q=`` and a running attempt's live poll (changed and unchanged).
Target: the 500-item page under 150 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks._harness import REPO, setup_django


def seed(items: int):
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

    user = get_user_model().objects.create_user("bench", password="bench-password")
    now = timezone.now()
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "add 1 then add 2 then get the count"}],
            "tools": [],
        }
    }
    output = [
        {"type": "function_call", "call_id": "c1", "name": "increment_counter", "arguments": '{"count": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"success": true}'},
        {
            "type": "message",
            "role": "assistant",
            "id": "m",
            "content": [{"type": "output_text", "text": "The count is 3.", "annotations": []}],
        },
    ]
    run = Run.objects.create(
        name="bench",
        status="completed",
        agent_url="http://127.0.0.1:1",
        env_url="http://127.0.0.1:2",
        created_by=user,
        num_tasks=2,
        num_keys=2,
        started=now,
        finished=now,
    )
    task = Task.objects.create(run=run, task_index=0, row_json=json.dumps({**row, "_ng_task_index": 0}))
    made = []
    for status in ("succeeded", "running"):
        r = Rollout.objects.create(
            run=run,
            task=task,
            task_index=0,
            rollout_index=len(made),
            status=status,
            reward=1.0,
            verify_json=json.dumps({**row, "reward": 1.0, "response": {"output": []}}),
            started=now,
        )
        steps = (items + 2) // 3
        AgentCall.objects.bulk_create(
            [
                AgentCall(
                    rollout=r, index=s, started=now + timedelta(milliseconds=300 * s), latency_ms=200.0, http_status=200
                )
                for s in range(steps)
            ]
        )
        TrajectoryItem.objects.bulk_create(
            [
                TrajectoryItem(
                    rollout=r,
                    seq=s,
                    step=s // 3,
                    kind=output[s % 3]["type"],
                    call_id=output[s % 3].get("call_id", ""),
                    origin="gym" if s % 3 == 1 else "agent",
                    latency_ms=40.0 if s % 3 == 1 else None,
                    tool_status=200 if s % 3 == 1 else None,
                    payload=output[s % 3],
                )
                for s in range(items)
            ]
        )
        made.append(r)
    return user, run, made[0], made[1]


def seed_mini_swe(user):
    data = (
        Path(os.environ.get("GYMWEB_NEMO_GYM_DATA") or REPO.parent / "shared" / "data" / "nemo_gym")
        / "mini_swe_agent_2"
        / "example_rollouts.jsonl"
    )
    if not data.exists():
        return None
    from rollouts.collection.importer import import_rollouts
    from rollouts.models import Rollout

    with data.open("rb") as fh:
        run = import_rollouts(fh, source=data.name, user=user).run
    return Rollout.objects.get(run=run, task_index=0)


def timed(client, url: str, repeat: int, status: int = 200) -> tuple[float, float, int]:
    """Median server time (ms, wall clock and this process's CPU: on a shared machine the CPU time
    is the steadier figure) of GET ``url`` and the body's size in bytes."""
    client.get(url)
    times, cpu, size = [], [], 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        assert response.status_code == status, (url, response.status_code)
        size = len(response.content)
    return statistics.median(times), statistics.median(cpu), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--items", type=int, default=500)
    args = parser.parse_args()
    where = setup_django(args.db)
    print(f"benchmark 7, trajectory page: {where}")
    from django.conf import settings
    from django.core.management import call_command

    if not (Path(settings.STATIC_ROOT) / "staticfiles.json").exists():  # pages name hashed static files
        call_command("collectstatic", interactive=False, verbosity=0)
    from django.test import Client
    from django.urls import reverse

    user, run, long, running = seed(args.items)
    mini = seed_mini_swe(user)
    client = Client()
    client.force_login(user)
    live = reverse("rollout_live", args=[run.pk, running.pk])
    from rollouts.web.trajectory_views import live_signature

    steps = (args.items + 2) // 3
    pages = [
        (f"rollout with {args.items} items", reverse("rollout", args=[run.pk, long.pk]), 200, 150),
        ("  the same with ?q=count", reverse("rollout", args=[run.pk, long.pk]) + "?q=count", 200, 150),
        (
            f"running rollout ({args.items} items), live tail page",
            reverse("rollout", args=[run.pk, running.pk]),
            200,
            150,
        ),
        (
            "  live poll, nothing new (204)",
            f"{live}?from={steps - 1}&seen={live_signature('running', args.items, steps)}",
            204,
            None,
        ),
        ("  live poll, something new", f"{live}?from={steps - 1}&seen=running.0.0", 200, None),
    ]
    if mini is not None:
        pages.append(
            ("mini_swe_agent_2 task 0 (55 items, real)", reverse("rollout", args=[mini.run_id, mini.pk]), 200, 150)
        )
    print(f"  {'page (median of ' + str(args.repeat) + ')':52s} {'server':>10s} {'CPU':>10s} {'HTML':>12s}   target")
    for label, url, status, target in pages:
        ms, cpu, size = timed(client, url, args.repeat, status)
        verdict = f"< {target} ms {'ok' if ms < target else 'MISS'}" if target else ""
        print(f"  {label:52s} {ms:7.1f} ms {cpu:7.1f} ms {size:>10,} B   {verdict}")


if __name__ == "__main__":
    main()
