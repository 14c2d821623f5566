"""``python manage.py prune --older-than 30d [--archive] [--dry-run]``: delete (or archive) every
finished run older than the given age (``rollouts.collection.archive.prune``). Runs being collected
are never touched. Age: a number and a unit, s, m, h, d or w (``30d``, ``12h``, ``2w``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection import archive


class Command(BaseCommand):
    help = "Delete (or, with --archive, archive) finished runs older than --older-than (e.g. 30d)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", required=True, help="age of a run (since it finished): 30d, 12h, 2w, 90m, 3600s"
        )
        parser.add_argument("--archive", action="store_true", help="archive the runs instead of deleting them")
        parser.add_argument("--dry-run", action="store_true", help="only list what would be done")
        parser.add_argument(
            "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
        )

    def handle(self, *args, **opts) -> None:
        try:
            age = archive.parse_age(opts["older_than"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if opts["batch"] is not None and opts["batch"] < 1:
            raise CommandError("--batch must be >= 1")
        said: list[str] = []

        def say(line: str) -> None:
            said.append(line)
            self.stdout.write(line)

        try:
            done = archive.prune(age, archive=opts["archive"], batch=opts["batch"], dry_run=opts["dry_run"], log=say)
        except archive.ArchiveError as exc:
            raise CommandError(str(exc)) from None
        if not said:
            which = "not yet archived " if opts["archive"] else ""
            self.stdout.write(f"no finished run {which}is older than {opts['older_than']}: nothing to do")
        if not opts["dry_run"]:
            verb = "archived" if opts["archive"] else "deleted"
            self.stdout.write(f"{verb} {len(done)} run(s), {sum(o.rollouts for o in done)} rollouts")
