"""Benchmark 5, the profile of a big run: seed one run of 50,000 rollouts (4 repeats, 10% failed)
whose successes carry a realistic ``/verify`` reply (~4 KB: the task, the merged response with
``usage``), then time ``profile_report.profile_run`` and the profile page (server time, first view with
the cache cleared, and cached).

    python -m benchmarks.bench_profile [--rollouts 50000] [--db sqlite|postgres] [--repeat 3] [--blank] [--pad-kb N]

Successes are stored the way the dispatcher stores them, ``profile_json`` included;
``--blank`` leaves it blank, as for rows written before it existed (``profile_run``'s fallback, which
parses every ``verify_json``). Target: ``profile_run`` well under 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks import _harness as h

TOOLS = [
    {
        "name": "increment_counter",
        "parameters": {
            "type": "object",
            "properties": {"count": {"type": "integer", "description": ""}},
            "required": ["count"],
            "additionalProperties": False,
        },
        "strict": True,
        "type": "function",
        "description": "",
    },
    {
        "name": "get_counter_value",
        "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        "strict": True,
        "type": "function",
        "description": "",
    },
]


def task_row(i: int) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"add {i % 7} then add {i % 5} then get the count"}],
            "tools": TOOLS,
        },
        "expected_count": i % 7 + i % 5,
        "initial_count": 0,
        "_ng_task_index": i,
        "agent_ref": {"name": "remote_agent"},
    }


def verify_reply(i: int, k: int, reward: float, pad_kb: int = 0) -> dict:
    """A counter env's /verify reply: the row, the merged response (3 calls, 2 tool calls), reward;
    ``pad_kb`` KB more of assistant text (long trajectories)."""
    row = {key: value for key, value in task_row(i).items() if not key.startswith("_ng_") and key != "agent_ref"}
    output = []
    for n, count in enumerate((i % 7, i % 5)):
        output.append(
            {
                "arguments": json.dumps({"count": count}),
                "call_id": f"call_{k}_{n}_" + "x" * 20,
                "name": "increment_counter",
                "type": "function_call",
                "id": f"fc_{k}_{n}_" + "0" * 40,
                "status": "completed",
            }
        )
        output.append(
            {
                "call_id": f"call_{k}_{n}_" + "x" * 20,
                "output": json.dumps({"success": True}),
                "type": "function_call_output",
            }
        )
    text = f"The count is {i % 7 + i % 5}. " * 8 + "Let me think about it. " * (pad_kb * 1024 // 23)
    output.append(
        {
            "id": f"msg_{k}_" + "0" * 40,
            "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": []}],
            "role": "assistant",
            "status": "completed",
            "type": "message",
        }
    )
    usage = {
        "input_tokens": 140 + k % 37,
        "input_tokens_details": {"cached_tokens": k % 3},
        "output_tokens": 20 + k % 11,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 160 + k % 37 + k % 11,
    }
    response = {
        "id": f"resp_{k}_" + "0" * 40,
        "created_at": 1757449892.0,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": "gpt-4.1-2025-04-14",
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": TOOLS,
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": None,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "status": "completed",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "truncation": "disabled",
        "usage": usage,
        "user": None,
    }
    return {**row, "response": response, "reward": reward}


def seed(total: int, blank: bool, pad_kb: int = 0):
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from rollouts.models import Rollout, Run, Task

    has_profile_json = hasattr(Rollout, "profile_json")
    if has_profile_json:
        from rollouts.collection.profile_numbers import profile_json_for_verify
    user = get_user_model().objects.create_user("bench", password="bench-password")
    now = timezone.now()
    size = total
    with transaction.atomic():
        run = Run.objects.create(
            name="bench profile",
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
        tasks = Task.objects.bulk_create(
            [Task(run=run, task_index=i, row_json=json.dumps(task_row(i))) for i in range((size + 3) // 4)],
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
                reward = 0.0 if failed else float(k % 3 != 0)
                verify = None if failed else verify_reply(k // 4, k, reward, pad_kb)
                extra = {}
                if has_profile_json and verify is not None and not blank:
                    extra["profile_json"] = profile_json_for_verify(verify)
                chunk.append(
                    Rollout(
                        run=run,
                        task_id=task_ids[k // 4],
                        task_index=k // 4,
                        rollout_index=k % 4,
                        attempt=1,
                        status="failed" if failed else "succeeded",
                        reward=reward,
                        failure_kind="agent_timeout" if failed else "",
                        error="timed out" if failed else "",
                        verify_json="" if failed else json.dumps(verify, ensure_ascii=False),
                        finished=now,
                        started=now,
                        duration_ms=800.0 + k % 50,
                        num_agent_calls=3,
                        num_tool_calls=2,
                        num_items=5,
                        usage_reported=True,
                        input_tokens=100,
                        output_tokens=20,
                        total_tokens=120,
                        cached_tokens=0,
                        reasoning_tokens=0,
                        **extra,
                    )
                )
            Rollout.objects.bulk_create(chunk, batch_size=5000)
    return user, run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=50_000)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--blank", action="store_true", help="leave profile_json blank (rows stored before it existed)")
    parser.add_argument(
        "--pad-kb", type=int, default=0, help="KB of extra assistant text per reply (long trajectories)"
    )
    args = parser.parse_args()

    where = h.setup_django(args.db)
    import warnings

    from django.core.cache import cache
    from django.db.models import Avg, Max
    from django.db.models.functions import Length
    from django.test import Client
    from django.urls import reverse

    from rollouts.evaluation.profile_report import profile_run
    from rollouts.models import Rollout

    t0 = time.perf_counter()
    user, run = seed(args.rollouts, args.blank, args.pad_kb)
    seeded = time.perf_counter() - t0
    succ = Rollout.objects.filter(run=run, status="succeeded")
    sizes = succ.aggregate(verify=Avg(Length("verify_json")), biggest=Max(Length("verify_json")))
    print(f"profile benchmark — {h.machine()}; {where}")
    print(
        f"  seeded run #{run.pk}: {args.rollouts:,} rollouts, {succ.count():,} successes "
        f"(verify_json {sizes['verify']:,.0f} B on average) in {seeded:.0f} s"
        + ("; profile_json blank" if args.blank or not hasattr(Rollout, "profile_json") else "")
    )

    walls, cpus = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile_run(run)  # warm the database's own caches
        for _ in range(args.repeat):
            c0, t0 = time.process_time(), time.perf_counter()
            profile_run(run)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    print(
        f"  profile_run (median of {args.repeat}): {statistics.median(walls) * 1000:,.0f} ms wall, "
        f"{statistics.median(cpus) * 1000:,.0f} ms CPU   (target well under 1,000 ms)"
    )

    client = Client()
    client.force_login(user)
    url = reverse("run_profile", args=[run.pk])
    for label, cold in (("first view (cache cleared)", True), ("cached", False)):
        times = []
        client.get(url)
        for _ in range(args.repeat):
            if cold:
                cache.clear()
            t0 = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, response.status_code
        print(f"  profile page, {label:28s} {statistics.median(times):9,.0f} ms")


if __name__ == "__main__":
    main()
