"""``gymweb settings``: every GYMWEB_* setting with its value (secrets masked) and where it came from."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gymweb import conf


def replace_table(text: str) -> str:
    """``text`` (docs/settings.md) with the part between the markers made anew from gymweb.conf.
    Raises ``ValueError`` when a marker is missing."""
    begin, end = text.find(conf.MARK_BEGIN), text.find(conf.MARK_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the markers {conf.MARK_BEGIN!r} and {conf.MARK_END!r} are not both there, in that order")
    return text[: begin + len(conf.MARK_BEGIN)] + "\n" + conf.markdown_table() + text[end:]


class Command(BaseCommand):
    help = "Print every GYMWEB_* setting with its value (secrets masked) and where it came from."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--markdown",
            action="store_true",
            help="print the settings table of docs/settings.md (defaults, not values)",
        )
        parser.add_argument(
            "--write-docs", metavar="FILE", help="rewrite the table between the markers in FILE (docs/settings.md)"
        )

    def handle(self, *args, **opts):
        if opts["write_docs"]:
            path = Path(opts["write_docs"])
            try:
                path.write_text(replace_table(path.read_text()))
            except (OSError, ValueError) as exc:
                raise CommandError(f"{path}: {exc}") from None
            self.stdout.write(f"wrote the settings table into {path}")
            return
        if opts["markdown"]:
            self.stdout.write(conf.markdown_table(), ending="")
            return
        rows = conf.describe(conf.load())
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            self.stdout.write(f"{r['name']:<{width}}  {r['value'] or '(empty)'}  [{r['source']}]")
        for name, close in conf.unknown_variables():
            hint = f" (did you mean {close}?)" if close else ""
            self.stderr.write(self.style.WARNING(f"warning: {name} is set but gymweb reads no such setting{hint}"))
