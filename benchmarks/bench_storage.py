"""Benchmark 3, scale of storage: seed 100,000 rollouts and 1,000,000 trajectory items, then time
the pages (server time through Django's full request path) and the export.

    python -m benchmarks.bench_storage [--rollouts 100000] [--items-per-rollout 10] [--db sqlite|postgres] [--repeat 5]

Targets: runs list and run detail < 300 ms, a rollout with 500 items < 150 ms, the profile page's
first view < 1 s (NeMo Gym's profile of the biggest run's 45,000 successes; cached afterwards),
export ≥ 5,000 rows/s with flat memory. The biggest run holds half the rollouts (the worst case for
its pages). Successes are seeded as the dispatcher stores them, ``profile_json`` included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc

from benchmarks import _harness as h


def seed(total: int, items_per: int):
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from rollouts.collection.profile_numbers import profile_json_for_verify
    from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

    user = get_user_model().objects.create_user("bench", password="bench-password")
    sizes = [total // 2] + [total // 2 // 19] * 19
    sizes[-1] += total - sum(sizes)
    now = timezone.now()
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "add 1 then add 2 then get the count"}],
            "tools": [],
        },
        "expected_count": 3,
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
    verify_reply = {
        **row,
        "response": {
            "id": "r",
            "created_at": 0.0,
            "model": "m",
            "object": "response",
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
        },
        "reward": 1.0,
    }
    verify = json.dumps(verify_reply)
    # What the dispatcher stores beside a success's verify_json (the numbers its profile reads).
    profile_json = profile_json_for_verify(verify_reply)
    big_run = None
    for n, size in enumerate(sizes):
        with transaction.atomic():
            run = Run.objects.create(
                name=f"bench run {n}",
                status="completed",
                agent_url="http://127.0.0.1:1",
                env_url="http://127.0.0.1:2",
                created_by=user,
                num_repeats=4,
                num_tasks=size // 4,
                num_keys=size,
                started=now,
                finished=now,
            )
            big_run = big_run or run
            tasks = Task.objects.bulk_create(
                [
                    Task(run=run, task_index=i, row_json=json.dumps({**row, "_ng_task_index": i}))
                    for i in range(size // 4 + 1)
                ],
                batch_size=5000,
            )
            task_ids = (
                [t.pk for t in tasks]
                if tasks[0].pk
                else list(Task.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))
            )
            for start in range(0, size, 5000):
                chunk = []
                for k in range(start, min(size, start + 5000)):
                    failed = k % 10 == 7
                    chunk.append(
                        Rollout(
                            run=run,
                            task_id=task_ids[k // 4],
                            task_index=k // 4,
                            rollout_index=k % 4,
                            attempt=1,
                            status="failed" if failed else "succeeded",
                            reward=0.0 if failed else float(k % 3 != 0),
                            failure_kind="agent_timeout" if failed else "",
                            error="timed out" if failed else "",
                            verify_json="" if failed else verify,
                            profile_json="" if failed else profile_json,
                            finished=now,
                            started=now,
                            duration_ms=800.0 + k % 50,
                            num_agent_calls=4,
                            num_tool_calls=3,
                            num_items=items_per,
                            usage_reported=True,
                            input_tokens=100,
                            output_tokens=20,
                            total_tokens=120,
                            cached_tokens=0,
                            reasoning_tokens=0,
                        )
                    )
                made = Rollout.objects.bulk_create(chunk, batch_size=5000)
                ids = (
                    [r.pk for r in made]
                    if made[0].pk
                    else list(
                        Rollout.objects.filter(run=run).order_by("-id").values_list("id", flat=True)[: len(chunk)]
                    )[::-1]
                )
                AgentCall.objects.bulk_create(
                    [
                        AgentCall(rollout_id=i, index=s, started=now, latency_ms=200.0, http_status=200)
                        for i in ids
                        for s in range(4)
                    ],
                    batch_size=10000,
                )
                TrajectoryItem.objects.bulk_create(
                    [
                        TrajectoryItem(
                            rollout_id=i,
                            seq=s,
                            step=s // 3,
                            kind="function_call" if s % 3 == 0 else "function_call_output" if s % 3 == 1 else "message",
                            origin="agent",
                            payload=output[s % 3],
                        )
                        for i in ids
                        for s in range(items_per)
                    ],
                    batch_size=10000,
                )
    # One rollout with 500 items for the trajectory page.
    long = Rollout.objects.filter(run=big_run).first()
    TrajectoryItem.objects.filter(rollout=long).delete()
    AgentCall.objects.filter(rollout=long).delete()
    AgentCall.objects.bulk_create(
        [AgentCall(rollout=long, index=s, started=now, latency_ms=200.0, http_status=200) for s in range(167)]
    )
    TrajectoryItem.objects.bulk_create(
        [
            TrajectoryItem(
                rollout=long, seq=s, step=s // 3, kind=output[s % 3]["type"], origin="agent", payload=output[s % 3]
            )
            for s in range(500)
        ]
    )
    return user, big_run, long


def timed(client, url: str, repeat: int, cold: bool) -> float:
    """Median server time (ms) of GET ``url``; ``cold`` clears Django's cache before each request
    (the run page caches aggregates of finished attempts), so it is a first view every time."""
    from django.core.cache import cache

    client.get(url)  # warm the database's own caches
    times = []
    for _ in range(repeat):
        if cold:
            cache.clear()
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(times)


def profile_run_ms(run, repeat: int) -> float:
    """Median time (ms) of ``profile_report.profile_run(run)``: the profile page's computation alone."""
    import warnings

    from rollouts.evaluation.profile_report import profile_run

    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NeMo Gym's notes about the repeats
        for _ in range(repeat):
            t0 = time.perf_counter()
            profile_run(run)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--items-per-rollout", type=int, default=10)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    where = h.setup_django(args.db)
    from django.test import Client
    from django.urls import reverse

    from rollouts.models import Rollout, TrajectoryItem

    t0 = time.perf_counter()
    user, run, long = seed(args.rollouts, args.items_per_rollout)
    seeded = time.perf_counter() - t0
    print(f"storage benchmark — {h.machine()}; {where}")
    print(
        f"  seeded {Rollout.objects.count():,} rollouts and {TrajectoryItem.objects.count():,} items in {seeded:.0f} s; biggest run #{run.pk} holds {Rollout.objects.filter(run=run).count():,}"
    )

    client = Client()
    client.force_login(user)
    pages = [
        ("runs list", reverse("runs"), 300),
        ("run detail (biggest run)", reverse("run", args=[run.pk]), 300),
        (
            "run detail, filtered failed + sorted by reward",
            reverse("run", args=[run.pk]) + "?status=failed&sort=-reward",
            300,
        ),
        ("rollout with 500 items", reverse("rollout", args=[run.pk, long.pk]), 150),
        # NeMo Gym's profile of 45,000 success rows: a first view computes it (profile_run), then
        # it is cached under the run's finished counts.
        ("profile page (biggest run)", reverse("run_profile", args=[run.pk]), 1000),
    ]
    print(
        f"  {'page (median of ' + str(args.repeat) + ')':48s} {'first view':>12s} {'cached':>10s}   target (first view)"
    )
    for label, url, target in pages:
        cold, warm = timed(client, url, args.repeat, True), timed(client, url, args.repeat, False)
        print(f"  {label:48s} {cold:9.1f} ms {warm:7.1f} ms   < {target} ms {'ok' if cold < target else 'MISS'}")
    print(f"  profile_run (biggest run), median of {args.repeat}: {profile_run_ms(run, args.repeat):,.0f} ms")

    url = reverse("run_export", args=[run.pk, "rollouts"])
    t0 = time.perf_counter()
    rows = sum(chunk.count(b"\n") for chunk in client.get(url).streaming_content)
    elapsed = time.perf_counter() - t0
    # Memory on a second pass (tracemalloc slows the first): flat means it does not grow with rows.
    tracemalloc.start()
    peaks = []
    for n, chunk in enumerate(client.get(url).streaming_content):
        if n in (100, 1000, 10000):
            peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"  export rollouts.jsonl: {rows:,} rows in {elapsed:.2f} s = {rows / elapsed:,.0f} rows/s (target ≥ 5,000)")
    print(
        f"  export peak Python memory {peak / 2**20:.1f} MB; after 100/1,000/10,000 chunks: "
        + " / ".join(f"{p:.1f}" for p in peaks)
        + " MB"
    )


if __name__ == "__main__":
    main()
