"""The arguments ``delete_run``, ``archive_run`` and ``restore_run`` share: run ids, each once, and
``--batch``."""

from __future__ import annotations

from collections.abc import Callable

from django.core.management.base import CommandError, CommandParser

from rollouts.collection.archive import ArchiveError
from rollouts.models import Run

MAX_ID = 2**63 - 1  # the largest id a database can hold (a bigint)


def add_run_arguments(parser: CommandParser, what: str) -> None:
    """``RUN [RUN ...]`` (``what``: "to delete", …) and ``--batch N``."""
    parser.add_argument("runs", type=int, nargs="+", help=f"ids of the runs {what}")
    parser.add_argument(
        "--batch", type=int, default=None, help="rollouts per transaction (default GYMWEB_DELETE_BATCH)"
    )


def runs_named(opts: dict, done: str, check: Callable[[Run], None] | None = None) -> list[Run]:
    """The runs of ``opts["runs"]``, each once, in the order given. ``CommandError`` before
    anything is done when an id names no run (every such id, once: "nothing was ``done``"), when
    ``check`` refuses one of them (``ArchiveError``/``RunBusy``: a run being collected, one not
    archived), or when ``--batch`` is below 1."""
    ids = list(dict.fromkeys(opts["runs"]))
    found = Run.objects.in_bulk([pk for pk in ids if 0 < pk <= MAX_ID])  # past a bigint: no run, not an error
    missing = [f"#{pk}" for pk in ids if pk not in found]
    if missing:
        raise CommandError(f"no run {', '.join(missing)}; nothing was {done}")
    if opts["batch"] is not None and opts["batch"] < 1:
        raise CommandError("--batch must be >= 1")
    runs = [found[pk] for pk in ids]
    for run in runs if check is not None else ():
        try:
            check(run)
        except ArchiveError as exc:  # RunBusy too
            raise CommandError(f"{exc}; nothing was {done}") from None
    return runs
