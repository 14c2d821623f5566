"""Import a NeMo Gym ``rollouts.jsonl`` (and optionally its failures sidecar and its
``rollouts_materialized_inputs.jsonl``) into a new run with status ``imported``, to inspect it
without running anything (DESIGN.md, "Import").

No views here: the import page and ``manage.py import_rollouts`` both call ``import_rollouts`` (one
file and its sidecar) or ``import_shards`` (several shards of one run, as ``gym eval aggregate``
takes them, with their sidecars).

Rules:

- Each row becomes one ``Rollout`` (one attempt of its (task, rollout) key). Rows without
  ``_ng_task_index`` are numbered by their row number in the file (0-based, blank lines skipped);
  rows without ``_ng_rollout_index`` get rollout 0.
- Each file must hold rows of its slot's kind, or nothing is imported (``WrongFileError``): a row with
  ``_ng_failure_class`` in the rollouts file (a failures sidecar, or the two files swapped), a row
  without it in the failures file. A rollouts file whose rows all lack a result (``response``,
  ``reward``) is a dataset, not rollouts (``LooksLikeDatasetError``): start a run from it instead.
  A rollouts file that can be rewound (every file the commands, pages and API give) is told apart
  before anything is written; a stream that cannot be, after its rows, and they are deleted again.
- A row's ``Task`` is the row minus the result fields (``datasets.strip_result_fields``) and minus
  ``_ng_rollout_index``, with ``_ng_task_index`` set; the first row seen of a task decides it.
- A *result row* (numeric ``reward``, no ``_ng_failure_class``) is a success: ``verify_json`` is
  the row as it came (``export.success_row`` sets ``_ng_task_index``, ``_ng_rollout_index`` and
  ``agent_ref`` in place, so exporting gives the line back byte for byte) and ``profile_json``
  the numbers NeMo Gym's profiler reads from that exported row
  (``profile_numbers.profile_json_for_verify``). Rows of the failures sidecar are failed attempts:
  ``error``, ``terminal`` from ``_ng_failure_terminal``,
  ``failure_kind`` from ``_gymweb_failure_kind`` (else ``"imported_failure"``). A row with no
  result at all among result rows is kept as a ``cancelled`` attempt (kill-shaped: shown, written
  to no file) explained as never run.
- The materialised inputs, when given, are read first and decide the tasks' rows; then the sidecar,
  so a key's failed attempts come before its success (resume order).
- Every imported line downloads again byte for byte (surrounding whitespace, blank lines and a
  missing final newline aside):
  each row keeps its position among its file's rows (``Rollout.source_ordinal``, ``input_ordinal``),
  and a line the export (``export.row_line`` over ``success_row``/``failure_row``/
  ``materialized_row``) would not write identically is kept as it came (``source_text``,
  ``input_text``).
- Items come from the row's merged ``response.output``, origin ``imported``. Step boundaries are
  inferred: a new agent call starts when an item other than a ``function_call_output`` follows a
  ``function_call_output``; an output belongs to the step whose call it answers. One ``AgentCall``
  per inferred step, latency unknown (stored as 0; pages say "latency unknown" for imported runs);
  its start time unknown (null) except the last call's, the row's ``response.created_at``.
- Who executed a tool call cannot be known from a file: a ``function_call`` answered by a later
  output is marked ``paired`` (never ``asked``, which would claim gymweb ran it); a call with no
  output anywhere stays unpaired (as in real coding-agent data); outputs are never marked as gym's.
- Usage fields come from ``response.usage`` when it is complete (``contract.Usage``).
- The run is named after the files (their names, not their paths); ``num_tasks`` and
  ``num_repeats`` come from the imported keys (5 tasks with rollouts 0..3 each: 5 × 4).

Bad input raises ``DatasetError`` naming the file and line; nothing is stored. A row the database
refuses is reported the same way (with its line), never as a crash.
Rows are streamed and written with ``bulk_create`` in batches (``ROWS_PER_BATCH`` rows or
``ITEMS_PER_BATCH`` trajectory items, whichever comes first), each batch its own short transaction,
so SQLite's write lock is never held for the whole import and the workers' writes never wait long
for it. Until the last batch is in, the run is being written (``rollouts.collection.writing``: shown
nowhere; each batch renews its lease); when the import is refused or fails part-way, the run and
everything its batches stored are deleted before the error is raised, and when the importing
process dies, the supervisor's sweep deletes them once the lease lapses. Memory is bounded by a
batch plus small per-key maps (task ids, attempt counters) and the ``TASK_ROWS_KEPT`` task rows
used last (an older one is read back from its ``Task``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any, BinaryIO, TextIO, Union

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone
from pydantic import ValidationError

from rollouts.collection import writing
from rollouts.collection.datasets import DatasetError, iter_rows, strip_result_fields, validate_row
from rollouts.collection.export import failure_row, materialized_row, row_line, success_row
from rollouts.collection.profile_numbers import profile_json_for_verify
from rollouts.engine.contract import Usage
from rollouts.lossless import dumps
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem
from rollouts.nemo import file_shapes
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.teams import team_for_new

__all__ = [
    "ImportSummary",
    "LooksLikeDatasetError",
    "WrongFileError",
    "import_rollouts",
    "import_shards",
    "infer_steps",
    "IMPORTED_FAILURE_KIND",
    "NOT_RUN_ERROR",
]

IMPORTED_FAILURE_KIND = "imported_failure"
NOT_RUN_ERROR = "imported without a result: the row is an input that was never run"
PLACEHOLDER_RESPONSE_ID = "remote_agent_failure"  # NeMo Gym's (and gymweb's) failure-row response
TOKENS_MAX = 2**63 - 1
ROWS_PER_BATCH = 200
TOO_DEEP = "the row is nested too deeply to store (Python's JSON encoder gave up); nothing was imported"
ITEMS_PER_BATCH = 5000
# Task rows kept in memory as text for the next rollouts of their tasks (``_Importer._task_row``);
# a file in finishing order has a task's rollouts near each other, so few are read back.
TASK_ROWS_KEPT = 4096

Lines = Union[BinaryIO, TextIO, Iterable[str | bytes]]


class WrongFileError(DatasetError):
    """A file holds rows of the other slot's kind: failure rows (``_ng_failure_class``) in the
    rollouts file, or rows without ``_ng_failure_class`` in the failures file. ``swapped`` is True
    when the other file holds this slot's kind, i.e. the two files were given the wrong way round."""

    def __init__(self, message: str, line: int | None, source: str, swapped: bool = False):
        super().__init__(message, line, source)
        self.swapped = swapped


