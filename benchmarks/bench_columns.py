"""Benchmark: the run table with 10 chosen task/verify columns over a run of 100,000 rollouts
(``rollouts.review.columns``: values read from the stored JSON text in SQL). Seeds one run whose
tasks carry 4 scalar fields beside a ~600-character prompt and whose verify replies carry 8 scalar
fields (two nested) beside a response of ``--verify-kb`` KB (the echoed trajectory NeMo Gym's verify
replies hold), one assistant message item per rollout (the final-answer preview); then times the
table's server time (the HTMX partial the filter form fetches) for: the default order, a sort on a
verify number, a sort on a task string, a number range plus a string filter, and a content search
for a word only some verify replies hold. Target: under 500 ms.

    python -m benchmarks.bench_columns [--db sqlite|postgres] [--rollouts 100000] [--verify-kb 4] [--repeat 3]
        [--compare-json] [--keep DIR-or-DB [--seed-only]]

Sorts and filters on a field read the run's kept field values (``rollouts.review.field_values``):
the "first" column is the first request after they were dropped, with the extraction a worker
does for a run this large (``field_values.extract``) before it; the "server" column the median of
``--repeat`` requests after one more; ``--compare-json`` first times the same cases reading the
JSON text; ``--keep-values`` keeps the values already kept (all of ``prepare_run``'s fields, say).
"""

from __future__ import annotations

import argparse
import random
import re
import time

from benchmarks import _harness as h
from benchmarks.bench_search import timed

CATEGORIES = ["math", "code", "search", "retail", "telecom", "airline", "swe", "rubric"]
RARE = "quuxfrobnicate"  # in the verify reply of 0.1% of rollouts
COLUMNS = [
    "task.instance_id",
    "task.category",
    "task.difficulty",
    "verify.resolved",
    "verify.score",
    "verify.judge.verdict",
    "verify.judge.confidence",
    "verify.num_tests_passed",
    "prompt",
    "answer",
]


def verify_reply(k: int, rng: random.Random, filler: str) -> dict:
    note = f"tests pass; {RARE} noted" if k % 1000 == 5 else "tests pass"
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"task {k}"}]},
        "response": {
            "id": f"resp_{k}",
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": filler}]}],
        },
        "reward": float(k % 3 == 0),
        "resolved": k % 3 == 0,
        "score": round(rng.random(), 4),
        "num_tests_passed": rng.randint(0, 40),
        "failure_label": ["none", "timeout", "wrong_answer", "format"][k % 4],
        "judge": {"verdict": ["A", "B", "tie"][k % 3], "confidence": round(rng.random(), 3), "note": note},
        "latency_s": round(rng.uniform(1, 90), 2),
        "instance_id": f"repo__proj-{k}",
    }


