"""NeMo Gym's output files, streamed from the database with constant memory (DESIGN.md, "Output").

- ``rollouts.jsonl``: successes only; each row is the env's ``/verify`` reply as it came plus
  ``_ng_task_index``, ``_ng_rollout_index``, ``agent_ref`` and NeMo Gym's two routing stamps.
- ``<stem>_failures.jsonl`` (the failures sidecar): one row per failed attempt: the materialised
  row, ``reward: 0.0``, a placeholder ``response``, ``error``, ``_ng_failure_class``,
  ``_ng_failure_terminal`` where terminal, the indices, ``agent_ref``, gymweb's finer
  ``_gymweb_failure_kind`` and the two stamps.
- ``<stem>_materialized_inputs.jsonl``: every (task, rollout) key's materialised row (unstamped, as
  NeMo Gym writes it for rows routed by their agent).

The stamps are what NeMo Gym 0.7.0's collector adds to every result of a remote_agent run
(``rollout_collection.py``; see ``eval_0.7.0/runA/rollouts.jsonl``), last, after ``agent_ref``:
``_ng_environment_server`` (the ``legacy_agent`` environment server NeMo Gym generates in front of the
agent: ``stamps.environment_server_name``) and ``_ng_result_type: "legacy_agent"``. NeMo Gym's aggregation,
resume and health check group rows by them. An imported run's rows keep the stamps they came with
and get none they did not have, so exporting an imported file gives it back.

Kill-shaped attempts (cancelled, interrupted) go in no file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from django.db.models import QuerySet

from rollouts.lossless import dumps
from rollouts.collection.stamps import stamp as _stamp
from rollouts.models import Rollout, Run

CHUNK = 500
FAILURE_CLASS = "remote_agent_error"


def _dumps(obj: Any) -> str:
    return dumps(obj)  # rollouts.lossless: the one JSON text writer for storage and files


def placeholder_response() -> dict[str, Any]:
    """The ``response`` of a failure row, shaped like NeMo Gym's (an empty assistant message)."""
    return {
        "id": "remote_agent_failure",
        "created_at": 0.0,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": None,
        "model": "remote_agent",
        "object": "response",
        "output": [
            {
                "id": "msg_0",
                "content": [{"annotations": [], "text": "", "type": "output_text", "logprobs": None}],
                "role": "assistant",
                "status": "completed",
                "type": "message",
            }
        ],
        "parallel_tool_calls": False,
        "temperature": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": None,
    }


def output_stems(output: Path) -> dict[str, Path]:
    """The three file names NeMo Gym derives from ``OUT.jsonl``: successes, failures sidecar,
    materialised inputs."""
    output = Path(output)
    stem = output.with_suffix("") if output.suffix == ".jsonl" else output
    return {
        "rollouts": output,
        "failures": stem.parent / f"{stem.name}_failures.jsonl",
        "materialized": stem.parent / f"{stem.name}_materialized_inputs.jsonl",
    }


def agent_ref_of(task_row: dict[str, Any], run: Run) -> dict[str, Any]:
    """A task's exported ``agent_ref``: the materialised row's, else ``{"name": run.agent_name}``."""
    return task_row.get("agent_ref") or {"name": run.agent_name}


def success_row(
    verify_json: str, task_index: int, rollout_index: int, agent_ref: dict[str, Any], stamp: bool = True
) -> dict[str, Any]:
    """One ``rollouts.jsonl`` row from a stored ``/verify`` reply: the reply, the indices, ``agent_ref``
    and (``stamp``: a collected run) the stamps (``stamps.stamp``), in NeMo Gym's order."""
    row = json.loads(verify_json)
    row["_ng_task_index"] = task_index
    row["_ng_rollout_index"] = rollout_index
    row["agent_ref"] = agent_ref
    return _stamp(row, agent_ref, stamp)