class LooksLikeDatasetError(DatasetError):
    """The rollouts file is a dataset (task rows with ``responses_create_params`` and no result in
    any row): nothing is imported; a run can be started from it instead. ``rows`` is its row count."""

    def __init__(self, source: str, rows: int, materialized: bool = False):
        rows_text = (
            f"its {rows:,} row{'' if rows == 1 else 's'} {'have' if rows != 1 else 'has'} "
            "'responses_create_params' but no 'response' or 'reward'"
        )
        if materialized:
            message = (
                f"this is NeMo Gym's rollouts_materialized_inputs.jsonl, not rollouts: {rows_text}, and each has "
                "'_ng_task_index' and '_ng_rollout_index'. Nothing was imported: give it in "
                f"{file_shapes.SLOT_PLACES[file_shapes.MATERIALIZED]} beside its rollouts.jsonl "
                "(or its failures sidecar), or start a new run from it as a dataset"
            )
        else:
            message = (
                f"this is a dataset, not rollouts: {rows_text} (a task file). Nothing was imported; "
                "start a new run from it instead"
            )
        super().__init__(message, None, source)
        self.rows = rows
        self.materialized = materialized


@dataclass
class ImportSummary:
    """What an import stored: rows read per file and rollouts by outcome."""

    run: Run
    rows: int = 0
    succeeded: int = 0
    failed: int = 0
    not_run: int = 0
    items: int = 0
    tasks: int = 0
    warnings: list[str] = field(default_factory=list)


def _dumps(obj: Any) -> str:
    return dumps(obj)  # rollouts.lossless: the one JSON text writer for storage and files


