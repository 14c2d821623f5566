"""``python manage.py delete_run RUN [RUN ...] [--batch N]``: delete runs with everything under them,
in bounded transactions (``rollouts.collection.archive.delete_run``). A run being collected is
refused: cancel it first."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive
from rollouts.models import Run


class Command(BaseCommand):
    help = "Delete runs and everything under them (tasks, rollouts, items, labels, notes), in bounded batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("runs", type=int, nargs="+", help="ids of the runs to delete")
        parser.add_argument(
            "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
        )

    def handle(self, *args, **opts) -> None:
        found = {run.pk: run for run in Run.objects.filter(pk__in=opts["runs"])}
        missing = [str(pk) for pk in opts["runs"] if pk not in found]
        if missing:
            raise CommandError(f"no run #{', #'.join(missing)}; nothing was deleted")
        if opts["batch"] is not None and opts["batch"] < 1:
            raise CommandError("--batch must be >= 1")
        for pk in dict.fromkeys(opts["runs"]):
            try:
                out = archive.delete_run(found[pk], batch=opts["batch"])
            except archive.RunBusy as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"deleted run #{pk}: {out.rollouts} rollouts, {out.items} items, {out.agent_calls} agent calls "
                f"in {out.seconds:.1f} s (longest transaction {out.longest_transaction_s * 1000:.0f} ms)"
            )
