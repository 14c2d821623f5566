"""Datasets in NeMo Gym's JSONL format: reading, validation, stripping stale results, materialising.

No Django here. Rules from DESIGN.md, "Datasets, runs and files".
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO, Union

from rollouts.engine.contract import NotJSON, strict_loads
from rollouts.nemo.jsonl import JsonlError
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "DatasetError",
    "RESULT_FIELDS",
    "MaterializedTask",
    "ParsedDataset",
    "materialize",
    "merge_overrides",
    "read_jsonl",
    "strip_result_fields",
    "iter_rows",
    "iter_lines",
    "DEFAULT_MAX_LINE_BYTES",
    "validate_row",
    "too_long_reason",
    "INLINE_SOURCE",
]

# Task and rollout indices are stored in 32-bit integer columns.
MAX_INDEX = 2**31 - 1

# The longest line a reader accepts unless told otherwise (bytes; the web and the commands pass
# GYMWEB_MAX_LINE_BYTES). A line is held whole while it is parsed, so this bounds memory.
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
# How much of a file stream is read at a time (bytes).
READ_CHUNK_BYTES = 1024 * 1024

# Result fields of an earlier output file; stripped on the way in so a stale result can neither
# collide with nor leak into the new run's output (seed, "Gotchas"; DESIGN.md).
RESULT_FIELDS = (
    "reward",
    "response",
    "error",
    "_ng_failure_class",
    "_ng_failure_terminal",
    "_ng_no_persist",
    "_gymweb_failure_kind",
)


class DatasetError(JsonlError):
    """A dataset cannot be used. ``line`` is the 1-based line number (None for whole-file problems);
    ``str(exc)`` says what and where, e.g.
    ``"tasks.jsonl, line 3: not valid JSON (Expecting ',' delimiter at column 43)"``."""


@dataclass
class ParsedDataset:
    """Validated rows in file order. ``rows[i]`` came from line ``lines[i]`` (1-based);
    ``texts[i]`` is the line's text as written (it decides which rows are the same task)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    sha256: str = ""
    stripped_fields: set[str] = field(default_factory=set)


def strip_result_fields(row: dict[str, Any]) -> list[str]:
    """Remove ``RESULT_FIELDS`` from ``row`` in place; returns the names removed."""
    removed = [name for name in RESULT_FIELDS if name in row]
    for name in removed:
        del row[name]
    return removed


def _check_params(params: Any) -> str | None:
    """Why ``responses_create_params`` cannot be sent, or None."""
    if not isinstance(params, dict):
        return "'responses_create_params' must be a JSON object"
    if "input" not in params:
        return "'responses_create_params' has no 'input'"
    if not isinstance(params["input"], (str, list)):
        return "'responses_create_params.input' must be a string or a list of items"
    tools = params.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "'responses_create_params.tools' must be a list"
    return None


def validate_row(row: Any, line: int, source: str) -> dict[str, Any]:
    """Check one dataset row (DESIGN.md, "Datasets"); returns it or raises ``DatasetError``."""
    if not isinstance(row, dict):
        raise DatasetError(f"each line must be a JSON object, got {type(row).__name__}", line, source)
    params = row.get("responses_create_params")
    if params is None:
        raise DatasetError("the row has no 'responses_create_params'", line, source)
    problem = _check_params(params)
    if problem:
        raise DatasetError(problem, line, source)
    for key in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME):
        if key in row and (isinstance(row[key], bool) or not isinstance(row[key], int)):
            raise DatasetError(f"'{key}' must be an integer", line, source)
        if key in row and not 0 <= row[key] <= MAX_INDEX:
            raise DatasetError(f"'{key}' must be between 0 and {MAX_INDEX} (got {row[key]})", line, source)
    if "agent_ref" in row and not isinstance(row["agent_ref"], dict):
        raise DatasetError('\'agent_ref\' must be a JSON object like {"name": "..."}', line, source)
    return row


def _json_problem(exc: NotJSON, indent: int = 0) -> str:
    """A JSON error of one line without the parser's own "line 1 column 43 (char 42)", which
    would read as a second line number: ``"Expecting ',' delimiter at column 43"``."""
    if exc.reason and exc.column is not None and exc.line == 1:
        # Some of the parser's reasons end in "at" ("Invalid control character at"): one "at" only.
        return f"{exc.reason.removesuffix(' at')} at column {exc.column + indent}"
    return str(exc)


Lines = Union[BinaryIO, TextIO, Iterable[str | bytes]]


