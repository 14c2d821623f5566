"""One large dataset upload through the background task (``rollouts.web.views.upload_job``), or
one large rollouts import (``--import``: ``importer.import_shards``, as ``gymweb import_rollouts``
and the import page's task call it), in a fresh process: seconds, peak RSS and, for an import, the
longest wait of a second connection's one-row write while it runs (how long the import held
SQLite's write lock at once, as a worker's write sees it), or one large upload launched inside the
request (``--launch``: the new-run form over the uploaded file, then ``access.launch_from_form``, as
``POST /api/v1/runs`` with a JSONL body and the new-run page with inline tasks do).

    python -m benchmarks.bench_upload_rss --rows 1000000 [--db sqlite|postgres] [--max-keys 200000]
    python -m benchmarks.bench_upload_rss --launch --rows 100000
    python -m benchmarks.bench_upload_rss --import --rows 200000 [--items 3]

Over ``--max-keys`` rows the upload must be refused while read (nothing stored). Prints one JSON
line (``bench_faults`` runs it and reads that line)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import threading
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


def write_rollouts(path: Path, rows: int, items: int) -> int:
    """A NeMo Gym rollouts.jsonl of ``rows`` result rows, each ``items`` output items (tool calls
    and their outputs, then a message); returns its size in bytes."""
    with path.open("w") as out:
        for i in range(rows):
            output = []
            for k in range(max(0, items - 1) // 2):
                output.append({"type": "function_call", "call_id": f"c{i}_{k}", "name": "inc", "arguments": "{}"})
                output.append({"type": "function_call_output", "call_id": f"c{i}_{k}", "output": str(k + 1)})
            output.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "3"}]})
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": f"task {i}: add 1 three times"}]},
                "response": {"id": f"r{i}", "created_at": 1700000000, "model": "m", "output": output},
                "reward": 1.0,
                "_ng_task_index": i,
                "_ng_rollout_index": 0,
            }
            out.write(json.dumps(row) + "\n")
    return path.stat().st_size


PROBE = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=600, isolation_level=None)
db.execute("CREATE TABLE IF NOT EXISTS bench_probe (n INTEGER)")
longest, writes = 0.0, 0
while not sys.stdin.closed:
    t0 = time.perf_counter()
    db.execute("BEGIN IMMEDIATE"); db.execute("INSERT INTO bench_probe VALUES (1)"); db.execute("COMMIT")
    longest = max(longest, time.perf_counter() - t0); writes += 1
    print(f"{longest:.3f} {writes}", flush=True)
    time.sleep(0.05)
"""


class WriteProbe:
    """Another process writing one row to the SQLite file every 50 ms (as a worker's short write):
    the longest its write waited for the lock (seconds) and how many it made."""

    def __init__(self, db_path: str):
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, db_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.last = "0 0"
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = line

    def stop(self) -> tuple[float, int]:
        self.proc.kill()
        self.proc.wait()
        self.reader.join(5)
        longest, writes = self.last.split()
        return float(longest), int(writes)


def run_import(args, where: str) -> None:
    from rollouts.collection import importer
    from rollouts.models import Rollout, Run

    if args.rows_per_batch:
        importer.ROWS_PER_BATCH = args.rows_per_batch
    folder = Path(os.environ["GYMWEB_DATA_DIR"]) if "GYMWEB_DATA_DIR" in os.environ else Path("/tmp")
    path = Path(args.file) if args.file else folder / "bench_rollouts.jsonl"
    size = path.stat().st_size if args.file else write_rollouts(path, args.rows, args.items)
    from django.conf import settings

    sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    probe = WriteProbe(str(settings.DATABASES["default"]["NAME"])) if sqlite else None
    time.sleep(1.0 if sqlite else 0)
    t0 = time.perf_counter()
    with path.open("rb") as fh:
        summary = importer.import_shards([(fh, path.name)])
    seconds = time.perf_counter() - t0
    longest, writes = probe.stop() if probe is not None else (None, 0)
    print(
        json.dumps(
            {
                "where": where,
                "mode": "import",
                "rows": summary.rows,
                "items": summary.items,
                "file_mb": round(size / 1024**2, 1),
                "rows_per_batch": importer.ROWS_PER_BATCH,
                "seconds": round(seconds, 1),
                "longest_write_wait_s": longest,
                "probe_writes": writes,
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "runs": Run.objects.count(),
                "rollouts": Rollout.objects.count(),
                "load": os.getloadavg()[0],
            }
        )
    )


POST = {
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


def run_launch(args, where: str) -> None:
    """The new-run form validated over an uploaded file on disk (as Django hands a large upload
    over: a temporary file), then ``launch_from_form``."""
    from django.contrib.auth import get_user_model
    from django.core.files.uploadedfile import UploadedFile
    from django.utils.datastructures import MultiValueDict

    from rollouts.models import Dataset, Run
    from rollouts.web.access import launch_from_form
    from rollouts.web.forms import RunForm

    user = get_user_model().objects.create_user(username="uploader", password="x")
    folder = Path(os.environ["GYMWEB_DATA_DIR"]) if "GYMWEB_DATA_DIR" in os.environ else Path("/tmp")
    path = Path(args.file) if args.file else folder / "bench_tasks.jsonl"
    size = path.stat().st_size if args.file else write_dataset(path, args.rows)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    with path.open("rb") as fh:
        upload = UploadedFile(fh, name="tasks.jsonl", content_type="application/jsonl", size=size)
        form = RunForm(MultiValueDict(POST), MultiValueDict({"dataset_file": [upload]}), user=user)
        if form.is_valid():
            run, _ = launch_from_form(form, user)
            result = f"run #{run.pk} launched: {run.num_keys} keys"
        else:
            result = "refused: " + "; ".join(f"{k}: {v[0]}" for k, v in form.errors.items())
    seconds = time.perf_counter() - t0
    out = {
        "where": where,
        "mode": "launch",
        "rows": args.rows,
        "file_mb": round(size / 1024**2, 1),
        "result": result[:200],
        "seconds": round(seconds, 1),
        "rss_before_mb": round(base_rss),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "datasets": Dataset.objects.count(),
        "runs": Run.objects.count(),
        "keys": sum(Run.objects.values_list("num_keys", flat=True)),
        "load": os.getloadavg()[0],
    }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--db", default="sqlite")
    ap.add_argument("--max-keys", type=int, default=200_000)
    ap.add_argument("--file", default="", help="an existing JSONL file instead of a generated one")
    ap.add_argument("--import", dest="import_", action="store_true", help="import a rollouts file instead")
    ap.add_argument("--launch", action="store_true", help="launch from the new-run form inside the request")
    ap.add_argument("--items", type=int, default=3, help="--import: output items per row")
    ap.add_argument("--rows-per-batch", type=int, default=0, help="--import: importer.ROWS_PER_BATCH (0: as set)")
    args = ap.parse_args()
    os.environ["GYMWEB_MAX_KEYS_PER_RUN"] = str(args.max_keys)
    os.environ.setdefault("GYMWEB_MAX_UPLOAD_BYTES", str(2 * 1024**3))
    where = setup_django(args.db)
    if args.import_:
        run_import(args, where)
        return
    if args.launch:
        run_launch(args, where)
        return
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
    task.params = {"post": POST, "files": [{"slot": "dataset_file", "name": "tasks.jsonl", "path": str(path)}]}
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
