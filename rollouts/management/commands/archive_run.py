"""``python manage.py archive_run RUN [RUN ...] [--batch N]``: archive finished runs to
``GYMWEB_ARCHIVE_DIR`` (``rollouts.collection.archive.archive_run``); ``restore_run`` brings them back."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive
from rollouts.models import Run


class Command(BaseCommand):
    help = (
        "Archive finished runs: their NeMo Gym files, zstd-compressed, to GYMWEB_ARCHIVE_DIR; items leave the database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("runs", type=int, nargs="+", help="ids of the runs to archive")
        parser.add_argument(
            "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
        )

    def handle(self, *args, **opts) -> None:
        found = {run.pk: run for run in Run.objects.filter(pk__in=opts["runs"])}
        missing = [str(pk) for pk in opts["runs"] if pk not in found]
        if missing:
            raise CommandError(f"no run #{', #'.join(missing)}; nothing was archived")
        if opts["batch"] is not None and opts["batch"] < 1:
            raise CommandError("--batch must be >= 1")
        for pk in dict.fromkeys(opts["runs"]):
            try:
                out = archive.archive_run(found[pk], batch=opts["batch"])
            except archive.ArchiveError as exc:
                raise CommandError(str(exc)) from None
            size = sum(f["bytes"] for f in out.files.values())
            self.stdout.write(
                f"archived run #{pk} to {out.path}: {out.rollouts} rollouts, {out.items} items dropped, "
                f"{size:,} bytes of files, {out.seconds:.1f} s (longest transaction {out.longest_transaction_s * 1000:.0f} ms)"
            )
