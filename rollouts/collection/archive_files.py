"""An archived run's files, read: their names, the errors, and the lines of one file. Below both
``archive`` (which writes and restores them) and ``export`` (which reads an archived run's files
from here), so neither imports the other's reader."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import zstandard

from rollouts.models import Run

__all__ = [
    "FILES",
    "FORMAT",
    "MANIFEST",
    "ZSTD_LEVEL",
    "ArchiveError",
    "RunArchived",
    "RunBusy",
    "archived_lines",
    "read_lines",
]

FORMAT = "gymweb-archive/1"
# file kind -> archive file name (the export's names, plus gymweb's details)
FILES = {
    "rollouts": "rollouts.jsonl.zst",
    "rollouts_failures": "rollouts_failures.jsonl.zst",
    "rollouts_materialized_inputs": "rollouts_materialized_inputs.jsonl.zst",
    "details": "gymweb_details.jsonl.zst",
}
MANIFEST = "manifest.json"
ZSTD_LEVEL = 3


class ArchiveError(Exception):
    """An archive cannot be written or read (missing folder, a file that does not match its
    manifest); the message names the file."""


class RunBusy(ArchiveError):
    """The run is still being collected (queued, running, or rollouts in flight): cancel it first."""


class RunArchived(ArchiveError):
    """The run's items are archived; what was asked needs them. Restore the run first."""

    def __init__(self, run: Run, what: str = "this"):
        self.run = run
        super().__init__(
            f"run {run.pk} is archived: {what} needs its items. Restore it first "
            f"(the run page's Restore button, POST /api/v1/runs/{run.pk}/restore, or gymweb restore_run {run.pk})."
        )


def read_lines(path: Path) -> Iterator[str]:
    """The lines (without newline) of one archive file, decompressed as they are read."""
    with path.open("rb") as fh:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8", newline="\n")
        for line in reader:
            yield line[:-1] if line.endswith("\n") else line


def shown(path: Path) -> str:
    """``path`` as an error names it: from the run's folder on (``run-3/manifest.json``), under
    the archive folder (``GYMWEB_ARCHIVE_DIR``). Errors reach users of the pages and the API, who
    learn nothing of the server's disks; operators know the setting."""
    return f"{path.parent.name}/{path.name}" if path.parent.name.startswith("run-") else path.name


def why(exc: BaseException) -> str:
    """An error's reason without the full path an ``OSError`` repeats (``No such file or directory``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def archived_lines(run: Run, kind: str) -> Iterator[str]:
    """Lines (without newline) of the archived run's file ``kind`` (``"rollouts"``,
    ``"rollouts_failures"``, ``"rollouts_materialized_inputs"``): exactly the export's lines at
    archiving time. Raises ``ArchiveError`` if the file is missing."""
    path = Path(run.archive_path) / FILES[kind]
    if not path.is_file():
        raise ArchiveError(f"run {run.pk}: archive file {shown(path)} is missing")
    return read_lines(path)