def too_long_reason(limit: int, what: str = "line") -> str:
    """Why a ``what`` (a file's line, an inline row) longer than ``limit`` bytes is refused."""
    shown = f"{limit / (1024 * 1024):g} MB" if limit >= 1024 * 1024 else f"{limit:,} bytes"
    return f"the {what} is longer than the limit of {shown} per {what} (GYMWEB_MAX_LINE_BYTES)"


def _line_too_long(number: int, limit: int, source: str) -> DatasetError:
    return DatasetError(f"{too_long_reason(limit)}; nothing was read past it", number, source)


def iter_lines(stream: Lines, source: str = "", max_line_bytes: int | None = None) -> Iterator[tuple[int, str | bytes]]:
    """``(line number, line)`` for every line of ``stream`` (1-based; the newline kept), in time
    linear in the stream's size and memory bounded by one line plus ``READ_CHUNK_BYTES``.

    ``stream`` is a file object (binary or text; anything with ``read(n)``, e.g. a Django upload)
    or an iterable of lines. Lines end at ``\n`` only (JSONL). A line longer than
    ``max_line_bytes`` (default ``DEFAULT_MAX_LINE_BYTES``; characters for a text stream, the
    newline not counted) raises ``DatasetError`` naming it as soon as the limit is passed, without
    reading the rest of that line into memory.

    Django's ``File.__iter__`` joins a long line chunk by chunk (``buffer_ + line``: quadratic,
    9 s for one 50 MB line); this keeps the pieces in a list and joins them once.
    """
    limit = DEFAULT_MAX_LINE_BYTES if max_line_bytes is None else int(max_line_bytes)
    read = getattr(stream, "read", None)
    if read is None:  # an iterable of lines (a list, a generator)
        for number, line in enumerate(stream, start=1):
            if len(line) - (1 if line[-1:] in ("\n", b"\n") else 0) > limit:
                raise _line_too_long(number, limit, source)
            yield number, line
        return
    number = 1
    pieces: list = []
    pending = 0  # length of the pieces (no newline among them)
    while True:
        chunk = read(READ_CHUNK_BYTES)
        if not chunk:
            break
        newline = "\n" if isinstance(chunk, str) else b"\n"
        start = 0
        while True:
            end = chunk.find(newline, start)
            if end < 0:
                if pending + len(chunk) - start > limit:
                    raise _line_too_long(number, limit, source)
                if start < len(chunk):
                    pieces.append(chunk[start:] if start else chunk)
                    pending += len(chunk) - start
                break
            if pending + end - start > limit:
                raise _line_too_long(number, limit, source)
            piece = chunk[start : end + 1]
            if pieces:
                pieces.append(piece)
                piece = piece[:0].join(pieces)
                pieces, pending = [], 0  # dropped before the line is handed on: one copy alive
            yield number, piece
            number += 1
            start = end + 1
    if pieces:
        yield number, pieces[0][:0].join(pieces)


# Up to this size, a file whose first line is not JSON is tried as one whole JSON document, to say
# so instead of "line 1: not valid JSON" (bytes; a larger file's error stays the line's).
WHOLE_DOCUMENT_BYTES = 4 * 1024 * 1024
# NeMo Gym's JSON (not JSONL) files a user may pick by mistake: what each is.
# The source name of task rows sent in a request body (``POST /api/v1/runs``), not in a file: the
# dataset's name and what their errors name.
INLINE_SOURCE = "inline rows"

NEMO_GYM_JSON_FILES = {
    "quality_summary.json": "NeMo Gym's health check summary of a run",
    "rollouts_aggregate_metrics.json": "NeMo Gym's aggregate metrics of a run",
    "rollouts_agent_metrics.json": "NeMo Gym's per-agent metrics of a run",
    "rollouts_repeat_level_metrics.json": "NeMo Gym's repeat-level metrics of a run",
    "compare_report.json": "NeMo Gym's comparison report of two runs",
}


