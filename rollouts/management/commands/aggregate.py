"""``python manage.py aggregate``: NeMo Gym's ``gym eval aggregate`` (``rollouts.evaluation.shards``).

    manage.py aggregate --input-glob 'shards/*.jsonl' --output merged.jsonl [--env-url URL]
                        [--count-failure-classes-as-zero CLASS ...] [--count-missing-rollouts-as-zero]
                        [--no-merge-shards] [--overwrite]

What it reads and writes: docs/evaluate.md. It prints what it read, the key metrics and NeMo Gym's
coverage report; errors (no shard matched, bad JSONL with file and line, overlapping shards) exit
non-zero and write nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts import targets
from rollouts.engine.loop import InvalidBaseURL, validate_base_url
from rollouts.evaluation.outputs import OutputExists, check_outputs
from rollouts.evaluation.shards import (
    MergeResult,
    ShardError,
    expand_input_glob,
    merge_shards,
    merged_paths,
    write_merged,
)


class Command(BaseCommand):
    help = (
        "Merge rollout shards and compute their aggregate metrics like NeMo Gym's `gym eval aggregate`: "
        "--input-glob 'shards/*.jsonl' --output merged.jsonl [--env-url URL]."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--input-glob", required=True, help="glob of the shards (comma-separated globs allowed); quote it"
        )
        parser.add_argument(
            "--output", required=True, help="the merged rollouts file; the other files are named after it"
        )
        parser.add_argument(
            "--env-url", default=None, help="resources server to ask for /aggregate_metrics (default: compute locally)"
        )
        parser.add_argument(
            "--count-failure-classes-as-zero",
            nargs="+",
            default=[],
            metavar="CLASS",
            help=(
                "failure classes (_ng_failure_class, e.g. remote_agent_error) whose rollouts count as reward 0 "
                "in the metrics"
            ),
        )
        parser.add_argument(
            "--count-missing-rollouts-as-zero",
            action="store_true",
            help="count materialised rollouts that left no row anywhere as reward 0 in the metrics",
        )
        parser.add_argument("--no-merge-shards", action="store_true", help="write only the aggregate metrics file")
        parser.add_argument(
            "--timeout-s", type=float, default=60.0, help="seconds for each /aggregate_metrics request (60)"
        )
        parser.add_argument("--overwrite", action="store_true", help="replace output files that already exist")

    def handle(self, *args, **opts) -> None:
        env_url = None
        if opts["env_url"]:
            try:
                env_url = validate_base_url(opts["env_url"], "--env-url")
            except InvalidBaseURL as exc:
                raise CommandError(str(exc)) from None
        output = Path(opts["output"]).expanduser()
        merge = not opts["no_merge_shards"]
        paths = merged_paths(output, merge)
        try:
            check_outputs(paths.values(), opts["overwrite"])
        except (OutputExists, OSError) as exc:
            raise CommandError(str(exc)) from None
        shards = expand_input_glob(opts["input_glob"])
        # With --overwrite, an earlier merged file may match the glob: it is an output, not a shard.
        outputs = {p.resolve() for p in paths.values()}
        skipped = [p for p in shards if p.resolve() in outputs]
        shards = [p for p in shards if p.resolve() not in outputs]
        if not shards:
            raise CommandError(f"no shards matched --input-glob {opts['input_glob']!r}")
        try:
            result = merge_shards(
                shards,
                count_failure_classes_as_zero=opts["count_failure_classes_as_zero"],
                count_missing_rollouts_as_zero=opts["count_missing_rollouts_as_zero"],
                env_url=env_url,
                policy=targets.policy(),
                max_reply_bytes=targets.max_reply_bytes(),
                timeout_s=opts["timeout_s"],
            )
        except (ShardError, FileNotFoundError) as exc:
            raise CommandError(str(exc)) from None
        try:
            written = write_merged(result, output, merge=merge, overwrite=opts["overwrite"])
        except (OutputExists, OSError) as exc:
            raise CommandError(str(exc)) from None
        self._summary(result, skipped, written, opts)

    def _summary(self, result: MergeResult, skipped: list[Path], written: dict[str, Path], opts) -> None:
        """What was read, counted, noted and written."""
        out = self.stdout.write
        for path in skipped:
            self.stderr.write(f"note: {path} is one of this command's outputs; not read as a shard")
        out(f"Aggregated {len(result.shards)} shard(s):")
        for shard in result.shards:
            sidecars = [
                f"{shard.failure_rows} failure row(s)" if shard.failures else "no failures sidecar",
                f"{shard.materialized_rows} materialized row(s)" if shard.materialized else "no materialized inputs",
            ]
            out(f"  - {shard.path}: {shard.successes} success row(s), {', '.join(sidecars)}")
        if opts["count_failure_classes_as_zero"]:
            out(
                f"Counting {result.counted['failures']} failure row(s) as scored zeros: "
                f"{opts['count_failure_classes_as_zero']}"
            )
        if opts["count_missing_rollouts_as_zero"]:
            out(f"Counting {result.counted['missing']} materialized rollout(s) with no row as scored zeros")
        for note in result.notes + result.aggregate.notes:
            self.stderr.write(f"note: {note}")
        for entry in result.aggregate.entries:
            out(f"Key metrics for {entry['agent_ref']['name']}:\n{json.dumps(entry['key_metrics'], indent=4)}")
        for line in result.coverage_lines():
            out(line)
        if "aggregate_metrics" not in written:
            self.stderr.write("no aggregate metrics file: there is nothing to score (no success rows)")
        for path in written.values():
            out(f"wrote {path}")
