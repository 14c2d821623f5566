"""``python manage.py import_rollouts [FILE ...] [--input-glob GLOB] [--failures F] [--materialized-inputs M] [--name N] [--no-health-check]``:
import a NeMo Gym ``rollouts.jsonl`` (and its failures sidecar, or the sidecar alone), or several
shards of one run, into a new run with status ``imported``.

What it accepts and refuses: docs/evaluate.md and docs/nemo-gym-files.md. One FILE: its sidecar
only when given with ``--failures``; its ``<stem>_materialized_inputs.jsonl`` when given with
``--materialized-inputs`` or found beside FILE; shards: ``collection.importer.import_shards``.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection.datasets import DatasetError
from rollouts.collection.export import output_stems
from rollouts.collection.importer import LooksLikeDatasetError, import_shards
from rollouts.evaluation import health
from rollouts.evaluation.shards import expand_input_glob, failures_path_for


class Command(BaseCommand):
    help = (
        "Import a NeMo Gym rollouts.jsonl (and optionally its failures sidecar) to inspect it without re-running; "
        "several files or --input-glob import shards of one run as one run, each with the _failures.jsonl beside it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "files",
            nargs="*",
            metavar="FILE",
            help="rollouts.jsonl written by NeMo Gym (or gymweb); several = shards of one run; optional with --failures",
        )
        parser.add_argument(
            "--input-glob", help="shards of one run, e.g. 'shards/*.jsonl' (quote it; comma-separated globs allowed)"
        )
        parser.add_argument(
            "--failures", help="the failures sidecar of a single FILE (rollouts_failures.jsonl), or alone"
        )
        parser.add_argument(
            "--materialized-inputs",
            metavar="FILE",
            help="the run's rollouts_materialized_inputs.jsonl (default: the one beside a single FILE, if any)",
        )
        parser.add_argument("--name", default="", help="the run's name (default: the file names)")
        parser.add_argument("--no-health-check", action="store_true", help="skip the health check of the imported rows")

    def handle(self, *args, **options) -> None:
        paths = [Path(p) for p in options["files"]]
        if options["input_glob"]:
            matched = expand_input_glob(options["input_glob"])
            if not matched:
                raise CommandError(f"no shards matched --input-glob {options['input_glob']!r}")
            paths += [p for p in matched if p not in paths]
        failures: list[Path] = []
        if options.get("failures"):
            if len(paths) > 1:
                raise CommandError(
                    "--failures goes with a single FILE; shards are imported with the _failures.jsonl beside each"
                )
            failures.append(Path(options["failures"]))
        elif len(paths) > 1:
            failures = [failures_path_for(p) for p in paths if failures_path_for(p).is_file()]
        if not paths and not failures:
            raise CommandError(
                "give a rollouts.jsonl, a --failures file, both, or several shards (FILE... or --input-glob)"
            )
        inputs: list[Path] = []
        if options.get("materialized_inputs"):
            inputs.append(Path(options["materialized_inputs"]))
        elif len(paths) == 1 and output_stems(paths[0])["materialized"].is_file():
            inputs.append(output_stems(paths[0])["materialized"])
        for p in paths + failures + inputs:
            if not p.is_file():
                raise CommandError(f"{p}: no such file")
        try:
            with ExitStack() as stack:
                shards = [(stack.enter_context(p.open("rb")), str(p)) for p in paths]
                sidecars = [(stack.enter_context(p.open("rb")), str(p)) for p in failures]
                materialized = [(stack.enter_context(p.open("rb")), str(p)) for p in inputs]
                summary = import_shards(shards, sidecars, materialized, name=options["name"])
        except LooksLikeDatasetError as exc:
            raise CommandError(
                f"{exc}: gymweb collect --input {paths[0]} --agent-url ... --env-url ... --output results/rollouts.jsonl"
            ) from None
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        run = summary.run
        files = f" from {len(paths)} shard(s) and {len(failures)} failures sidecar(s)" if len(paths) > 1 else ""
        if inputs:
            files += f" with the materialised inputs {inputs[0]}"
        self.stdout.write(
            f"imported run #{run.pk} {run.name!r}{files}: {summary.rows} row(s), {summary.succeeded} succeeded, "
            f"{summary.failed} failed, {summary.not_run} never run, {summary.items} item(s); "
            f"{run.num_tasks} task(s) × {run.num_repeats}"
        )
        if not options["no_health_check"]:
            self.stdout.write(health.auto_check(run))
