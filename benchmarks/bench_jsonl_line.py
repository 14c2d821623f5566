"""Benchmark 6, one very long JSONL line: a dataset whose single row holds an N MB string, uploaded
as a Django ``TemporaryUploadedFile`` (how the new-run form and the import page receive a big file),
read by ``datasets.read_jsonl``; time and peak RSS of the whole process, each size in a fresh
process. ``--old`` reads it the way gymweb did before (iterating the upload, i.e. Django's
``File.__iter__``, which re-joins a long line for every 64 KB chunk: quadratic).

    python -m benchmarks.bench_jsonl_line [--sizes 10 50 150] [--old]

No database is touched. Target: time linear in the size, peak RSS a small multiple of the line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def measure(size_mb: int, old: bool) -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gymweb.settings")
    import django

    django.setup()
    from django.core.files.uploadedfile import TemporaryUploadedFile

    from rollouts.collection.datasets import DatasetError, read_jsonl
    from rollouts.engine.contract import strict_loads

    upload = TemporaryUploadedFile("big.jsonl", "application/jsonl", 0, None)
    upload.write(b'{"responses_create_params": {"input": "')
    block = b"a" * (1024 * 1024)
    for _ in range(size_mb):
        upload.write(block)
    upload.write(b'"}}\n')
    upload.seek(0)
    del block
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    error = ""
    if old:
        rows = [strict_loads(line) for line in upload]  # Django's File.__iter__, as before
    else:
        try:
            rows = read_jsonl(upload, source="big.jsonl", max_line_bytes=1 << 40).rows
        except DatasetError as exc:
            rows, error = [], str(exc)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "size_mb": size_mb,
        "old": old,
        "rows": len(rows),
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak / 1024),
        "rss_before_mb": round(base_rss / 1024),
        "error": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 150], help="line sizes in MB")
    parser.add_argument("--old", action="store_true", help="read as before (Django's File.__iter__)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child measuring one size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.old)))
        return
    for size in args.sizes:
        cmd = [sys.executable, "-m", "benchmarks.bench_jsonl_line", "--one", str(size)] + (
            ["--old"] if args.old else []
        )
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        result = json.loads(out)
        print(
            f"{'old' if args.old else 'now'}: {size:>4} MB line: {result['seconds']:>7.2f} s, "
            f"peak RSS {result['peak_rss_mb']} MB (before reading {result['rss_before_mb']} MB)"
        )


if __name__ == "__main__":
    main()
