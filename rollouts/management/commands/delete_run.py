"""``python manage.py delete_run RUN [RUN ...] [--batch N]``: delete runs with everything under them,
in bounded transactions (``rollouts.collection.archive.delete_run``). A run being collected is
refused: cancel it first."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive
from rollouts.management.run_ids import add_run_arguments, runs_named


class Command(BaseCommand):
    help = "Delete runs and everything under them (tasks, rollouts, items, labels, notes), in bounded batches."

    def add_arguments(self, parser: CommandParser) -> None:
        add_run_arguments(parser, "to delete")

    def handle(self, *args, **opts) -> None:
        for run in runs_named(opts, "deleted", lambda run: archive.check_idle(run, "deleted")):
            try:
                out = archive.delete_run(run, batch=opts["batch"])
            except archive.RunBusy as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"deleted run #{run.pk}: {out.rollouts} rollouts, {out.items} items, {out.agent_calls} agent calls "
                f"in {out.seconds:.1f} s (longest transaction {out.longest_transaction_s * 1000:.0f} ms)"
            )
