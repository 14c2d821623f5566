"""Archive, restore and delete of a large run: time, the longest write transaction, and how long a
concurrent writer waited at most (``rollouts.collection.archive``).

    python -m benchmarks.bench_archive [--rollouts 100000] [--items-per-rollout 6] [--db sqlite|postgres]

Seeds one finished run of ``--rollouts`` rollouts (9 in 10 succeeded, 1 in 10 failed) as the
dispatcher stores them (``verify_json`` with the merged response, ``profile_json``, agent calls,
trajectory items whose payloads are the response's output items), and a small second run. Then:
archive the big run, check its plain ``rollouts.jsonl`` download against the one before archiving
(SHA-256), restore it, check again, delete it, and check the small run is untouched. Meanwhile a
second process commits one small write (a ``Worker`` row) every 20 ms and records its longest
wait: what a worker storing results would feel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

from benchmarks import _harness as h


def seed(total: int, items_per: int, tag: str = "big"):
    from django.db import transaction
    from django.utils import timezone

    from rollouts.collection.profile_numbers import profile_json_for_verify
    from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

    now = timezone.now()
    text = "The counter now reads {n}; the next call adds one more and checks the total against the task. " * 3
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "add 1 three times, then read the count"}],
            "tools": [],
        },
        "expected_count": 3,
    }
    n_tasks = max(1, total // 4)
    run = Run.objects.create(
        name=f"bench archive {tag}",
        status="completed",
        agent_url="http://127.0.0.1:1",
        env_url="http://127.0.0.1:2",
        num_repeats=4,
        num_tasks=n_tasks,
        num_keys=total,
        started=now,
        finished=now,
    )
    tasks = Task.objects.bulk_create(
        [Task(run=run, task_index=i, row_json=json.dumps({**row, "_ng_task_index": i})) for i in range(n_tasks)],
        batch_size=5000,
    )
    task_ids = (
        [t.pk for t in tasks]
        if tasks[0].pk
        else list(Task.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))
    )
    step = 2000
    for start in range(0, total, step):
        with transaction.atomic():
            chunk, outputs = [], []
            for k in range(start, min(total, start + step)):
                output = []
                for s in range(items_per):
                    kind = s % 3
                    if kind == 0:
                        output.append(
                            {
                                "type": "function_call",
                                "call_id": f"c{k}_{s}",
                                "name": "increment_counter",
                                "arguments": json.dumps({"count": s}),
                            }
                        )
                    elif kind == 1:
                        output.append(
                            {
                                "type": "function_call_output",
                                "call_id": f"c{k}_{s - 1}",
                                "output": json.dumps({"success": True, "note": text.format(n=s)}),
                            }
                        )
                    else:
                        output.append(
                            {
                                "type": "message",
                                "role": "assistant",
                                "id": f"m{k}_{s}",
                                "status": "completed",
                                "content": [{"type": "output_text", "text": text.format(n=k), "annotations": []}],
                            }
                        )
                failed = k % 10 == 7
                verify = {
                    **row,
                    "response": {
                        "id": f"r{k}",
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
                chunk.append(
                    Rollout(
                        run=run,
                        task_id=task_ids[min(k // 4, n_tasks - 1)],
                        task_index=min(k // 4, n_tasks - 1),
                        rollout_index=k % 4 if k // 4 < n_tasks else k - 4 * (n_tasks - 1),
                        attempt=1,
                        status="failed" if failed else "succeeded",
                        reward=0.0 if failed else 1.0,
                        failure_kind="agent_timeout" if failed else "",
                        error="timed out" if failed else "",
                        verify_json="" if failed else json.dumps(verify),
                        profile_json="" if failed else profile_json_for_verify(verify),
                        partial_response_json=json.dumps(verify["response"]) if failed else "",
                        finished=now,
                        started=now,
                        duration_ms=800.0 + k % 50,
                        num_agent_calls=items_per // 3 + 1,
                        num_tool_calls=items_per // 3,
                        num_items=items_per,
                        usage_reported=True,
                        input_tokens=100,
                        output_tokens=20,
                        total_tokens=120,
                        cached_tokens=0,
                        reasoning_tokens=0,
                    )
                )
                outputs.append(output)
            made = Rollout.objects.bulk_create(chunk)
            ids = (
                [r.pk for r in made]
                if made[0].pk
                else list(Rollout.objects.filter(run=run).order_by("-id").values_list("id", flat=True)[: len(chunk)])[
                    ::-1
                ]
            )
            AgentCall.objects.bulk_create(
                [
                    AgentCall(
                        rollout_id=i,
                        index=s,
                        started=now,
                        latency_ms=200.0,
                        http_status=200,
                        model="m",
                        usage={"input_tokens": 30, "output_tokens": 5},
                    )
                    for i in ids
                    for s in range(items_per // 3 + 1)
                ],
                batch_size=5000,
            )
            TrajectoryItem.objects.bulk_create(
                [
                    TrajectoryItem(
                        rollout_id=i,
                        seq=s,
                        step=s // 3,
                        kind=item["type"],
                        call_id=item.get("call_id", ""),
                        name=item.get("name", ""),
                        origin="gym" if item["type"] == "function_call_output" else "agent",
                        asked=item["type"] == "function_call",
                        latency_ms=3.0 if item["type"] == "function_call_output" else None,
                        payload=item,
                    )
                    for i, output in zip(ids, outputs)
                    for s, item in enumerate(output)
                ],
                batch_size=5000,
            )
    return run


PROBE = r"""
import json, sys, time, os
vendor, target, row_id, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if vendor == "sqlite":
    import sqlite3
    conn = sqlite3.connect(target, timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=30000")
    begin, commit, sql = "BEGIN IMMEDIATE", "COMMIT", "UPDATE rollouts_worker SET inflight = ? WHERE id = ?"
else:
    import psycopg
    conn = psycopg.connect(target, autocommit=True)
    begin, commit, sql = "BEGIN", "COMMIT", "UPDATE rollouts_worker SET inflight = %s WHERE id = %s"
longest, writes, errors = 0.0, 0, []
while not os.path.exists(stop):
    t0 = time.perf_counter()
    try:
        conn.execute(begin)
        conn.execute(sql, (writes % 1000, row_id))
        conn.execute(commit)
    except Exception as exc:
        errors.append(str(exc))
        try:
            conn.execute("ROLLBACK")
        except Exception:
            pass
    longest = max(longest, time.perf_counter() - t0)
    writes += 1
    time.sleep(0.02)
print(json.dumps({"longest_s": longest, "writes": writes, "errors": errors[:3]}))
"""


def measure(fn):
    """``(fn(), probe)``: ``fn`` run while another process commits one small write (a ``Worker``
    row) every 20 ms; ``probe``: its longest write in seconds (the wait for the lock included),
    the writes made and the first errors."""
    import subprocess
    import sys
    import tempfile
    from types import SimpleNamespace

    from django.db import connection
    from django.utils import timezone

    from rollouts.models import Worker

    w, _ = Worker.objects.get_or_create(
        name=f"probe-{os.getpid()}", defaults=dict(host="bench", pid=os.getpid(), last_seen=timezone.now())
    )
    s = connection.settings_dict
    target = (
        s["NAME"] if connection.vendor == "sqlite" else f"postgresql://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"
    )
    stop = os.path.join(tempfile.mkdtemp(), "stop")
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, connection.vendor, str(target), str(w.pk), stop],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    try:
        out = fn()
    finally:
        open(stop, "w").close()
        result = json.loads(proc.communicate(timeout=120)[0])
    return out, SimpleNamespace(**result)


def export_sha(run) -> tuple[str, int]:
    from rollouts.collection import export

    sha, n = hashlib.sha256(), 0
    for line in export.iter_successes(run):
        sha.update(line.encode() + b"\n")
        n += 1
    return sha.hexdigest(), n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--items-per-rollout", type=int, default=6)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
    )
    args = parser.parse_args()
    where = h.setup_django(args.db)
    from django.conf import settings
    from django.db import connection

    from rollouts.collection import archive
    from rollouts.models import Rollout, Run, TrajectoryItem

    print(f"archive benchmark: {h.machine()}; {where}; load {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    big = seed(args.rollouts, args.items_per_rollout)
    small = seed(40, args.items_per_rollout, tag="small")
    items = TrajectoryItem.objects.filter(rollout__run=big).count()
    print(f"seeded {args.rollouts:,} rollouts, {items:,} items in {time.perf_counter() - t0:.0f} s")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT COALESCE(SUM(LENGTH(verify_json) + LENGTH(partial_response_json)), 0) FROM rollouts_rollout WHERE run_id = %s",
            [big.pk],
        )
        response_chars = cur.fetchone()[0]
        cur.execute(
            "SELECT COALESCE(SUM(LENGTH(i.payload) + LENGTH(i.search_text)), 0) FROM rollouts_trajectoryitem i "
            "JOIN rollouts_rollout r ON r.id = i.rollout_id WHERE r.run_id = %s",
            [big.pk],
        )
        item_chars = cur.fetchone()[0]
    t0 = time.perf_counter()
    sha, n = export_sha(big)
    print(
        f"rollouts.jsonl before: {n:,} rows in {time.perf_counter() - t0:.1f} s; stored responses {response_chars / 1e6:,.0f} MB, "
        f"items (payload + search text) {item_chars / 1e6:,.0f} MB"
    )

    batch = args.batch or settings.GYMWEB_DELETE_BATCH

    def report(what, out, probe):
        wait = f"{probe.longest_s * 1000:.0f} ms" + (f", errors: {probe.errors[0][:80]}" if probe.errors else "")
        d = sorted(out.durations)
        median, p99 = d[len(d) // 2], d[min(len(d) - 1, int(len(d) * 0.99))]
        print(
            f"{what}: {out.seconds:.1f} s, {out.batches} transactions (≤{batch} rollouts, ≤{settings.GYMWEB_DELETE_BATCH_ITEMS} items each), "
            f"median {median * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, longest {out.longest_transaction_s * 1000:.0f} ms; "
            f"a concurrent writer waited at most {wait} ({probe.writes} writes)"
        )

    out, probe = measure(lambda: archive.archive_run(Run.objects.get(pk=big.pk), batch=args.batch))
    size = sum(f["bytes"] for f in out.files.values())
    report("archive", out, probe)
    parts = ", ".join(f"{k} {v['bytes'] / 1e6:,.1f}" for k, v in out.files.items())
    print(f"  archive files: {size / 1e6:,.1f} MB ({parts})")
    big.refresh_from_db()
    t0 = time.perf_counter()
    assert export_sha(big) == (sha, n), "archived rollouts.jsonl differs"
    print(f"  rollouts.jsonl from the archive: identical, {time.perf_counter() - t0:.1f} s")

    out, probe = measure(lambda: archive.restore_run(Run.objects.get(pk=big.pk), batch=args.batch))
    report("restore", out, probe)
    big.refresh_from_db()
    assert export_sha(big) == (sha, n), "restored rollouts.jsonl differs"
    assert TrajectoryItem.objects.filter(rollout__run=big).count() == items
    print("  rollouts.jsonl after restore: identical; every item back")

    small_before = (
        Rollout.objects.filter(run=small).count(),
        TrajectoryItem.objects.filter(rollout__run=small).count(),
    )
    out, probe = measure(lambda: archive.delete_run(Run.objects.get(pk=big.pk), batch=args.batch))
    report("delete", out, probe)
    assert not Run.objects.filter(pk=big.pk).exists()
    assert (
        Rollout.objects.filter(run=small).count(),
        TrajectoryItem.objects.filter(rollout__run=small).count(),
    ) == small_before
    print("  the other run is untouched")


if __name__ == "__main__":
    main()
