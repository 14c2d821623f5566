"""Import a NeMo Gym ``rollouts.jsonl`` (and optionally its failures sidecar) into a new run with
status ``imported``, to inspect it without running anything (DESIGN.md, "Import").

No views here: the import page and ``manage.py import_rollouts`` both call ``import_rollouts``.

Rules:

- Each row becomes one ``Rollout`` (one attempt of its (task, rollout) key). Rows without
  ``_ng_task_index`` are numbered by their row number in the file (0-based, blank lines skipped);
  rows without ``_ng_rollout_index`` get rollout 0.
- A row's ``Task`` is the row minus the result fields (``datasets.strip_result_fields``) and minus
  ``_ng_rollout_index``, with ``_ng_task_index`` set; the first row seen of a task decides it.
- A *result row* (numeric ``reward``, no ``_ng_failure_class``) is a success: ``verify_json`` is
  the row without ``_ng_task_index``/``_ng_rollout_index``/``agent_ref`` (``export.success_row``
  adds them back) and ``profile_json`` the numbers NeMo Gym's profiler reads from that exported row
  (``run_profile.profile_json_for_verify``). Rows of the failures sidecar, and any row with
  ``_ng_failure_class``, are failed attempts: ``error``, ``terminal`` from ``_ng_failure_terminal``,
  ``failure_kind`` from ``_gymweb_failure_kind`` (else ``"imported_failure"``). A row with no
  result at all (an input row, e.g. ``*_materialized_inputs.jsonl``) is kept as a ``cancelled``
  attempt (kill-shaped: shown, written to no file) explained as never run.
- The sidecar is read first, so a key's failed attempts come before its success (resume order).
- Items come from the row's merged ``response.output``, origin ``imported``. Step boundaries are
  inferred: a new agent call starts when an item other than a ``function_call_output`` follows a
  ``function_call_output``; an output belongs to the step whose call it answers. One ``AgentCall``
  per inferred step, latency unknown (stored as 0; pages say "latency unknown" for imported runs).
- Who executed a tool call cannot be known from a file: a ``function_call`` answered by a later
  output is marked ``paired`` (never ``asked``, which would claim gymweb ran it); a call with no
  output anywhere stays unpaired (as in real coding-agent data); outputs are never marked as gym's.
- Usage fields come from ``response.usage`` when it is complete (``contract.Usage``).

Bad input raises ``DatasetError`` naming the file and line; nothing is stored (one transaction).
Rows are streamed and written with ``bulk_create`` in batches: memory is bounded by a batch plus
small per-key maps (task ids, attempt counters).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator, Optional, TextIO, Union

from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from rollouts.engine.contract import Usage
from rollouts.collection.datasets import DatasetError, iter_rows, strip_result_fields
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem
from rollouts.evaluation.run_profile import profile_json_for_verify

__all__ = ["ImportSummary", "import_rollouts", "infer_steps", "IMPORTED_FAILURE_KIND", "NOT_RUN_ERROR"]

IMPORTED_FAILURE_KIND = "imported_failure"
NOT_RUN_ERROR = "imported without a result: the row is an input that was never run"
PLACEHOLDER_RESPONSE_ID = "remote_agent_failure"  # NeMo Gym's (and gymweb's) failure-row response
TOKENS_MAX = 2**63 - 1
ROWS_PER_BATCH = 200
ITEMS_PER_BATCH = 5000

Lines = Union[BinaryIO, TextIO, Iterable[Union[str, bytes]]]


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
    return json.dumps(obj, ensure_ascii=False)


def _iter_rows(stream: Lines, source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for every non-blank line; raises ``DatasetError`` on a bad line."""
    for number, _text, row in iter_rows(stream, source):
        yield number, row


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


def _usage_fields(usage: Any) -> tuple[dict[str, Any], Optional[str]]:
    """Rollout usage fields from a row's ``response.usage``; a warning when it is partial."""
    if usage is None:
        return {"usage_reported": False}, None
    try:
        u = Usage.model_validate(usage)
    except ValidationError:
        return {"usage_reported": False}, "the row's usage is partial; token metrics are empty"
    counts = (u.input_tokens, u.output_tokens, u.total_tokens, u.input_tokens_details.cached_tokens,
              u.output_tokens_details.reasoning_tokens)
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