def _json_document(first: str, rest: Iterator[tuple[int, str | bytes]], source: str) -> str | None:
    """The refusal of a file that is one whole JSON document (``first``: its first line, which did
    not parse alone; ``rest``: the lines after it, consumed), or None if it is not one or is larger
    than ``WHOLE_DOCUMENT_BYTES`` (then only the first line's error is reported)."""
    parts, size = [first, "\n"], len(first)
    try:
        for _number, raw in rest:
            size += len(raw)
            if size > WHOLE_DOCUMENT_BYTES:
                return None
            parts.append(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
        strict_loads("".join(parts), unique_keys=True)  # a row naming a key twice is that row's error
    except (DatasetError, UnicodeDecodeError, NotJSON):
        return None
    message = "this is a JSON document, not JSONL (one JSON object per line)"
    known = NEMO_GYM_JSON_FILES.get(source.replace("\\", "/").rsplit("/", 1)[-1])
    if not known and first.lstrip().startswith("["):
        return _json_array(source)
    if known:
        message = f"this is {known} (a JSON document), not JSONL; a run's import takes its rollouts.jsonl"
    return message


def _json_array(source: str) -> str:
    """The refusal of a file that is one JSON array (on one line or several), with the command that
    turns it into JSONL (one element per line), the file's own name in it when known. Rows that
    came in no file (``INLINE_SOURCE``: the API's request body) get the way to send an array."""
    name = source.replace("\\", "/").rsplit("/", 1)[-1] or "tasks.json"
    if source == INLINE_SOURCE:
        return (
            "this is a JSON array, not JSONL (one JSON object per line); send an array as application/json, in `rows`"
        )
    stem = name[: -len(".json")] if name.endswith(".json") else name
    out = f"{stem}.jsonl" if stem != name else f"{name}.jsonl"
    return (
        "this is a JSON array, not JSONL (one JSON object per line); "
        f"convert it with: jq -c '.[]' {shlex.quote(name)} > {shlex.quote(out)}"
    )


def iter_rows(
    stream: Lines,
    source: str = "",
    digest: Any = None,
    max_line_bytes: int | None = None,
    validate: Callable[[Any, int, str], dict[str, Any]] | None = None,
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, line text, row)`` for every non-blank line of a JSONL stream, each row strict
    JSON (``contract.strict_loads``) and valid (``validate``, default ``validate_row``). ``digest``
    (a hashlib object), if given, is fed every line as read. Lines are read by ``iter_lines`` (linear time, at most
    ``max_line_bytes`` per line). Raises ``DatasetError`` naming the first bad or too long line, or
    saying that a small file is a whole JSON document rather than JSONL (``_json_document``)."""
    lines = iter_lines(stream, source, max_line_bytes)
    for number, raw in lines:
        if number == 1 and raw[:2] in (b"\x1f\x8b", "\x1f\x8b"):
            raise DatasetError("the file is gzip-compressed; give the uncompressed .jsonl file", None, source)
        if isinstance(raw, bytes):
            if digest is not None:
                digest.update(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})", number, source) from None
        else:
            text = raw
            if digest is not None:
                digest.update(text.encode("utf-8", "surrogatepass"))
        body = text.lstrip()
        indent = len(text) - len(body)  # columns are counted in the line as written
        text = body.rstrip().removeprefix("\ufeff").strip()
        if not text:
            continue
        try:
            row = strict_loads(text, unique_keys=True)
        except NotJSON as exc:
            whole = _json_document(text, lines, source) if number == 1 and text[:1] in ("[", "{") else None
            if whole:
                raise DatasetError(whole, None, source) from None
            raise DatasetError(f"not valid JSON ({_json_problem(exc, indent)})", number, source) from None
        if number == 1 and isinstance(row, list):
            if not any(rest.strip() for _n, rest in lines):  # the whole file is this one array
                raise DatasetError(_json_array(source), None, source)
            raise DatasetError("each line must be a JSON object, got a JSON array", number, source)
        yield number, text, (validate or validate_row)(row, number, source)


def too_many_rows(limit: int, line: int | None, source: str) -> DatasetError:
    """The refusal of a dataset with more rows than a run may have keys (``limit``)."""
    return DatasetError(
        f"the dataset has more than {limit:,} rows, and a run holds at most {limit:,} keys "
        "(GYMWEB_MAX_KEYS_PER_RUN): split it into several datasets",
        line,
        source,
    )


def read_jsonl(
    stream: Lines,
    source: str = "",
    max_rows: int | None = None,
    max_line_bytes: int | None = None,
    refuse_over: int | None = None,
) -> ParsedDataset:
    """Read and validate a whole JSONL dataset; nothing is returned unless every line is good.

    ``stream`` is a file object or yields lines (bytes or text). Blank lines are skipped. Each row
    must be a JSON object with ``responses_create_params`` (an object with ``input``). Stale result
    fields are stripped (``RESULT_FIELDS``). ``max_rows`` stops reading after that many rows (for
    ``limit``); ``max_line_bytes`` bounds one line (``iter_lines``); ``refuse_over`` refuses the
    file at its row ``refuse_over + 1``, while reading (``too_many_rows``).
    Raises ``DatasetError`` with the line number for the first bad line, or for an empty file.
    """
    parsed = ParsedDataset()
    digest = hashlib.sha256()
    for number, text, row in iter_rows(stream, source, digest, max_line_bytes):
        parsed.stripped_fields.update(strip_result_fields(row))
        parsed.rows.append(row)
        parsed.lines.append(number)
        parsed.texts.append(text)
        if max_rows is not None and len(parsed.rows) >= max_rows:
            break
        if refuse_over is not None and len(parsed.rows) > refuse_over:
            raise too_many_rows(refuse_over, number, source)
    if not parsed.rows:
        raise DatasetError("the file has no rows (it is empty or only blank lines)", None, source)
    parsed.sha256 = digest.hexdigest()
    return parsed


def merge_overrides(params: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``params`` with ``overrides`` merged in: nested objects merge key by key, anything else
    (lists included) is replaced. Returns a new dict; neither argument is changed."""
    if not overrides:
        return params
    merged = dict(params)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged


@dataclass
class MaterializedTask:
    """One task of a run: ``row`` is the materialised row without ``_ng_rollout_index``;
    ``rollout_indices`` the keys to run for it (0..k-1)."""

    task_index: int
    row: dict[str, Any]
    rollout_indices: list[int]

    def rollout_row(self, rollout_index: int) -> dict[str, Any]:
        """The materialised row of one (task, rollout) key, as NeMo Gym writes it."""
        row = dict(self.row)
        row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
        return row


def materialize(
    parsed: ParsedDataset,
    *,
    agent_name: str = "remote_agent",
    num_repeats: int = 1,
    limit: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[MaterializedTask]:
    """Materialise a run from validated rows (NeMo Gym's rules, DESIGN.md "Datasets, runs and files").

    - ``limit``: only the first N rows; ``num_repeats``: each row k times in a row (abc → aabbcc).
    - ``_ng_task_index``: kept if the row has one; else rows with identical line text share one,
      numbered in order of first appearance (skipping indices that rows carry themselves).
    - ``_ng_rollout_index``: 0..k-1 per task, in order.
    - ``agent_ref``: kept if the row has one, else ``{"name": agent_name}``.
    - ``overrides`` merged into ``responses_create_params``.

    Returns the tasks in order of first appearance. Raises ``ValueError`` for num_repeats < 1.
    """
    if num_repeats < 1:
        raise ValueError("num_repeats must be at least 1")
    count = len(parsed.rows) if limit is None else min(limit, len(parsed.rows))
    explicit = {row[TASK_INDEX_KEY_NAME] for row in parsed.rows[:count] if TASK_INDEX_KEY_NAME in row}
    by_text: dict[str, int] = {}
    tasks: dict[int, MaterializedTask] = {}
    next_index = 0
    for row, text in zip(parsed.rows[:count], parsed.texts[:count]):
        if TASK_INDEX_KEY_NAME in row:
            task_index = row[TASK_INDEX_KEY_NAME]
        elif text in by_text:
            task_index = by_text[text]
        else:
            while next_index in explicit:
                next_index += 1
            task_index = by_text[text] = next_index
            next_index += 1
        task = tasks.get(task_index)
        if task is None:
            materialized = {k: v for k, v in row.items() if k not in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)}
            materialized["responses_create_params"] = merge_overrides(row["responses_create_params"], overrides)
            materialized["agent_ref"] = row.get("agent_ref") or {"name": agent_name}
            if "agent_ref" in row:  # keep the row's own key order where it had one
                materialized = {
                    **{k: v for k, v in materialized.items() if k != "agent_ref"},
                    "agent_ref": materialized["agent_ref"],
                }
            materialized[TASK_INDEX_KEY_NAME] = task_index
            task = tasks[task_index] = MaterializedTask(task_index, materialized, [])
        for _ in range(num_repeats):
            task.rollout_indices.append(len(task.rollout_indices))
    return list(tasks.values())


def iter_materialized_rows(tasks: Iterable[MaterializedTask]) -> Iterator[dict[str, Any]]:
    """Every (task, rollout) row in NeMo Gym's order (aabbcc)."""
    for task in tasks:
        for rollout_index in task.rollout_indices:
            yield task.rollout_row(rollout_index)