def failure_row(
    task_row: dict[str, Any], rollout_index: int, error: str, terminal: bool, failure_kind: str, stamp: bool = True
) -> dict[str, Any]:
    """One failures-sidecar row: the materialised row plus the failure fields and (``stamp``: a
    collected run) the stamps."""
    row = dict(task_row)
    row["_ng_rollout_index"] = rollout_index
    row["response"] = placeholder_response()
    row["reward"] = 0.0
    row["_ng_failure_class"] = FAILURE_CLASS
    row["error"] = error
    if terminal:
        row["_ng_failure_terminal"] = True
    row["_gymweb_failure_kind"] = failure_kind
    return _stamp(row, row.get("agent_ref"), stamp, move=True)


def stamps_rows(run: Run) -> bool:
    """Whether the run's exported rows get NeMo Gym's stamps added: yes for runs gymweb collected,
    no for imported ones (they keep exactly the stamps they came with)."""
    return run.status != Run.Status.IMPORTED


def iter_successes(run: Run, rollouts: Optional[QuerySet] = None) -> Iterator[str]:
    """Lines (without newline) of ``rollouts.jsonl`` for the run's succeeded attempts, optionally
    restricted to a filtered queryset of its rollouts. An archived run's whole file is read from its
    archive (the same lines); a selection of it raises ``archive.RunArchived``."""
    if run.is_archived:
        from rollouts.collection import archive  # archive builds on this module

        if rollouts is not None:
            raise archive.RunArchived(run, "a selection of its rollouts.jsonl")
        yield from archive.archived_lines(run, "rollouts")
        return
    qs = (rollouts if rollouts is not None else Rollout.objects.filter(run=run)).filter(status=Rollout.Status.SUCCEEDED)
    # Rows come ordered by task, so remembering the last task's agent_ref keeps memory constant.
    last_task, ref = None, None
    stamp = stamps_rows(run)
    fetch = qs.order_by("task_index", "rollout_index", "id").values_list("task_index", "rollout_index", "verify_json", "task__row_json")
    for task_index, rollout_index, verify_json, task_json in fetch.iterator(chunk_size=CHUNK):
        if task_index != last_task:
            last_task, ref = task_index, agent_ref_of(json.loads(task_json), run)
        yield _dumps(success_row(verify_json, task_index, rollout_index, ref, stamp))


def iter_failures(run: Run, rollouts: Optional[QuerySet] = None) -> Iterator[str]:
    """Lines of the failures sidecar: one per failed attempt (kill-shaped attempts excluded)."""
    qs = (rollouts if rollouts is not None else Rollout.objects.filter(run=run)).filter(status=Rollout.Status.FAILED)
    fetch = qs.order_by("task_index", "rollout_index", "attempt", "id").values_list(
        "task_index", "rollout_index", "error", "terminal", "failure_kind", "task__row_json"
    )
    stamp = stamps_rows(run)
    for task_index, rollout_index, error, terminal, kind, task_json in fetch.iterator(chunk_size=CHUNK):
        yield _dumps(failure_row(json.loads(task_json), rollout_index, error, terminal, kind, stamp))


def iter_materialized(run: Run) -> Iterator[str]:
    """Lines of ``<stem>_materialized_inputs.jsonl``: each key's materialised row, aabbcc order."""
    keys = (
        Rollout.objects.filter(run=run)
        .order_by("task_index", "rollout_index")
        .values_list("task_index", "rollout_index", "task__row_json")
        .distinct()
    )
    for _task_index, rollout_index, task_json in keys.iterator(chunk_size=CHUNK):
        row = json.loads(task_json)
        row["_ng_rollout_index"] = rollout_index
        yield _dumps(row)


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write lines to ``path`` atomically (a temp file renamed into place). Returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line)
            fh.write("\n")
            n += 1
    tmp.replace(path)
    return n


def write_run_files(run: Run, output: Path) -> dict[str, int]:
    """Write the run's three files next to ``output``; returns rows written per file."""
    names = output_stems(output)
    return {
        "rollouts": write_lines(names["rollouts"], iter_successes(run)),
        "failures": write_lines(names["failures"], iter_failures(run)),
        "materialized": write_lines(names["materialized"], iter_materialized(run)),
    }