def _iter_rows(stream: Lines, source: str, slot: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """``(line number, line text, row)`` for every non-blank line (at most ``GYMWEB_MAX_LINE_BYTES``
    each) of the file in ``slot`` (``file_shapes.ROLLOUTS``...); raises ``DatasetError`` on a bad or
    too long line, ``WrongFileError`` on a row of a file that is no import file (a health check's
    verdicts, a profile), saying so rather than that it lacks a task's fields."""

    def validate(row: Any, line: int, where: str) -> dict[str, Any]:
        shape = file_shapes.shape_of_row(row) if isinstance(row, dict) else None
        if shape is not None and shape.slot is None and shape is not file_shapes.TASK_ROWS:
            found, advice = file_shapes.wrong_slot_message(row, slot) or ("", "")
            raise WrongFileError(f"{found} ({_what(row)}). Nothing was imported: {advice}", line, where)
        return validate_row(row, line, where)

    yield from iter_rows(stream, source, max_line_bytes=int(settings.GYMWEB_MAX_LINE_BYTES), validate=validate)


def infer_steps(output: list[dict[str, Any]]) -> list[int]:
    """The inferred agent-call index of each item of a merged ``output``.

    A new call starts when an item other than a ``function_call_output`` follows a
    ``function_call_output`` (the outputs answer the call before them).
    """
    steps = []
    step = 0
    previous_was_output = False
    for item in output:
        is_output = item.get("type") == "function_call_output"
        if previous_was_output and not is_output:
            step += 1
        steps.append(step)
        previous_was_output = is_output
    return steps


def _usage_fields(usage: Any) -> tuple[dict[str, Any], str | None]:
    """Rollout usage fields from a row's ``response.usage``; a warning when it is partial."""
    if usage is None:
        return {"usage_reported": False}, None
    try:
        u = Usage.model_validate(usage)
    except ValidationError:
        return {"usage_reported": False}, "the row's usage is partial; token metrics are empty"
    counts = (
        u.input_tokens,
        u.output_tokens,
        u.total_tokens,
        u.input_tokens_details.cached_tokens,
        u.output_tokens_details.reasoning_tokens,
    )
    if any(not 0 <= c <= TOKENS_MAX for c in counts):
        return {"usage_reported": False}, "the row's usage has out-of-range token counts; token metrics are empty"
    return {
        "usage_reported": True,
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "cached_tokens": u.input_tokens_details.cached_tokens,
        "reasoning_tokens": u.output_tokens_details.reasoning_tokens,
    }, None


def _created_at(response: dict[str, Any]) -> datetime | None:
    """When the row's last agent reply was created (``response.created_at``, Unix seconds), the one
    call time a NeMo Gym row records; None when it is missing or not a real time (a failure row's
    placeholder says 0)."""
    value = response.get("created_at")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 253402300800:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def _str_field(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _what(row: dict[str, Any]) -> str:
    """What a row holds, for messages: ``"'reward' 1.0 and a 'response'"``."""
    parts = []
    if "reward" in row:
        parts.append(f"'reward' {json.dumps(row['reward'])[:40]}")
    if "response" in row:
        parts.append("a 'response'")
    if "_ng_failure_class" in row:
        parts.append(f"'_ng_failure_class' {json.dumps(row['_ng_failure_class'])[:60]}")
    return " and ".join(parts) or "no result fields"


def _first_row(stream: Any) -> dict[str, Any] | None:
    """The first row of a seekable file (its position restored), None when it cannot be read."""
    if not (hasattr(stream, "seek") and hasattr(stream, "tell")):
        return None
    try:
        position = stream.tell()
        try:
            for _number, _text, row in iter_rows(stream, max_line_bytes=int(settings.GYMWEB_MAX_LINE_BYTES)):
                return row
        except DatasetError:
            return None
        finally:
            stream.seek(position)
    except (OSError, ValueError):
        return None
    return None


RESULT_KEYS = ("reward", "response", "_ng_failure_class")  # a row with none of them is a task row


def _refuse_a_dataset(shards: Sequence[tuple[Lines, str]]) -> None:
    """Raise ``LooksLikeDatasetError`` when the rollouts files are a dataset (``_dataset_rows``)."""
    dataset = _dataset_rows(shards)
    if dataset is not None:
        names = shards[0][1] if len(shards) == 1 else ", ".join(src for _, src in shards)
        raise LooksLikeDatasetError(names, dataset[0], materialized=dataset[1])


def _dataset_rows(shards: Sequence[tuple[Lines, str]]) -> tuple[int, bool] | None:
    """Read before anything is stored: ``(rows, the first is a materialized-inputs row)`` when the
    rollouts files hold rows and none has a result (``RESULT_KEYS``): they are a dataset. None when a
    row has a result (the first row, for a real rollouts file), a file cannot be rewound, or a line
    is bad (the import then reports it). Each file's position is restored."""
    rows, first = 0, None
    for stream, src in shards:
        if not (hasattr(stream, "seek") and hasattr(stream, "tell")):
            return None
        try:
            position = stream.tell()
        except (OSError, ValueError):
            return None
        try:
            for _line, _text, row in _iter_rows(stream, src, file_shapes.ROLLOUTS):
                if first is None:
                    first = file_shapes.shape_of_row(row)
                if any(k in row for k in RESULT_KEYS):
                    return None
                rows += 1
        except DatasetError:
            return None
        finally:
            stream.seek(position)
    return (rows, first is file_shapes.MATERIALIZED_ROWS) if rows else None


def _result_fields(
    row: dict[str, Any], line: int, source: str, failed: bool
) -> tuple[bool, Any, dict[str, Any] | None, list[Any]]:
    """``(has_reward, reward, response, output items)`` of a row, checked: a numeric reward, a
    response object with a list of item objects, no response without a reward on a result row.
    Raises ``DatasetError``."""
    has_reward = "reward" in row
    reward = row.get("reward")
    if has_reward and (isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward):
        raise DatasetError(f"'reward' must be a number (got {json.dumps(reward)[:60]})", line, source)
    response = row.get("response")
    if response is not None and not isinstance(response, dict):
        raise DatasetError("'response' must be a JSON object (a Responses API object)", line, source)
    output = (response or {}).get("output")
    if output is None:
        output = []
    if not isinstance(output, list):
        raise DatasetError("'response.output' must be a list of items", line, source)
    for position, item in enumerate(output):
        if not isinstance(item, dict):
            raise DatasetError(f"'response.output[{position}]' must be a JSON object", line, source)
    if not failed and not has_reward and response is not None:
        raise DatasetError("the row has a 'response' but no 'reward': a rollouts.jsonl row needs both", line, source)
    return has_reward, reward, response, output


def _fill_failed(
    rollout: Rollout, row: dict[str, Any], response: dict[str, Any] | None, output: list[Any]
) -> list[Any]:
    """A failures-sidecar row as a failed attempt; returns the output items to store (none for
    NeMo Gym's placeholder response)."""
    error = row.get("error")
    rollout.status = Rollout.Status.FAILED
    rollout.reward = 0.0
    rollout.error = error if isinstance(error, str) else ("" if error is None else _dumps(error))
    rollout.terminal = bool(row.get("_ng_failure_terminal"))
    kind = row.get("_gymweb_failure_kind")
    rollout.failure_kind = kind[:40] if isinstance(kind, str) and kind else IMPORTED_FAILURE_KIND
    if response is not None and response.get("id") == PLACEHOLDER_RESPONSE_ID:
        return []  # NeMo Gym's placeholder (one empty message) is not a trajectory
    if response is not None and output:
        rollout.partial_response_json = _dumps(response)
    return output


class _Importer:
    on_flush: Callable[[], None] | None = None  # called after each batch is written

    def __init__(self, run: Run):
        self.run = run
        self.now = timezone.now()
        self.task_ids: dict[int, int | None] = {}  # task index -> Task pk (None until flushed)
        self.attempts: dict[tuple[int, int], int] = {}
        self.success_lines: dict[tuple[int, int], str] = {}
        self.new_tasks: list[tuple[Task, int, str]] = []  # (task, line, source)
        # (Rollout, [AgentCall], [TrajectoryItem], line, source) waiting for the next flush
        self.pending: list[tuple[Rollout, list[AgentCall], list[TrajectoryItem], int, str]] = []
        self.rollouts_per_task: dict[int, set[int]] = {}
        self.other_slot_kind: dict[bool, bool | None] = {}  # sidecar? -> does its first row have a class
        self.first_main_shape: file_shapes.FileShape | None = None  # of the rollouts slot's first row
        self.pending_items = 0
        self.summary = ImportSummary(run=run)
        # task index -> its row as the stored JSON text, to tell canonical lines; parsed when used
        # (``_task_row``). Only the ``TASK_ROWS_KEPT`` used last are kept, and the batch's tasks not
        # written yet: a row per task held the whole file's task rows in memory (a real task row
        # can be kilobytes of prompt); an older one is read back from its stored ``Task``.
        self.task_rows: OrderedDict[int, str] = OrderedDict()
        self.unwritten_rows: dict[int, str] = {}
        self._parsed: tuple[int, dict[str, Any]] | None = None  # the last task row parsed
        # (task, rollout) -> (ordinal, text or "") of its materialised input line, until a rollout takes it
        self.inputs: dict[tuple[int, int], tuple[int, str]] = {}

    def _add_task(self, task_index: int, task_row: dict[str, Any], line: int, source: str) -> None:
        self.task_ids[task_index] = None
        text = _dumps(task_row)
        self.unwritten_rows[task_index] = text
        self._keep_row(task_index, text)
        self._parsed = (task_index, task_row)
        self.new_tasks.append((Task(run=self.run, task_index=task_index, row_json=text), line, source))

    def _keep_row(self, task_index: int, text: str) -> None:
        self.task_rows[task_index] = text
        self.task_rows.move_to_end(task_index)
        if len(self.task_rows) > TASK_ROWS_KEPT:
            self.task_rows.popitem(last=False)

    def _task_row(self, task_index: int) -> dict[str, Any]:
        """Task ``task_index``'s row (read only: the same dict serves the task's next rollouts, which
        usually follow it in the file): kept, not written yet, or read back from the database."""
        if self._parsed is not None and self._parsed[0] == task_index:
            return self._parsed[1]
        text = self.task_rows.get(task_index) or self.unwritten_rows.get(task_index)
        if text is None:
            text = Task.objects.filter(run=self.run, task_index=task_index).values_list("row_json", flat=True).get()
        self._keep_row(task_index, text)
        self._parsed = (task_index, json.loads(text))
        return self._parsed[1]

    # -- the materialised inputs ---------------------------------------------------------------
    def add_input(self, row: dict[str, Any], text: str, ordinal: int, line: int, source: str) -> None:
        """One row of ``<stem>_materialized_inputs.jsonl``: it decides its task's row (the first row
        seen of a task) and is kept for its key's download."""
        wrong = file_shapes.wrong_slot_message(row, file_shapes.MATERIALIZED)
        if wrong is not None and file_shapes.shape_of_row(row) is not file_shapes.TASK_ROWS:
            found, advice = wrong
            raise WrongFileError(
                f"{found} ({_what(row)}); the materialised inputs file holds task rows only "
                f"(rollouts_materialized_inputs.jsonl). Nothing was imported: {advice}",
                line,
                source,
            )
        task_index = row.get(TASK_INDEX_KEY_NAME, ordinal)
        rollout_index = row.get(ROLLOUT_INDEX_KEY_NAME, 0)
        key = (task_index, rollout_index)
        if key in self.inputs or key in self.attempts:
            raise DatasetError(
                f"a second materialised row for task {task_index}, rollout {rollout_index}", line, source
            )
        if task_index not in self.task_ids:
            task_row = dict(row)
            task_row.pop(ROLLOUT_INDEX_KEY_NAME, None)
            task_row[TASK_INDEX_KEY_NAME] = task_index
            self._add_task(task_index, task_row, line, source)
        self.rollouts_per_task.setdefault(task_index, set()).add(rollout_index)
        same = row_line(materialized_row(self._task_row(task_index), rollout_index)) == text
        self.inputs[key] = (ordinal, "" if same else text)

    def add_not_run_inputs(self) -> None:
        """A ``cancelled`` attempt (kill-shaped: shown, written to no result file) for every key of
        the materialised inputs that no result row named: it was never run (or never finished)."""
        for (task_index, rollout_index), (ordinal, text) in sorted(self.inputs.items(), key=lambda kv: kv[1][0]):
            self.attempts[(task_index, rollout_index)] = 1
            rollout = Rollout(
                run=self.run,
                task_index=task_index,
                rollout_index=rollout_index,
                attempt=1,
                finished=self.now,
                status=Rollout.Status.CANCELLED,
                error=NOT_RUN_ERROR,
                input_ordinal=ordinal,
                input_text=text,
            )
            self.pending.append((rollout, [], [], 0, "the materialised inputs"))
            self.summary.not_run += 1
            self.summary.rows += 1
            if len(self.pending) >= ROWS_PER_BATCH:
                self.flush()
        self.inputs = {}

    # -- one row ---------------------------------------------------------------------------------
    def add(self, row: dict[str, Any], text: str, ordinal: int, line: int, source: str, sidecar: bool) -> None:
        where = f"{source}, line {line}"
        task_index = row.get(TASK_INDEX_KEY_NAME, ordinal)
        rollout_index = row.get(ROLLOUT_INDEX_KEY_NAME, 0)
        key = (task_index, rollout_index)

        if not sidecar and self.first_main_shape is None:
            self.first_main_shape = file_shapes.shape_of_row(row)
        self._check_slot(row, line, source, sidecar)
        failed = sidecar
        has_reward, reward, response, output = _result_fields(row, line, source, failed)

        if task_index not in self.task_ids:
            task_row = dict(row)
            strip_result_fields(task_row)
            task_row.pop(ROLLOUT_INDEX_KEY_NAME, None)
            task_row[TASK_INDEX_KEY_NAME] = task_index
            self._add_task(task_index, task_row, line, source)
        self.rollouts_per_task.setdefault(task_index, set()).add(rollout_index)

        attempt = self.attempts.get(key, 0) + 1
        self.attempts[key] = attempt
        rollout = Rollout(
            run=self.run,
            task_index=task_index,
            rollout_index=rollout_index,
            attempt=attempt,
            finished=self.now,
            source_ordinal=ordinal,
        )
        if key in self.inputs:  # the key's first attempt carries its materialised input line
            rollout.input_ordinal, rollout.input_text = self.inputs.pop(key)
        if failed:
            output = _fill_failed(rollout, row, response, output)
            self.summary.failed += 1
        elif has_reward:
            if key in self.success_lines:
                raise DatasetError(
                    f"a second result for task {task_index}, rollout {rollout_index} "
                    f"(the first is at {self.success_lines[key]})",
                    line,
                    source,
                )
            self.success_lines[key] = where
            # The row whole: the export sets the indices and agent_ref in place, so a row that has
            # them comes back byte for byte, and one without gets them at the end.
            verify = row
            rollout.status = Rollout.Status.SUCCEEDED
            rollout.reward = float(reward)
            rollout.verify_json = _dumps(verify)
            # the exported row's agent_ref is an object (iter_rows checks every row's)
            rollout.profile_json = profile_json_for_verify(verify)
            self.summary.succeeded += 1
        else:
            rollout.status = Rollout.Status.CANCELLED
            rollout.error = NOT_RUN_ERROR
            self.summary.not_run += 1

        usage, warning = _usage_fields((response or {}).get("usage"))
        for name, value in usage.items():
            setattr(rollout, name, value)
        if warning and not failed:
            rollout.warnings = [warning]

        if rollout.status != Rollout.Status.CANCELLED and self._exported_line(rollout, row) != text:
            rollout.source_text = text  # the export would not give this line back: keep it as it came

        calls, items = self._trajectory(rollout, response or {}, output)
        rollout.num_items = len(items)
        rollout.num_agent_calls = len(calls)
        rollout.num_tool_calls = sum(1 for i in items if i.kind == "function_call_output")
        self.pending.append((rollout, calls, items, line, source))
        self.pending_items += len(items)
        self.summary.rows += 1
        self.summary.items += len(items)
        if len(self.pending) >= ROWS_PER_BATCH or self.pending_items >= ITEMS_PER_BATCH:
            self.flush()

    def _exported_line(self, rollout: Rollout, row: dict[str, Any]) -> str | None:
        """The line the export writes for ``rollout`` (``export.success_row``/``failure_row`` over
        the stored values); None when it depends on the run's agent name, known only at the end."""
        task_row = self._task_row(rollout.task_index)
        if rollout.status == Rollout.Status.FAILED:
            return row_line(failure_row(task_row, rollout.rollout_index, rollout.error, rollout.terminal, stamp=False))
        ref = task_row.get("agent_ref")
        if not ref:
            return None
        return row_line(success_row(rollout.verify_json, rollout.task_index, rollout.rollout_index, ref, stamp=False))

    def _check_slot(self, row: dict[str, Any], line: int, source: str, sidecar: bool) -> None:
        """Refuse a row of the other slot's kind (``WrongFileError``), saying what was found."""
        has_class = "_ng_failure_class" in row
        if has_class == sidecar:
            return
        shape = file_shapes.shape_of_row(row)
        if shape not in (None, file_shapes.SUCCESS_ROWS, file_shapes.FAILURE_ROWS):
            # Neither slot's kind (materialised inputs, a task file, verdicts, a profile): say what it is
            # and where it goes, rather than "swap them" or "give it as the rollouts file".
            found, advice = file_shapes.wrong_slot_message(
                row, file_shapes.FAILURES if sidecar else file_shapes.ROLLOUTS
            )
            raise WrongFileError(f"{found} ({_what(row)}). Nothing was imported: {advice}", line, source)
        other = self.other_slot_kind.get(not sidecar)
        swapped = other is not None and other == sidecar  # the other file holds this slot's rows
        if not sidecar:
            message = (
                f"this row is a failure row ({_what(row)}): the rollouts file looks like a failures sidecar "
                "(rollouts_failures.jsonl); NeMo Gym's rollouts.jsonl holds successes only"
            )
            fix = "import it as the failures file instead (--failures, or the failures sidecar field)"
        else:
            message = (
                f"this row has no '_ng_failure_class' ({_what(row)}), so it is not a failure row: "
                "the failures file looks like a rollouts.jsonl"
            )
            fix = "give it as the rollouts file instead"
        if swapped:
            message += (
                "; the other file holds "
                + ("failure rows" if sidecar else "success rows")
                + ": the two files are swapped"
            )
            fix = "swap them"
        raise WrongFileError(f"{message}. Nothing was imported: {fix}", line, source, swapped=swapped)

    def _trajectory(self, rollout: Rollout, response: dict[str, Any], output: list[dict[str, Any]]):
        if not output:
            return [], []
        steps = infer_steps(output)
        output_positions: dict[str, list[int]] = {}
        call_positions: dict[str, list[int]] = {}
        for pos, item in enumerate(output):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                continue
            if item.get("type") == "function_call_output":
                output_positions.setdefault(call_id, []).append(pos)
            elif item.get("type") == "function_call":
                call_positions.setdefault(call_id, []).append(pos)
        items = []
        for pos, (item, step) in enumerate(zip(output, steps)):
            kind = item.get("type")
            call_id = item.get("call_id") if isinstance(item.get("call_id"), str) else ""
            paired = False
            if kind == "function_call":
                paired = any(p > pos for p in output_positions.get(call_id, ()))
            elif kind == "function_call_output":
                paired = any(p < pos for p in call_positions.get(call_id, ()))
            items.append(
                TrajectoryItem(
                    seq=pos,
                    step=step,
                    kind=_str_field(kind, 40),
                    role=_str_field(item.get("role"), 20),
                    call_id=call_id[:300],
                    name=_str_field(item.get("name"), 300),
                    origin=TrajectoryItem.Origin.IMPORTED,
                    asked=False,
                    paired=paired,
                    payload=item,
                )
            )
        last = steps[-1]
        calls = []
        for index in range(last + 1):
            is_last = index == last
            calls.append(
                AgentCall(
                    index=index,
                    started=_created_at(response) if is_last else None,  # a file records no other call times
                    latency_ms=0.0,  # unknown: an imported file has no timings
                    http_status=None,
                    response_id=_str_field(response.get("id"), 300) if is_last else "",
                    model=_str_field(response.get("model"), 300) if is_last else "",
                    incomplete_details=response.get("incomplete_details") if is_last else None,
                    num_asks=sum(1 for i, s in zip(output, steps) if s == index and i.get("type") == "function_call"),
                )
            )
        return calls, items

    # -- writing -------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write what is pending in one transaction (a savepoint inside a caller's). A row the
        database refuses (which the checks above should make impossible) is found row by row and
        reported as ``DatasetError`` with its line, so an import never ends in a crash;
        ``import_shards`` then deletes what the earlier batches stored."""
        tasks, pending = self.new_tasks, self.pending
        try:
            with transaction.atomic():
                self._write(tasks, pending)
                writing.renew(self.run)
        except (DatabaseError, RecursionError) as exc:
            self._find_refused(tasks, pending)
            raise DatasetError(
                f"the database refused a batch of rows ({exc.__class__.__name__}: {exc})", None, "the import"
            ) from None
        self.new_tasks = []
        self.unwritten_rows = {}
        self.pending = []
        self.pending_items = 0
        if self.on_flush is not None:
            self.on_flush()

    def _find_refused(self, tasks, pending) -> None:
        for one in tasks:
            self._try_alone([one], [], one[1], one[2])
        for one in pending:
            self._try_alone([], [one], one[3], one[4])

    def _try_alone(self, tasks, pending, line: int, source: str) -> None:
        try:
            with transaction.atomic():
                self._write(tasks, pending, probe=True)
        except RecursionError:
            raise DatasetError(TOO_DEEP, line, source) from None
        except DatabaseError as exc:
            raise DatasetError(
                f"the row cannot be stored ({exc.__class__.__name__}: {exc}); nothing was imported", line, source
            ) from None

    def _write(self, tasks, pending, probe: bool = False) -> None:
        if probe:  # a failed batch may have left ids on objects whose rows were rolled back
            for obj in [t for t, _, _ in tasks] + [o for p in pending for o in (p[0], *p[1], *p[2])]:
                obj.pk = None
        if tasks:
            created = Task.objects.bulk_create([t for t, _, _ in tasks])
            if any(t.pk is None for t in created):
                wanted = [t.task_index for t in created]
                ids = dict(Task.objects.filter(run=self.run, task_index__in=wanted).values_list("task_index", "id"))
            else:
                ids = {t.task_index: t.pk for t in created}
            self.task_ids.update(ids)
            if not probe:
                self.summary.tasks += len(created)
        if not pending:
            return
        rollouts = [p[0] for p in pending]
        for r in rollouts:
            r.task_id = self.task_ids[r.task_index]
        created = Rollout.objects.bulk_create(rollouts)
        if any(r.pk is None for r in created):
            lookup = {
                (t, ro, a): pk
                for pk, t, ro, a in Rollout.objects.filter(run=self.run).values_list(
                    "id", "task_index", "rollout_index", "attempt"
                )
            }
            for r in created:
                r.pk = r.id = lookup[(r.task_index, r.rollout_index, r.attempt)]
        calls, items = [], []
        for rollout, rollout_calls, rollout_items, _line, _source in pending:
            for c in rollout_calls:
                c.rollout_id = rollout.pk
            for i in rollout_items:
                i.rollout_id = rollout.pk
            calls.extend(rollout_calls)
            items.extend(rollout_items)
        AgentCall.objects.bulk_create(calls, batch_size=2000)
        TrajectoryItem.objects.bulk_create(items, batch_size=1000)


def import_rollouts(
    stream: Lines | None,
    *,
    name: str = "",
    source: str = "rollouts.jsonl",
    failures: Lines | None = None,
    failures_source: str = "rollouts_failures.jsonl",
    materialized: Lines | None = None,
    materialized_source: str = "rollouts_materialized_inputs.jsonl",
    user=None,
    team=None,
) -> ImportSummary:
    """Import a ``rollouts.jsonl`` (``stream``: lines, bytes or text; None for none) and optionally
    its failures sidecar (``failures``) and materialised inputs (``materialized``) into a new run
    with status ``imported``.

    ``source``/``failures_source`` name the files in error messages (the run is named after their
    file names). Returns an ``ImportSummary`` (its ``run`` is the new run). Raises ``DatasetError``
    (file and line) for a bad row or when the files hold no rows; ``WrongFileError`` for rows of the
    other slot's kind (swapped files); ``LooksLikeDatasetError`` when the rollouts file is a dataset.
    Nothing is stored then.
    """
    shards = [(stream, source)] if stream is not None else []
    sidecars = [(failures, failures_source)] if failures is not None else []
    inputs = [(materialized, materialized_source)] if materialized is not None else []
    return import_shards(shards, sidecars, inputs, name=name, user=user, team=team)


def import_shards(
    shards: Sequence[tuple[Lines, str]],
    failures: Sequence[tuple[Lines, str]] = (),
    materialized: Sequence[tuple[Lines, str]] = (),
    *,
    name: str = "",
    user=None,
    on_batch: Callable[[], None] | None = None,
    team=None,
) -> ImportSummary:
    """Import ``rollouts.jsonl`` shards (``(lines, file name)`` each) and their failures sidecars
    into ONE new run with status ``imported``, as NeMo Gym's ``gym eval aggregate`` treats shards as
    one run (``import_rollouts`` is the case of one file and its sidecar).

    ``materialized`` (``<stem>_materialized_inputs.jsonl`` files) is read before all: its rows are
    the tasks' rows (NeMo Gym's result rows may lack task fields their env dropped, such as the
    counter's ``expected_count``), its lines download again as they came, and a key it lists
    without any result row becomes a ``cancelled`` attempt explained as never run. Every sidecar is
    read next (in the order given), then every shard, so a key's failed attempts come before its
    success (resume order). Rows keep their ``_ng_task_index``/``_ng_rollout_index``;
    rows without them are numbered by their row number, counted on across the files of one kind
    (sidecars apart from shards). Shards must not overlap: a second success row for a (task,
    rollout) key is a ``DatasetError`` naming both places (shards of runs that reuse task indices,
    such as two environment servers, cannot share one run). Raises ``DatasetError`` (file and line)
    for a bad row or when the files hold no rows, ``WrongFileError``/``LooksLikeDatasetError`` as
    ``import_rollouts`` does; nothing is stored then: each batch is its own short transaction, and
    a refused or failed import deletes the run with what its batches stored before raising.
    ``on_batch()`` is called after each batch is written (progress).
    """
    started: list[Run] = []
    try:
        return _import_shards(shards, failures, materialized, name, user, team, on_batch, started)
    except BaseException:
        if started:  # what the committed batches stored goes with the run (cascade)
            Run.objects.filter(pk=started[0].pk).delete()
        raise


def _import_shards(
    shards: Sequence[tuple[Lines, str]],
    failures: Sequence[tuple[Lines, str]],
    materialized: Sequence[tuple[Lines, str]],
    name: str,
    user,
    team,
    on_batch: Callable[[], None] | None,
    started: list[Run],
) -> ImportSummary:
    if not shards and not failures:
        raise ValueError("import_shards needs at least one file")
    names = [src for _, src in shards] + [src for _, src in failures]
    shown = [PurePath(n).name for n in names]
    names += [src for _, src in materialized]
    _refuse_a_dataset(shards)  # told apart before anything is written
    run = Run(
        name=(
            name.strip()
            or (" + ".join(shown) if len(shown) <= 2 else f"{shown[0]} + {len(shown) - 1} more file(s)")
            or "imported rollouts"
        )[:200],
        status=Run.Status.IMPORTED,
        writing_until=writing.lease(),  # not ready until the last batch is in
        created_by=user,
        team_id=team_for_new(user, team),  # ``team``, else the user's first team
        source_file=" + ".join(names)[:500],
    )
    run.save()
    started.append(run)
    importer = _Importer(run)
    importer.on_flush = on_batch
    agent_name = None
    inputs = [(lines, src, True) for lines, src in failures] + [(lines, src, False) for lines, src in shards]
    if len(shards) == 1 and len(failures) == 1:  # what each file starts with, to tell swapped files from one wrong file
        for lines, _src, sidecar in inputs:
            first = _first_row(lines)
            importer.other_slot_kind[sidecar] = None if first is None else "_ng_failure_class" in first
    main_rows = main_results = 0
    ordinal = 0
    for lines, src in materialized:
        for line, text, row in _iter_rows(lines, src, file_shapes.MATERIALIZED):
            try:
                importer.add_input(row, text, ordinal, line, src)
            except RecursionError:
                raise DatasetError(TOO_DEEP, line, src) from None
            ordinal += 1
    ordinals = {True: 0, False: 0}  # rows without indices: numbered on across files of one kind
    for lines, src, sidecar in inputs:
        for line, text, row in _iter_rows(lines, src, file_shapes.FAILURES if sidecar else file_shapes.ROLLOUTS):
            if (
                agent_name is None
                and isinstance(row.get("agent_ref"), dict)
                and isinstance(row["agent_ref"].get("name"), str)
            ):
                agent_name = row["agent_ref"]["name"]
            if not sidecar:
                main_rows += 1
                main_results += any(k in row for k in RESULT_KEYS)
            try:
                importer.add(row, text, ordinals[sidecar], line, src, sidecar)
            except RecursionError:
                raise DatasetError(TOO_DEEP, line, src) from None
            ordinals[sidecar] += 1
    if main_rows and not main_results:
        raise LooksLikeDatasetError(
            shards[0][1] if len(shards) == 1 else ", ".join(src for _, src in shards),
            main_rows,
            materialized=importer.first_main_shape is file_shapes.MATERIALIZED_ROWS,
        )
    importer.add_not_run_inputs()
    importer.flush()
    summary = importer.summary
    if summary.rows == 0:
        raise DatasetError(
            "the file has no rows (it is empty or only blank lines)" if len(names) == 1 else "the files have no rows",
            None,
            names[0],
        )
    run.num_tasks = len(importer.task_ids)
    run.num_keys = len(importer.attempts)
    # Repeats as NeMo Gym counts them: rollouts per task (the most any task has).
    run.num_repeats = max((len(r) for r in importer.rollouts_per_task.values()), default=1)
    run.finished = importer.now
    if agent_name:
        run.agent_name = agent_name[:200]
    with transaction.atomic():
        run.save(update_fields=["num_tasks", "num_keys", "num_repeats", "finished", "agent_name"])
        writing.done(run)
    return summary
