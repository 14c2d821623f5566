"""Evaluation files: writing NeMo Gym's JSON bytes (orjson), never over an existing file unless asked.

NeMo Gym writes its evaluation files with ``orjson.dumps`` (compact; ``OPT_INDENT_2`` for
``*_aggregate_metrics.json``), so gymweb does too: same bytes for the same data. Its commands refuse
to replace an existing output unless ``--overwrite`` is given (``rollout_reverification.py``:
"Output file already exists: ... Pass --overwrite"); every gymweb command that writes files follows
that rule through ``check_outputs``, which looks at all of a command's outputs before anything is
written, so a refusal leaves every file as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

__all__ = ["OutputExists", "check_outputs", "dumps", "write_bytes"]

_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


class OutputExists(FileExistsError):
    """Some output files exist and ``overwrite`` was not given. ``paths``: the existing ones;
    ``str(exc)`` names them and the flag that allows replacing them."""

    def __init__(self, paths: list[Path], flag: str = "--overwrite"):
        self.paths = paths
        names = ", ".join(str(p) for p in paths)
        super().__init__(
            f"output file{'s' if len(paths) != 1 else ''} already exist{'' if len(paths) != 1 else 's'}: {names}. "
            f"Nothing was written; pass {flag} to replace {'them' if len(paths) != 1 else 'it'}."
        )


def check_outputs(paths: Iterable[str | Path], overwrite: bool, flag: str = "--overwrite") -> list[Path]:
    """Check that ``paths`` may be written: each parent is (or can become) a directory and no path is
    a directory; with ``overwrite`` False, none exists yet.

    Returns the paths as ``Path`` objects. Raises ``OutputExists`` (listing every existing one) or
    ``IsADirectoryError``/``NotADirectoryError`` naming the path. Writes nothing.
    """
    checked = [Path(p) for p in paths]
    for path in checked:
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory, not a file")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise NotADirectoryError(f"cannot write {path}: {parent} is a file, not a directory")
                break
    existing = [p for p in checked if p.exists()]
    if existing and not overwrite:
        raise OutputExists(existing, flag)
    return checked


def _exact_big_ints(value: Any) -> Any:
    """``value`` with integers outside 64 bits as ``orjson.Fragment`` of their digits (orjson refuses
    them; Python's json writes them exactly, and so does this)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _UINT64_MAX else orjson.Fragment(str(value).encode())
    if isinstance(value, dict):
        return {k: _exact_big_ints(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_exact_big_ints(v) for v in value]
    return value


def dumps(obj: Any, *, indent: bool = False) -> bytes:
    """``orjson.dumps(obj)`` (``OPT_INDENT_2`` with ``indent``): NeMo Gym's bytes. NaN and infinities
    become ``null``. An integer beyond 64 bits, which orjson refuses, is written with all its digits
    instead of failing. Raises ``TypeError`` for values JSON cannot hold."""
    option = orjson.OPT_INDENT_2 if indent else None
    try:
        return orjson.dumps(obj, option=option)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        return orjson.dumps(_exact_big_ints(obj), option=option)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file renamed into place, so a reader never sees
    half a file and a failed write leaves the old one. Creates missing directories. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
