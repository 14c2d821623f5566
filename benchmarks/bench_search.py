"""Benchmark: content search across a run (issue 11). Seed one run of 100,000 rollouts with
1,000,000 trajectory items (10 per rollout: user message, 3 tool calls with bash-like arguments,
3 tool outputs, 1 reasoning, 1 assistant message; about 154 characters of search text each), 10% failed
with a message, then time the run table filtered by content: the SQL (count + first page) and the
table's server time (the HTMX partial the filter form fetches), for rare, medium and common text,
tool names, tool outputs, failure messages and a 2-character query (no trigram: a scan).

    python -m benchmarks.bench_search [--db sqlite|postgres] [--rollouts 100000] [--items 10] [--repeat 3]

Seeding uses bulk inserts the way a restore would: on SQLite the FTS5 triggers are off while
the rows go in and the index is then rebuilt from them (``rollouts.search.index.ensure_index``); on
PostgreSQL the rows are COPYed with the trigram index dropped, then the index is built. The
``search_text`` of every item is computed by ``rollouts.search.text.item_search_text``, as the
writers do. Target: every search under 1 s server time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from benchmarks import _harness as h

WORDS = (
    "the file was not found in the repository so i will check the tests again before running them "
    "error warning info debug import module class function return value list dict string number "
    "patch diff apply commit branch merge conflict resolve build install package version python "
    "pytest assert failed passed skipped collected coverage report output input config setting "
    "user assistant tool call result success timeout retry request response server client"
).split()
TOOLS = ["bash", "read_file", "write_file", "search_code", "run_tests", "list_dir", "git_diff", "python"]
RARE_TOOL = "submit_patch_v2"  # called in 0.1% of rollouts
RARE = "zebraquartz"  # in 10 rollouts (one item each)
MEDIUM = "segmentation fault in libfoo"  # in 1% of rollouts (a tool output)
ERROR_PHRASE = "connection reset by peer"  # 1% of rollouts' failure messages


def sentences(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16))).capitalize() + "." for _ in range(n)]


def item_payloads(k: int, pool: list[str], items: int) -> list[dict]:
    """The ``items`` trajectory items of rollout ``k`` (deterministic)."""
    p = len(pool)
    out = [{"type": "message", "role": "user", "content": f"Task {k}: {pool[k % p]} {pool[(k * 7) % p]}"}]
    for n in range(3):
        tool = RARE_TOOL if (n == 2 and k % 1000 == 3) else TOOLS[(k + n) % len(TOOLS)]
        cmd = f'cd /repo/src/module_{k % 997} && grep -rn "{WORDS[(k + n) % len(WORDS)]}" file_{k % 1013}.py | head -{n + 5}'
        out.append(
            {
                "type": "function_call",
                "name": tool,
                "call_id": f"call_{k}_{n}",
                "id": f"fc_{k}_{n}",
                "arguments": json.dumps({"command": cmd}),
                "status": "completed",
            }
        )
        text = f"{pool[(k * 3 + n) % p]} {pool[(k * 11 + n) % p]} exit code {k % 3}"
        if n == 1 and k % 100 == 42:
            text += f" Fatal: {MEDIUM} at 0x{k:08x}"
        out.append({"type": "function_call_output", "call_id": f"call_{k}_{n}", "output": text})
    out.append(
        {"type": "reasoning", "id": f"rs_{k}", "summary": [{"type": "summary_text", "text": pool[(k * 13) % p]}]}
    )
    final = f"{pool[(k * 5) % p]} {pool[(k * 17) % p]}"
    if k % 10_000 == 77:
        final += f" ({RARE} {k})"
    out.append(
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "id": f"msg_{k}",
            "content": [{"type": "output_text", "text": final, "annotations": []}],
        }
    )
    return out[:items] if items <= len(out) else out + [out[-1]] * (items - len(out))


def seed(total: int, items: int):
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from rollouts.lossless import dumps, encode_text
    from rollouts.models import Rollout, Run, Task
    from rollouts.search import index, text

    rng = random.Random(11)
    pool = sentences(rng, 20_000)
    user = get_user_model().objects.create_user("bench", password="bench-password")
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.create(
            name="bench search",
            status="completed",
            agent_url="http://127.0.0.1:1",
            env_url="http://127.0.0.1:2",
            created_by=user,
            num_repeats=1,
            num_tasks=total,
            num_keys=total,
            started=now,
            finished=now,
        )
        Task.objects.bulk_create(
            [Task(run=run, task_index=i, row_json='{"responses_create_params": {"input": "x"}}') for i in range(total)],
            batch_size=5000,
        )
        task_ids = list(Task.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))
        for start in range(0, total, 5000):
            chunk = []
            for k in range(start, min(total, start + 5000)):
                failed = k % 10 == 7
                error = ""
                if failed:
                    error = f"agent_http_error: HTTP 500 from the agent after {k % 50} s: " + (
                        ERROR_PHRASE if k % 100 == 7 else "internal error"
                    )
                chunk.append(
                    Rollout(
                        run=run,
                        task_id=task_ids[k],
                        task_index=k,
                        rollout_index=0,
                        attempt=1,
                        status="failed" if failed else "succeeded",
                        reward=0.0 if failed else float(k % 3 != 0),
                        failure_kind="agent_http_error" if failed else "",
                        error=error,
                        finished=now,
                        started=now,
                        duration_ms=800.0 + k % 50,
                        num_agent_calls=4,
                        num_tool_calls=3,
                        num_items=items,
                    )
                )
            Rollout.objects.bulk_create(chunk, batch_size=5000)
    rollout_ids = list(Rollout.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))

    def rows():
        for k, rid in enumerate(rollout_ids):
            for seq, item in enumerate(item_payloads(k, pool, items)):
                kind = item["type"]
                yield (
                    rid,
                    seq,
                    0 if seq == 0 else 1 + (seq - 1) // 2,
                    kind,
                    item.get("role", ""),
                    item.get("call_id", ""),
                    encode_text(item.get("name", "")),
                    "agent" if kind != "function_call_output" else "gym",
                    False,
                    kind in ("function_call", "function_call_output"),
                    False,
                    dumps(item),
                    text.item_search_text(item),
                )

    columns = "rollout_id, seq, step, kind, role, call_id, name, origin, asked, paired, refused, payload, search_text"
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for suffix in ("ai", "ad", "au"):
                cursor.execute(f"DROP TRIGGER IF EXISTS {index.FTS_TABLE}_{suffix}")
            insert = f"INSERT INTO {index.ITEM_TABLE} ({columns}) VALUES ({', '.join(['%s'] * 13)})"
            with transaction.atomic():
                batch = []
                for row in rows():
                    batch.append(row)
                    if len(batch) == 20_000:
                        cursor.executemany(insert, batch)
                        batch = []
                if batch:
                    cursor.executemany(insert, batch)
            t0 = time.perf_counter()
            index.ensure_index(connection)  # triggers back, index rebuilt from the rows
            index_s = time.perf_counter() - t0
            cursor.execute("ANALYZE")
        else:
            cursor.execute(f"DROP INDEX IF EXISTS {index.TRGM_INDEX}")
            raw = cursor.cursor  # psycopg's own cursor: COPY
            with raw.copy(f"COPY {index.ITEM_TABLE} ({columns}) FROM STDIN") as copy:
                for row in rows():
                    copy.write_row(row)
            t0 = time.perf_counter()
            index.ensure_index(connection)
            index_s = time.perf_counter() - t0
            cursor.execute("ANALYZE")
    return user, run, index_s


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """Median wall ms, median CPU ms of this process (on SQLite the SQL runs here too; on a loaded
    machine wall time includes waiting for a core, CPU time does not), the last result."""
    fn()  # warm
    times, cpus, result = [], [], None
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    return statistics.median(times), statistics.median(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--keep", default="", help="SQLite: a directory; PostgreSQL: a database name. Seeded once, reused after"
    )
    args = parser.parse_args()

    if args.keep:
        import os

        if args.db == "sqlite":
            os.makedirs(args.keep, exist_ok=True)
            os.environ["GYMWEB_SQLITE_PATH"] = os.path.join(args.keep, "gymweb.sqlite3")
        else:
            os.environ["GYMWEB_BENCH_PG_NAME"] = args.keep
    where = h.setup_django(args.db)
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Avg
    from django.db.models.functions import Length
    from django.test import Client
    from django.urls import reverse

    from rollouts.models import Run, TrajectoryItem
    from rollouts.review.query import filtered_rollouts
    from rollouts.web.views import SEARCH_COUNT_CAP

    t0 = time.perf_counter()
    run = Run.objects.filter(name="bench search").first() if args.keep else None
    if run is not None:
        user, index_s = get_user_model().objects.get(username="bench"), 0.0
        where += " (kept from an earlier run of this benchmark)"
    else:
        user, run, index_s = seed(args.rollouts, args.items)
    seeded = time.perf_counter() - t0
    n_items = TrajectoryItem.objects.count()
    avg = TrajectoryItem.objects.aggregate(a=Avg(Length("search_text")))["a"]
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    print(f"content search benchmark — {h.machine()}; load average {load}; {where}")
    print(
        f"  seeded run #{run.pk}: {args.rollouts:,} rollouts, {n_items:,} items (search_text {avg:,.0f} chars on average) "
        f"in {seeded:.0f} s, of which the index build {index_s:.0f} s"
    )
    from django.conf import settings

    # Pages name static files plainly (no collectstatic manifest in a benchmark database's process).
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    client = Client()
    client.force_login(user)
    base = reverse("run", args=[run.pk])
    cases = [
        ("no filter (the table's own cost)", {}),
        ("text, rare (10 rollouts)", {"text": RARE}),
        ("text, medium (1% of rollouts)", {"text": MEDIUM}),
        ("text, common word (most rollouts)", {"text": "repository"}),
        ("text, no match", {"text": "no such phrase anywhere"}),
        ("text, 2 characters (scan)", {"text": "qz"}),
        ("tool called, rare (0.1%)", {"tool": RARE_TOOL}),
        ("tool called, common", {"tool": "bash"}),
        ("tool output, medium (1%)", {"output": "segmentation fault"}),
        ("failure message (1%)", {"error": ERROR_PHRASE}),
        ("text + status succeeded", {"text": MEDIUM, "status": "succeeded"}),
    ]
    print(f"  {'query':38s} {'matches':>8s} {'SQL count+page':>15s} {'table (server)':>15s} {'table CPU':>10s}")
    for label, params in cases:

        def sql():
            # What the table does: the count up to the cap (CappedPaginator), then the first page.
            qs, form = filtered_rollouts(run, params)
            assert not form.errors, form.errors
            ids = qs.values_list("id", flat=True)
            return ids[: SEARCH_COUNT_CAP + 1].count(), list(ids[:50])

        sql_ms, _cpu, (count, _ids) = timed(sql, args.repeat)

        def page():
            response = client.get(base, params, HTTP_HX_REQUEST="true")
            assert response.status_code == 200
            return response

        page_ms, page_cpu, _ = timed(page, args.repeat)
        shown = f"{count:,d}" + ("+" if count > SEARCH_COUNT_CAP else "")
        print(f"  {label:38s} {shown:>8s} {sql_ms:12,.0f} ms {page_ms:12,.0f} ms {page_cpu:7,.0f} ms", flush=True)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_size_pretty(pg_relation_size(%s)), pg_size_pretty(pg_total_relation_size('rollouts_trajectoryitem'))",
                ["rollouts_item_search_trgm"],
            )
            print("  trigram index size %s; items table with indexes %s" % cursor.fetchone())


if __name__ == "__main__":
    main()
