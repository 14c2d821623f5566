"""``python manage.py import_rollouts FILE [--failures F] [--name N]``: import a NeMo Gym
``rollouts.jsonl`` (and its failures sidecar) into a new run with status ``imported``."""
from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import import_rollouts
from rollouts.evaluation import health


class Command(BaseCommand):
    help = "Import a NeMo Gym rollouts.jsonl (and optionally its failures sidecar) to inspect it without re-running."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="a rollouts.jsonl written by NeMo Gym (or gymweb)")
        parser.add_argument("--failures", help="its failures sidecar (rollouts_failures.jsonl)")
        parser.add_argument("--name", default="", help="the run's name (default: the file names)")
        parser.add_argument("--no-health-check", action="store_true", help="skip the health check of the imported rows")

    def handle(self, *args, **options) -> None:
        path = Path(options["file"])
        failures_path = Path(options["failures"]) if options.get("failures") else None
        for p in filter(None, (path, failures_path)):
            if not p.is_file():
                raise CommandError(f"{p}: no such file")
        failures = failures_path.open("rb") if failures_path else None
        try:
            with path.open("rb") as fh:
                summary = import_rollouts(
                    fh,
                    name=options["name"],
                    source=str(path),
                    failures=failures,
                    failures_source=str(failures_path) if failures_path else "",
                )
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        finally:
            if failures is not None:
                failures.close()
        run = summary.run
        self.stdout.write(
            f"imported run #{run.pk} {run.name!r}: {summary.rows} row(s), {summary.succeeded} succeeded, "
            f"{summary.failed} failed, {summary.not_run} never run, {summary.items} item(s)"
        )
        if not options["no_health_check"]:
            self.stdout.write(health.auto_check(run))
