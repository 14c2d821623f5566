"""One large dataset upload through the background task (``rollouts.web.views.upload_job``), or
one large rollouts import (``--import``: ``importer.import_shards``, as ``gymweb import_rollouts``
and the import page's task call it), in a fresh process: seconds, peak RSS and, for an import, the
longest wait of a second connection's one-row write while it runs (how long the import held
SQLite's write lock at once, as a worker's write sees it), or one large upload launched inside the
request (``--launch``: the new-run form over the uploaded file, then ``access.launch_from_form``, as
``POST /api/v1/runs`` with a JSONL body and the new-run page with inline tasks do), or a run
launched from a dataset already stored (``--from-dataset``; ``--old``: as before, in one
transaction): the longest transaction and the longest wait of the second connection's write.

    python -m benchmarks.bench_upload_rss --rows 1000000 [--db sqlite|postgres] [--max-keys 200000]
    python -m benchmarks.bench_upload_rss --launch --rows 100000
    python -m benchmarks.bench_upload_rss --import --rows 200000 [--items 3]
    python -m benchmarks.bench_upload_rss --from-dataset --rows 100000 [--old]

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


class LongestTransaction:
    """The longest outermost ``transaction.atomic`` block of this process while installed (seconds):
    on SQLite, at most how long one of them held the write lock."""

    def __init__(self):
        from django.db.transaction import Atomic

        self.longest, self.count, depth, starts = 0.0, 0, [0], []
        enter, leave = Atomic.__enter__, Atomic.__exit__

        def timed_enter(atomic):
            if depth[0] == 0:
                starts.append(time.perf_counter())
            depth[0] += 1
            return enter(atomic)

        def timed_exit(atomic, *exc):
            try:
                return leave(atomic, *exc)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    self.longest = max(self.longest, time.perf_counter() - starts.pop())
                    self.count += 1

        Atomic.__enter__, Atomic.__exit__ = timed_enter, timed_exit  # type: ignore[method-assign]


def run_from_dataset(args, where: str) -> None:
    """A run launched from a dataset already stored (the new-run form's dataset choice, then
    ``launch_from_form``, as ``POST /api/v1/runs`` with a dataset id does); ``--old``: as it was
    before, the whole dataset loaded (``runs.load_dataset``) and the run written by
    ``runs.create_run`` in one transaction."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils.datastructures import MultiValueDict

    from rollouts.collection import runs, streamed_upload
    from rollouts.models import Run
    from rollouts.web.access import launch_from_form
    from rollouts.web.forms import RunForm

    user = get_user_model().objects.create_user(username="uploader", password="x")
    folder = Path(os.environ["GYMWEB_DATA_DIR"]) if "GYMWEB_DATA_DIR" in os.environ else Path("/tmp")
    path = Path(args.file) if args.file else folder / "bench_tasks.jsonl"
    size = path.stat().st_size if args.file else write_dataset(path, args.rows)
    found = streamed_upload.scan(path, path.name, args.max_keys, 1 << 24)
    dataset, _ = streamed_upload.store_dataset(
        path, path.name, found, name=path.name, user=user, reuse=False, max_line_bytes=1 << 24
    )
    sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
    probe = WriteProbe(str(settings.DATABASES["default"]["NAME"])) if sqlite else None
    time.sleep(1.0 if sqlite else 0)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    timing = LongestTransaction()
    t0 = time.perf_counter()
    form = RunForm(MultiValueDict({**POST, "dataset": [str(dataset.pk)]}), user=user)
    assert form.is_valid(), form.errors
    if args.old:
        with transaction.atomic():
            run = runs.create_run(
                runs.load_dataset(dataset), name="big", user=user, dataset=dataset, **form.run_options()
            )
            runs.launch(run)
    else:
        run, _ = launch_from_form(form, user)
    seconds = time.perf_counter() - t0
    time.sleep(0.5 if probe is not None else 0)  # the probe's write that waited for the last commit ends
    longest, writes = probe.stop() if probe is not None else (None, 0)
    out = {
        "where": where,
        "mode": "from-dataset" + (" (old)" if args.old else ""),
        "rows": found.num_rows,
        "file_mb": round(size / 1024**2, 1),
        "result": f"run #{run.pk}: {run.num_tasks} tasks, {run.rollouts.count()} rollouts, {run.status}",
        "seconds": round(seconds, 1),
        "transactions": timing.count,
        "longest_transaction_s": round(timing.longest, 2),
        "longest_write_wait_s": longest,
        "probe_writes": writes,
        "rss_before_mb": round(base_rss),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "runs": Run.objects.count(),
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
    ap.add_argument("--from-dataset", action="store_true", help="launch a run from the file stored as a dataset")
    ap.add_argument("--old", action="store_true", help="--from-dataset: load it whole, one transaction (as before)")
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
    if args.from_dataset:
        run_from_dataset(args, where)
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
