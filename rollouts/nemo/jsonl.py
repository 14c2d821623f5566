"""Reading a JSONL file of rows: ``iter_objects`` yields ``(line number, line, object)`` for each
non-blank line; ``JsonlError`` says which file and line cannot be read, and why. No Django."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

__all__ = ["JsonlError", "iter_objects"]


class JsonlError(ValueError):
    """A JSONL file (``source``) cannot be read at ``line`` (1-based; None for the whole file);
    ``reason`` says why, ``str(exc)`` says what and where, e.g.
    ``"rollouts.jsonl, line 3: not valid JSON (Expecting value)"``."""

    def __init__(self, message: str, line: int | None = None, source: str = ""):
        self.line = line
        self.source = source
        where = ", ".join(p for p in (source, f"line {line}" if line else "") if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.reason = message


def iter_objects(
    path: str | Path,
    *,
    error: type[JsonlError] = JsonlError,
    parser: Literal["json", "orjson"] = "json",
    not_object: str = "expected a JSON object",
    hint: str = "",
) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """``(1-based line number, the line's bytes stripped of surrounding whitespace, object)`` for
    the JSON object on each non-blank line of ``path``.

    ``parser`` ``"json"``: the line is decoded as UTF-8 (a byte order mark before the first line is
    skipped, as the import skips it), then parsed by Python's ``json``; ``"orjson"``: the bytes are
    parsed as they are by orjson (no byte order mark, no NaN, integers within 64 bits; its message
    is quoted whole). Raises ``error`` (``JsonlError`` or a subclass) naming the file and line for
    text that is not UTF-8, a line that is not JSON (``hint``, if given, follows the reason) or not
    an object (``not_object``, then the type found); ``FileNotFoundError``/``IsADirectoryError``
    as ``open`` does."""
    source = str(path)
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line:
                continue
            if parser == "orjson":
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise error(f"not valid JSON ({exc})", number, source) from None
            else:
                try:
                    row = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
                except UnicodeDecodeError as exc:
                    raise error(f"not UTF-8 text ({exc.reason} at byte {exc.start})", number, source) from None
                except ValueError as exc:
                    raise error(f"not valid JSON ({getattr(exc, 'msg', exc)}){hint}", number, source) from None
            if not isinstance(row, dict):
                raise error(f"{not_object}, got {type(row).__name__}", number, source)
            yield number, line, row
