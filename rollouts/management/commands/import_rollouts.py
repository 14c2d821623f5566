"""``python manage.py import_rollouts [FILE] [--failures F] [--name N] [--no-health-check]``: import a NeMo Gym
``rollouts.jsonl`` (and its failures sidecar, or the sidecar alone) into a new run with status
``imported``. All or nothing: a bad line, a file of the wrong kind (a failures sidecar given as
the rollouts file, files swapped, a dataset) is reported with what was found and nothing is stored."""
from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import LooksLikeDatasetError, import_rollouts
from rollouts.evaluation import health


class Command(BaseCommand):
    help = "Import a NeMo Gym rollouts.jsonl (and optionally its failures sidecar) to inspect it without re-running."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", help="a rollouts.jsonl written by NeMo Gym (or gymweb); optional with --failures")
        parser.add_argument("--failures", help="its failures sidecar (rollouts_failures.jsonl)")
        parser.add_argument("--name", default="", help="the run's name (default: the file names)")
        parser.add_argument("--no-health-check", action="store_true", help="skip the health check of the imported rows")

    def handle(self, *args, **options) -> None:
        path = Path(options["file"]) if options.get("file") else None
        failures_path = Path(options["failures"]) if options.get("failures") else None
        if path is None and failures_path is None:
            raise CommandError("give a rollouts.jsonl, a --failures file, or both")
        for p in filter(None, (path, failures_path)):
            if not p.is_file():
                raise CommandError(f"{p}: no such file")
        failures = failures_path.open("rb") if failures_path else None
        main = path.open("rb") if path else None
        try:
            summary = import_rollouts(
                main,
                name=options["name"],
                source=str(path) if path else "",
                failures=failures,
                failures_source=str(failures_path) if failures_path else "",
            )
        except LooksLikeDatasetError as exc:
            raise CommandError(
                f"{exc}: manage.py collect --input {path} --agent-url ... --env-url ... --output results/rollouts.jsonl"
            ) from None
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        finally:
            for fh in (main, failures):
                if fh is not None:
                    fh.close()
        run = summary.run
        self.stdout.write(
            f"imported run #{run.pk} {run.name!r}: {summary.rows} row(s), {summary.succeeded} succeeded, "
            f"{summary.failed} failed, {summary.not_run} never run, {summary.items} item(s); "
            f"{run.num_tasks} task(s) × {run.num_repeats}"
        )
        if not options["no_health_check"]:
            self.stdout.write(health.auto_check(run))