def _str_field(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


class _Importer:
    def __init__(self, run: Run):
        self.run = run
        self.now = timezone.now()
        self.task_ids: dict[int, Optional[int]] = {}  # task index -> Task pk (None until flushed)
        self.attempts: dict[tuple[int, int], int] = {}
        self.success_lines: dict[tuple[int, int], str] = {}
        self.new_tasks: list[Task] = []
        # (Rollout, [AgentCall], [TrajectoryItem]) waiting for the next flush
        self.pending: list[tuple[Rollout, list[AgentCall], list[TrajectoryItem]]] = []
        self.pending_items = 0
        self.summary = ImportSummary(run=run)

    # -- one row ---------------------------------------------------------------------------------
    def add(self, row: dict[str, Any], ordinal: int, line: int, source: str, sidecar: bool) -> None:
        where = f"{source}, line {line}"
        task_index = row.get("_ng_task_index", ordinal)
        rollout_index = row.get("_ng_rollout_index", 0)
        key = (task_index, rollout_index)

        failed = sidecar or bool(row.get("_ng_failure_class"))
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

        if task_index not in self.task_ids:
            task_row = dict(row)
            strip_result_fields(task_row)
            task_row.pop("_ng_rollout_index", None)
            task_row["_ng_task_index"] = task_index
            self.task_ids[task_index] = None
            self.new_tasks.append(Task(run=self.run, task_index=task_index, row_json=_dumps(task_row)))

        attempt = self.attempts.get(key, 0) + 1
        self.attempts[key] = attempt
        rollout = Rollout(
            run=self.run,
            task_index=task_index,
            rollout_index=rollout_index,
            attempt=attempt,
            finished=self.now,
        )
        if failed:
            error = row.get("error")
            rollout.status = Rollout.Status.FAILED
            rollout.reward = 0.0
            rollout.error = error if isinstance(error, str) else ("" if error is None else _dumps(error))
            rollout.terminal = bool(row.get("_ng_failure_terminal"))
            kind = row.get("_gymweb_failure_kind")
            rollout.failure_kind = kind[:40] if isinstance(kind, str) and kind else IMPORTED_FAILURE_KIND
            if response is not None and response.get("id") == PLACEHOLDER_RESPONSE_ID:
                output = []  # NeMo Gym's placeholder (one empty message) is not a trajectory
            elif response is not None and output:
                rollout.partial_response_json = _dumps(response)
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
            verify = {k: v for k, v in row.items() if k not in ("_ng_task_index", "_ng_rollout_index", "agent_ref")}
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

        calls, items = self._trajectory(rollout, response or {}, output)
        rollout.num_items = len(items)
        rollout.num_agent_calls = len(calls)
        rollout.num_tool_calls = sum(1 for i in items if i.kind == "function_call_output")
        self.pending.append((rollout, calls, items))
        self.pending_items += len(items)
        self.summary.rows += 1
        self.summary.items += len(items)
        if len(self.pending) >= ROWS_PER_BATCH or self.pending_items >= ITEMS_PER_BATCH:
            self.flush()

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
                    started=self.now,
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
        if self.new_tasks:
            created = Task.objects.bulk_create(self.new_tasks)
            if any(t.pk is None for t in created):
                wanted = [t.task_index for t in created]
                ids = dict(Task.objects.filter(run=self.run, task_index__in=wanted).values_list("task_index", "id"))
            else:
                ids = {t.task_index: t.pk for t in created}
            self.task_ids.update(ids)
            self.summary.tasks += len(created)
            self.new_tasks = []
        if not self.pending:
            return
        rollouts = [r for r, _, _ in self.pending]
        for r in rollouts:
            r.task_id = self.task_ids[r.task_index]
        created = Rollout.objects.bulk_create(rollouts)
        if any(r.pk is None for r in created):
            lookup = {
                (t, ro, a): pk
                for pk, t, ro, a in Rollout.objects.filter(run=self.run).values_list("id", "task_index", "rollout_index", "attempt")
            }
            for r in created:
                r.pk = r.id = lookup[(r.task_index, r.rollout_index, r.attempt)]
        calls, items = [], []
        for rollout, rollout_calls, rollout_items in self.pending:
            for c in rollout_calls:
                c.rollout_id = rollout.pk
            for i in rollout_items:
                i.rollout_id = rollout.pk
            calls.extend(rollout_calls)
            items.extend(rollout_items)
        AgentCall.objects.bulk_create(calls, batch_size=2000)
        TrajectoryItem.objects.bulk_create(items, batch_size=1000)
        self.pending = []
        self.pending_items = 0


def import_rollouts(
    stream: Lines,
    *,
    name: str = "",
    source: str = "rollouts.jsonl",
    failures: Optional[Lines] = None,
    failures_source: str = "rollouts_failures.jsonl",
    user=None,
) -> ImportSummary:
    """Import a ``rollouts.jsonl`` (``stream``: lines, bytes or text) and optionally its failures
    sidecar (``failures``) into a new run with status ``imported``.

    ``source``/``failures_source`` name the files in error messages. Returns an ``ImportSummary``
    (its ``run`` is the new run). Raises ``DatasetError`` (file and line) for a bad row, or when the
    files hold no rows; nothing is stored then.
    """
    sources = [s for s in (source, failures_source if failures is not None else "") if s]
    run = Run(
        name=(name.strip() or " + ".join(sources) or "imported rollouts")[:200],
        status=Run.Status.IMPORTED,
        created_by=user,
        source_file=" + ".join(sources)[:500],
    )
    with transaction.atomic():
        run.save()
        importer = _Importer(run)
        agent_name = None
        inputs = []
        if failures is not None:
            inputs.append((failures, failures_source, True))
        inputs.append((stream, source, False))
        for lines, src, sidecar in inputs:
            for ordinal, (line, row) in enumerate(_iter_rows(lines, src)):
                if agent_name is None and isinstance(row.get("agent_ref"), dict) and isinstance(row["agent_ref"].get("name"), str):
                    agent_name = row["agent_ref"]["name"]
                importer.add(row, ordinal, line, src, sidecar)
        importer.flush()
        summary = importer.summary
        if summary.rows == 0:
            raise DatasetError("the file has no rows (it is empty or only blank lines)", None, source)
        run.num_tasks = len(importer.task_ids)
        run.num_keys = len(importer.attempts)
        run.finished = importer.now
        if agent_name:
            run.agent_name = agent_name[:200]
        run.save(update_fields=["num_tasks", "num_keys", "finished", "agent_name"])
    return summary
