"""The arguments ``delete_run``, ``archive_run`` and ``restore_run`` share: run ids, each once, and
``--batch``."""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from rollouts.models import Run


def add_run_arguments(parser: CommandParser, what: str) -> None:
    """``RUN [RUN ...]`` (``what``: "to delete", …) and ``--batch N``."""
    parser.add_argument("runs", type=int, nargs="+", help=f"ids of the runs {what}")
    parser.add_argument(
        "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
    )


def runs_named(opts: dict, done: str) -> list[Run]:
    """The runs of ``opts["runs"]``, each once, in the order given. ``CommandError`` before
    anything is done when an id names no run (every such id, once: "nothing was ``done``") or
    ``--batch`` is below 1."""
    ids = list(dict.fromkeys(opts["runs"]))
    found = Run.objects.in_bulk(ids)
    missing = [f"#{pk}" for pk in ids if pk not in found]
    if missing:
        raise CommandError(f"no run {', '.join(missing)}; nothing was {done}")
    if opts["batch"] is not None and opts["batch"] < 1:
        raise CommandError("--batch must be >= 1")
    return [found[pk] for pk in ids]