def seed(total: int, verify_kb: float):
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from rollouts.lossless import dumps
    from rollouts.models import Rollout, Run, Task
    from rollouts.search import index, text

    rng = random.Random(21)
    words = "the patch fixes the failing test by checking the boundary before the loop ends".split()
    filler = " ".join(rng.choice(words) for _ in range(int(verify_kb * 1024 / 6)))
    prompt = "You are a software engineer. " + " ".join(rng.choice(words) for _ in range(100))
    user = get_user_model().objects.create_user("bench", password="bench-password")
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.create(
            name="bench columns",
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
        tasks = []
        for i in range(total):
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": f"{prompt} (task {i})"}]},
                "instance_id": f"repo__proj-{i}",
                "category": CATEGORIES[i % len(CATEGORIES)],
                "difficulty": ["easy", "medium", "hard"][i % 3],
                "max_steps": 50 + i % 7,
            }
            tasks.append(Task(run=run, task_index=i, row_json=dumps(row)))
        Task.objects.bulk_create(tasks, batch_size=5000)
        task_ids = list(Task.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))
        for start in range(0, total, 5000):
            chunk = []
            for k in range(start, min(total, start + 5000)):
                verify = verify_reply(k, rng, filler)
                chunk.append(
                    Rollout(
                        run=run,
                        task_id=task_ids[k],
                        task_index=k,
                        rollout_index=0,
                        attempt=1,
                        status="succeeded",
                        reward=verify["reward"],
                        verify_json=dumps(verify),
                        finished=now,
                        started=now,
                        duration_ms=800.0 + k % 50,
                        num_agent_calls=1,
                        num_items=1,
                    )
                )
            Rollout.objects.bulk_create(chunk, batch_size=5000)
    ids = list(Rollout.objects.filter(run=run).order_by("task_index").values_list("id", flat=True))
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            for suffix in ("ai", "ad", "au"):
                cursor.execute(f"DROP TRIGGER IF EXISTS {index.FTS_TABLE}_{suffix}")
        cols = "rollout_id, seq, step, kind, role, call_id, name, origin, asked, paired, refused, payload, search_text"
        insert = f"INSERT INTO {index.ITEM_TABLE} ({cols}) VALUES ({', '.join(['%s'] * 13)})"
        with transaction.atomic():
            batch = []
            for k, rid in enumerate(ids):
                item = {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"Done: the fix for task {k} is in place."}],
                }
                batch.append(
                    (
                        rid,
                        0,
                        0,
                        "message",
                        "assistant",
                        "",
                        "",
                        "agent",
                        False,
                        False,
                        False,
                        dumps(item),
                        text.item_search_text(item),
                    )
                )
                if len(batch) == 20_000:
                    cursor.executemany(insert, batch)
                    batch = []
            if batch:
                cursor.executemany(insert, batch)
        index.ensure_index(connection)
        # PostgreSQL: VACUUM as autovacuum would after the inserts (index-only scans need the
        # visibility map), then the planner's statistics.
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
    return user, run


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--verify-kb", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--compare-json",
        action="store_true",
        help="also time every case reading the JSON text (kept field values off), before the kept values",
    )
    parser.add_argument("--no-prepare", action="store_true", help="do not time prepare_run (every field extracted)")
    parser.add_argument(
        "--keep-values",
        action="store_true",
        help="reuse the field values already kept (e.g. every field of prepare_run) instead of dropping them first",
    )
    parser.add_argument("--only", default="", help="time only the cases whose label matches this regular expression")
    parser.add_argument("--seed-only", action="store_true", help="seed (with --keep) and stop: time nothing")
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
    from django.conf import settings
    from django.test import Client
    from django.urls import reverse

    from rollouts.models import FieldExtract, FieldValue, Run
    from rollouts.review import field_values, query

    t0 = time.perf_counter()
    run = Run.objects.filter(name="bench columns").order_by("-id").first() if args.keep else None
    if run is None:
        user, run = seed(args.rollouts, args.verify_kb)
    else:
        user = run.created_by
        where += " (kept)"
    seeded = time.perf_counter() - t0
    if args.seed_only:
        print(f"seeded {where} in {seeded:.0f} s")
        return
    print(f"run table columns benchmark — {h.machine()}; load average {_load()}; {where}")
    print(f"  seeded {run.num_keys:,} rollouts (verify reply ~{args.verify_kb:g} KB each) in {seeded:.0f} s")
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    client = Client()
    client.force_login(user)
    base = reverse("run", args=[run.pk])
    cols = ",".join(COLUMNS)
    cases = [
        ("10 columns, task order", {"cols": cols}),
        ("10 columns, sort -verify.score", {"cols": cols, "sort": "-verify.score"}),
        ("10 columns, sort task.category", {"cols": cols, "sort": "task.category"}),
        ("10 columns, page 1000 of sort -verify.score", {"cols": cols, "sort": "-verify.score", "page": "1000"}),
        (
            "10 columns, score 0.5..0.6 and category math",
            {"cols": cols, "f.verify.score": "0.5..0.6", "f.task.category": "math"},
        ),
        ("10 columns, text only 0.1% of verify replies hold", {"cols": cols, "text": RARE}),
    ]
    cases = [(label, params) for label, params in cases if re.search(args.only, label)]
    kept = query.RolloutFilterForm.use_kept_values
    modes = ["JSON text", "kept values"] if args.compare_json else ["kept values"]
    for mode in modes:
        query.RolloutFilterForm.use_kept_values = kept if mode == "kept values" else (lambda self, run: None)
        if not args.keep_values:
            FieldExtract.objects.filter(run=run).delete()
            FieldValue.objects.filter(run=run).delete()
        kept_now = FieldExtract.objects.filter(run=run).count()
        print(f"  reading {mode} ({kept_now} field(s) of the run kept before the first case):")
        print(f"  {'case':52s} {'rows':>6s} {'first':>9s} {'server':>9s} {'CPU':>8s}  load")
        for label, params in cases:

            def page(params=params):
                response = client.get(base, params, HTTP_HX_REQUEST="true")
                assert response.status_code == 200, response.status_code
                return response

            t1 = time.perf_counter()
            if mode == "kept values":
                # What the worker does (``field_values.extract_later``) for a run past INLINE_ROWS;
                # until it has, the page reads the JSON text.
                form = query.RolloutFilterForm(params)
                for name in form.fields_read():
                    if not FieldExtract.objects.filter(run=run, field=name).exists():
                        field_values.extract(run.pk, name)
            page()
            first = (time.perf_counter() - t1) * 1000
            ms, cpu, response = timed(page, args.repeat)
            rows = response.content.decode().count('class="rollout-link mono"')
            print(
                f"  {label:52s} {rows:>6,d} {first:6,.0f} ms {ms:6,.0f} ms {cpu:5,.0f} ms  {_load()}",
                flush=True,
            )
    # What a worker does in the background when a run ends: every discovered field (up to
    # PREPARE_FIELDS) extracted ahead.
    if args.no_prepare:
        return
    query.RolloutFilterForm.use_kept_values = kept
    FieldExtract.objects.filter(run=run).delete()
    FieldValue.objects.filter(run=run).delete()
    c0, t0 = time.process_time(), time.perf_counter()
    done = field_values.prepare_run(run.pk)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    values = FieldValue.objects.filter(run=run).count()
    print(f"  prepare_run (background, when a run ends): {done}; {values:,} values; {wall:.1f} s, CPU here {cpu:.1f} s")
    print(f"  load average {_load()}")


if __name__ == "__main__":
    main()
