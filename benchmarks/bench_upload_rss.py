"""One large dataset upload through the background task (``rollouts.web.views.upload_job``), in
a fresh process: seconds, peak RSS and the longest write transaction seen by a second connection.

    python -m benchmarks.bench_upload_rss --rows 1000000 [--db sqlite|postgres] [--max-keys 200000]

Over ``--max-keys`` rows the upload must be refused while read (nothing stored). Prints one JSON
line (``bench_faults`` runs it and reads that line)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

from benchmarks._harness import setup_django


def write_dataset(path: Path, rows: int) -> int:
    """A JSONL file of ``rows`` counter tasks (~110 bytes a row); returns its size in bytes."""
    with path.open("w") as out:
        for i in range(rows):
            out.write(
                json.dumps(
                    {
                        "responses_create_params": {
                            "input": [{"role": "user", "content": f"task {i}: add 1 three times"}]
                        },
                        "expected_count": 3,
                    }
                )
                + "\n"
            )
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--db", default="sqlite")
    ap.add_argument("--max-keys", type=int, default=200_000)
    ap.add_argument("--file", default="", help="an existing JSONL file instead of a generated one")
    args = ap.parse_args()
    os.environ["GYMWEB_MAX_KEYS_PER_RUN"] = str(args.max_keys)
    os.environ.setdefault("GYMWEB_MAX_UPLOAD_BYTES", str(2 * 1024**3))
    where = setup_django(args.db)
    from django.contrib.auth import get_user_model

    from rollouts import background
    from rollouts.models import BackgroundTask, Dataset, Run

    user = get_user_model().objects.create_user(username="uploader", password="x")
    task = BackgroundTask.objects.create(kind=BackgroundTask.Kind.UPLOAD, user=user, params={})
    folder = background.task_dir(task.pk)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tasks.jsonl"
    if args.file:
        shutil.copy(args.file, path)
        size = path.stat().st_size
    else:
        size = write_dataset(path, args.rows)
    post = {
        "name": ["big upload"],
        "agent_url": ["http://127.0.0.1:9102/"],
        "env_url": ["http://127.0.0.1:9101"],
        "agent_name": ["remote_agent"],
        "concurrency": ["8"],
        "num_repeats": ["1"],
        "max_attempts": ["3"],
        "remote_responses_timeout_s": ["60"],
        "run_timeout_s": ["120"],
        "overrides": [""],
    }
    task.params = {"post": post, "files": [{"slot": "dataset_file", "name": "tasks.jsonl", "path": str(path)}]}
    task.save(update_fields=["params"])
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    status = background.run(task.pk)
    seconds = time.perf_counter() - t0
    task.refresh_from_db()
    out = {
        "where": where,
        "rows": args.rows,
        "file_mb": round(size / 1024**2, 1),
        "status": status,
        "message": task.message[:200],
        "seconds": round(seconds, 1),
        "rss_before_mb": round(base_rss),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "datasets": Dataset.objects.count(),
        "runs": Run.objects.count(),
        "keys": sum(Run.objects.values_list("num_keys", flat=True)),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
