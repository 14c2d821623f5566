"""``python manage.py archive_run RUN [RUN ...] [--batch N]``: archive finished runs to
``GYMWEB_ARCHIVE_DIR`` (``rollouts.collection.archive.archive_run``); ``restore_run`` brings them back."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive
from rollouts.management.run_ids import add_run_arguments, runs_named


class Command(BaseCommand):
    help = (
        "Archive finished runs: their NeMo Gym files, zstd-compressed, to GYMWEB_ARCHIVE_DIR; items leave the database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_run_arguments(parser, "to archive")

    def handle(self, *args, **opts) -> None:
        for run in runs_named(opts, "archived", lambda run: archive.check_idle(run, "archived")):
            try:
                out = archive.archive_run(run, batch=opts["batch"])
            except archive.ArchiveError as exc:
                raise CommandError(str(exc)) from None
            size = sum(f["bytes"] for f in out.files.values())
            self.stdout.write(
                f"archived run #{run.pk} to {out.path}: {out.rollouts} rollouts, {out.items} items dropped, "
                f"{size:,} bytes of files, {out.seconds:.1f} s (longest transaction {out.longest_transaction_s * 1000:.0f} ms)"
            )
