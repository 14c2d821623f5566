"""``python manage.py restore_run RUN [RUN ...] [--keep-files]``: bring archived runs' items back
from their archive files (``rollouts.collection.archive.restore_run``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive
from rollouts.management.run_ids import add_run_arguments, runs_named


class Command(BaseCommand):
    help = "Restore archived runs: their items come back from the archive files, which are then removed."

    def add_arguments(self, parser: CommandParser) -> None:
        add_run_arguments(parser, "to restore")
        parser.add_argument("--keep-files", action="store_true", help="keep the archive files after restoring")

    def handle(self, *args, **opts) -> None:
        for run in runs_named(opts, "restored", archive.require_archived):
            try:
                out = archive.restore_run(run, batch=opts["batch"], keep_files=opts["keep_files"])
            except archive.ArchiveError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"restored run #{run.pk}: {out.rollouts} rollouts, {out.items} items, {out.seconds:.1f} s "
                f"(longest transaction {out.longest_transaction_s * 1000:.0f} ms)"
            )
