"""``python manage.py restore_run RUN [RUN ...] [--keep-files]``: bring archived runs' items back
from their archive files (``rollouts.collection.archive.restore_run``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive
from rollouts.models import Run


class Command(BaseCommand):
    help = "Restore archived runs: their items come back from the archive files, which are then removed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("runs", type=int, nargs="+", help="ids of the archived runs to restore")
        parser.add_argument(
            "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
        )
        parser.add_argument("--keep-files", action="store_true", help="keep the archive files after restoring")

    def handle(self, *args, **opts) -> None:
        found = {run.pk: run for run in Run.objects.filter(pk__in=opts["runs"])}
        missing = [str(pk) for pk in opts["runs"] if pk not in found]
        if missing:
            raise CommandError(f"no run #{', #'.join(missing)}; nothing was restored")
        if opts["batch"] is not None and opts["batch"] < 1:
            raise CommandError("--batch must be >= 1")
        for pk in dict.fromkeys(opts["runs"]):
            try:
                out = archive.restore_run(found[pk], batch=opts["batch"], keep_files=opts["keep_files"])
            except archive.ArchiveError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"restored run #{pk}: {out.rollouts} rollouts, {out.items} items, {out.seconds:.1f} s "
                f"(longest transaction {out.longest_transaction_s * 1000:.0f} ms)"
            )
