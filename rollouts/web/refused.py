"""What an attempt's refused agent reply (``RefusedReply``) looks like on the rollout page and in
the API: the body as lines (indented JSON when it is JSON), each validation error pointing at the
line of the place its JSON path names. Model output: the lines are plain text, escaped by the
templates like every other value."""

from __future__ import annotations

import json
from typing import Any

from rollouts.engine.contract import NotJSON, strict_loads
from rollouts.models import RefusedReply

__all__ = ["refused_data", "refused_view"]


def refused_data(refused: RefusedReply | None) -> dict[str, Any] | None:
    """The refused reply as plain data (the API's and the raw endpoint's shape): ``http_status``,
    ``content_type``, ``size`` (bytes of the whole body), ``truncated``, ``errors`` (``{"path",
    "message"}``) and ``body`` (the kept bytes as UTF-8 text, undecodable bytes as U+FFFD)."""
    if refused is None:
        return None
    return {
        "http_status": refused.http_status,
        "content_type": refused.content_type,
        "size": refused.size,
        "truncated": refused.truncated,
        "errors": list(refused.errors or []),
        "body": refused.text,
    }


def _layout(value: Any) -> tuple[list[str], dict[tuple, int]]:
    """``value`` as indented JSON lines (two spaces, as ``json.dumps(indent=2)``) and the line
    (0-based) where each JSON path's value starts."""
    lines: list[str] = []
    where: dict[tuple, int] = {}

    def emit(node: Any, path: tuple, indent: str, prefix: str, comma: str) -> None:
        where[path] = len(lines)
        if isinstance(node, dict) and node:
            lines.append(f"{indent}{prefix}{{")
            keys = list(node)
            for i, key in enumerate(keys):
                emit(
                    node[key],
                    path + (key,),
                    indent + "  ",
                    f"{json.dumps(key, ensure_ascii=False)}: ",
                    "," if i < len(keys) - 1 else "",
                )
            lines.append(f"{indent}}}{comma}")
        elif isinstance(node, list) and node:
            lines.append(f"{indent}{prefix}[")
            for i, child in enumerate(node):
                emit(child, path + (i,), indent + "  ", "", "," if i < len(node) - 1 else "")
            lines.append(f"{indent}]{comma}")
        else:
            lines.append(f"{indent}{prefix}{json.dumps(node, ensure_ascii=False)}{comma}")

    emit(value, (), "", "", "")
    return lines, where


def _line_of(path: list[Any], where: dict[tuple, int]) -> int | None:
    """The line of ``path``, or of its nearest ancestor that is in the body (a missing field
    points at the object that lacks it)."""
    key = tuple(path)
    while key not in where and key:
        key = key[:-1]
    return where.get(key)


def refused_view(refused: RefusedReply | None, max_chars: int) -> dict[str, Any] | None:
    """The refused reply for the rollout page: the facts of ``refused_data``, ``kept`` (bytes),
    ``lines`` (each
    ``{"n": 1-based number, "text", "marked"}``, at most about ``max_chars`` characters of them;
    ``cut`` says how many lines were left out, a long line is cut with "…"), ``json`` (True when
    the body was laid out as JSON) and ``errors`` (each with ``where``: the dotted path, ``line``:
    the number of the line it points at or None, ``shown``: that line is among ``lines``)."""
    data = refused_data(refused)
    if data is None:
        return None
    text = data["body"]
    where: dict[tuple, int] = {}
    laid_out = False
    if not data["truncated"] and text.strip():
        try:
            lines, where = _layout(strict_loads(text))
            laid_out = True
        except NotJSON:
            pass
    if not laid_out:
        lines = text.splitlines() or [""]
    errors = []
    for error in data["errors"]:
        path = error.get("path") or []
        line = _line_of(path, where) if laid_out else None
        errors.append(
            {
                "where": ".".join(str(p) for p in path) or "(top level)",
                "message": error.get("message", ""),
                "line": None if line is None else line + 1,
            }
        )
    marked = {e["line"] for e in errors if e["line"] is not None}
    shown: list[dict[str, Any]] = []
    used = 0
    for n, line in enumerate(lines, 1):
        if used >= max_chars:
            break
        if len(line) > max_chars - used:
            line = line[: max(0, max_chars - used)] + "…"
        shown.append({"n": n, "text": line, "marked": n in marked})
        used += len(line) + 1
    for error in errors:
        error["shown"] = error["line"] is not None and error["line"] <= len(shown)
    return {
        **data,
        "kept": len(bytes(refused.body)),
        "lines": shown,
        "cut": len(lines) - len(shown),
        "json": laid_out,
        "errors": errors,
    }
