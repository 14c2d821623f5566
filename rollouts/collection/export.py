"""NeMo Gym's output files, streamed from the database with constant memory (DESIGN.md, "Output").

- ``rollouts.jsonl``: successes only; each row is the env's ``/verify`` reply as NeMo Gym's agent
  returns it from ``/run`` (``nemo_request.agent_result``: its verify-response model's fields first,
  then the reply's other fields) for a run gymweb collected, as it came for an imported or
  reverified one (NeMo Gym's reverify writes the env's reply as it came), plus ``_ng_task_index``,
  ``_ng_rollout_index``, ``agent_ref`` and NeMo Gym's two routing stamps.
- ``<stem>_failures.jsonl`` (the failures sidecar): one row per failed attempt, exactly as NeMo
  Gym 0.7.0's remote_agent builds it (``failure_row``), its ``error`` NeMo Gym's text for the failure
  (``sidecar_error``). gymweb's finer failure kind and its own message stay in the database, the
  pages and the API; they are not written here.
- ``<stem>_materialized_inputs.jsonl``: every (task, rollout) key's materialised row (unstamped, as
  NeMo Gym writes it for rows routed by their agent).

Every row is written by ``row_line``: orjson, compact, keys in the order the row was built, as NeMo
Gym's collector writes them. An imported run's files come back byte for byte: each line the export
would not write identically was stored as it came (``Rollout.source_text``/``input_text``), and the
lines come in the imported order (``source_ordinal``/``input_ordinal``).

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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from django.db.models import QuerySet

from rollouts.collection import archive_files
from rollouts.collection.stamps import stamp as _stamp
from rollouts.engine.nemo_request import agent_result, run_record
from rollouts.models import Rollout, Run
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

CHUNK = 500
FAILURE_CLASS = "remote_agent_error"
# NeMo Gym's verify-response fields after ``reward``, with their defaults (``BaseVerifyResponse``).
_VERIFY_DEFAULTS = (("mask_sample", False), ("failure_kind", None), ("failure_reason", None))


def row_line(row: Any) -> str:
    """One line of a NeMo Gym file (without newline): orjson, compact, keys in the row's order, as
    NeMo Gym writes its rows. A value orjson cannot write (an integer past 64 bits, a lone
    surrogate) falls back to Python's compact JSON, so a stored row is never unwritable."""
    try:
        return orjson.dumps(row).decode()
    except TypeError:
        text = json.dumps(row, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def placeholder_response() -> dict[str, Any]:
    """The ``response`` of a failure row: NeMo Gym's remote_agent placeholder (an empty assistant
    message), dumped as its ``NeMoGymResponse`` model dumps it (33 keys, in that order)."""
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
                "phase": None,
            }
        ],
        "parallel_tool_calls": False,
        "temperature": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "background": None,
        "completed_at": None,
        "conversation": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "moderation": None,
        "previous_response_id": None,
        "prompt": None,
        "prompt_cache_key": None,
        "prompt_cache_retention": None,
        "reasoning": None,
        "safety_identifier": None,
        "service_tier": None,
        "status": None,
        "text": None,
        "top_logprobs": None,
        "truncation": None,
        "usage": None,
        "user": None,
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
    verify_json: str,
    task_index: int,
    rollout_index: int,
    agent_ref: dict[str, Any],
    stamp: bool = True,
    agent_order: bool | None = None,
) -> dict[str, Any]:
    """One ``rollouts.jsonl`` row from a stored ``/verify`` reply: the reply (``agent_order``, by
    default ``stamp``: as NeMo Gym's agent returns it, ``nemo_request.agent_result``), the indices,
    ``agent_ref`` and (``stamp``: a collected run) the stamps (``stamps.stamp``), in NeMo Gym's order."""
    row = json.loads(verify_json)
    if stamp if agent_order is None else agent_order:
        row = agent_result(row)
    row[TASK_INDEX_KEY_NAME] = task_index
    row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
    row["agent_ref"] = agent_ref
    return _stamp(row, agent_ref, stamp)


def failure_row(
    task_row: dict[str, Any], rollout_index: int, error: str, terminal: bool, stamp: bool = True
) -> dict[str, Any]:
    """One failures-sidecar row, built as NeMo Gym 0.7.0's remote_agent builds it for any failed
    rollout (``_failure_response``: its verify-response model over the row, the reward, the
    placeholder and the routing keys): ``responses_create_params`` materialised by NeMo Gym's request
    model (``nemo_request.run_record``), the placeholder ``response``, ``reward: 0.0``,
    ``mask_sample``/``failure_kind``/``failure_reason`` (the row's, else ``false``/``null``/``null``:
    NeMo Gym's remote_agent never sets them), the row's other fields in order with
    ``_ng_rollout_index``, then ``_ng_failure_class``, ``error``, ``_ng_failure_terminal`` where
    terminal, and (``stamp``: a collected run) the two stamps."""
    record = run_record(task_row)
    row: dict[str, Any] = {}
    if "responses_create_params" in record:
        row["responses_create_params"] = record.pop("responses_create_params")
    row["response"] = placeholder_response()
    row["reward"] = 0.0
    for key, default in _VERIFY_DEFAULTS:
        row[key] = record.pop(key, default)
    row.update(record)
    row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
    row["_ng_failure_class"] = FAILURE_CLASS
    row["error"] = error
    if terminal:
        row["_ng_failure_terminal"] = True
    return _stamp(row, row.get("agent_ref"), stamp, move=True)


def sidecar_error(error: str, nemo_error: str) -> str:
    """The ``error`` of an attempt's failure row: NeMo Gym's text for the failure (``nemo_error``,
    ``Rollout.nemo_error``), else the stored ``error`` (where gymweb's message is NeMo Gym's text,
    on imported rows, and on attempts stored before NeMo Gym's text was kept)."""
    return nemo_error or error


def stamps_rows(run: Run) -> bool:
    """Whether the run's exported rows get NeMo Gym's stamps added: yes for runs gymweb collected,
    no for imported ones (they keep exactly the stamps they came with) and reverified ones (NeMo
    Gym's reverify writes the env's reply with the indices and ``agent_ref``, no stamps of its own)."""
    return run.status != Run.Status.IMPORTED and run.reverified_from_id is None


def agent_ordered(run: Run) -> bool:
    """Whether the run's success rows are the env's replies as NeMo Gym's agent returns them
    (``nemo_request.agent_result``): yes for runs gymweb collected; no for imported runs (their rows
    as they came) and reverified runs (NeMo Gym's reverify writes the env's reply as it came)."""
    return run.status != Run.Status.IMPORTED and run.reverified_from_id is None


def materialized_row(task_row: dict[str, Any], rollout_index: int) -> dict[str, Any]:
    """One ``<stem>_materialized_inputs.jsonl`` row: the task row with ``_ng_rollout_index`` last."""
    row = dict(task_row)
    row[ROLLOUT_INDEX_KEY_NAME] = rollout_index
    return row


def iter_successes(run: Run, rollouts: QuerySet | None = None) -> Iterator[str]:
    """Lines (without newline) of ``rollouts.jsonl`` for the run's succeeded attempts, optionally
    restricted to a filtered queryset of its rollouts: by (task, rollout) for a collected run, in
    the imported order for an imported one. An archived run's whole file is read from its archive
    (the same lines); a selection of it raises ``archive_files.RunArchived``."""
    if run.is_archived:
        if rollouts is not None:
            raise archive_files.RunArchived(run, "a selection of its rollouts.jsonl")
        yield from archive_files.archived_lines(run, "rollouts")
        return
    qs = (rollouts if rollouts is not None else Rollout.objects.filter(run=run)).filter(status=Rollout.Status.SUCCEEDED)
    # Rows of a collected run come ordered by task, so remembering the last task's agent_ref keeps
    # memory constant.
    last_task, ref = None, None
    stamp, ordered = stamps_rows(run), agent_ordered(run)
    order = ("source_ordinal", "id") if run.status == Run.Status.IMPORTED else ("task_index", "rollout_index", "id")
    fetch = qs.order_by(*order).values_list(
        "task_index", "rollout_index", "verify_json", "source_text", "task__row_json"
    )
    for task_index, rollout_index, verify_json, source_text, task_json in fetch.iterator(chunk_size=CHUNK):
        if source_text:
            yield source_text
            continue
        if task_index != last_task:
            last_task, ref = task_index, agent_ref_of(json.loads(task_json), run)
        yield row_line(success_row(verify_json, task_index, rollout_index, ref, stamp, ordered))


def iter_failures(run: Run, rollouts: QuerySet | None = None) -> Iterator[str]:
    """Lines of the failures sidecar: one per failed attempt (kill-shaped attempts excluded), by
    key and attempt for a collected run, in the imported order for an imported one."""
    qs = (rollouts if rollouts is not None else Rollout.objects.filter(run=run)).filter(status=Rollout.Status.FAILED)
    order = (
        ("source_ordinal", "id")
        if run.status == Run.Status.IMPORTED
        else ("task_index", "rollout_index", "attempt", "id")
    )
    fetch = qs.order_by(*order).values_list(
        "rollout_index", "error", "nemo_error", "terminal", "source_text", "task__row_json"
    )
    stamp = stamps_rows(run)
    for rollout_index, error, nemo_error, terminal, source_text, task_json in fetch.iterator(chunk_size=CHUNK):
        if source_text:
            yield source_text
            continue
        row = failure_row(json.loads(task_json), rollout_index, sidecar_error(error, nemo_error), terminal, stamp)
        yield row_line(row)


def iter_materialized(run: Run) -> Iterator[str]:
    """Lines of ``<stem>_materialized_inputs.jsonl``: each key's materialised row, aabbcc order; for
    a run imported with its materialised inputs, that file's lines in its order."""
    imported = Rollout.objects.filter(run=run, input_ordinal__isnull=False)
    if run.status == Run.Status.IMPORTED and imported.exists():
        fetch = imported.order_by("input_ordinal").values_list("rollout_index", "input_text", "task__row_json")
        for rollout_index, input_text, task_json in fetch.iterator(chunk_size=CHUNK):
            yield input_text or row_line(materialized_row(json.loads(task_json), rollout_index))
        return
    keys = (
        Rollout.objects.filter(run=run)
        .order_by("task_index", "rollout_index")
        .values_list("task_index", "rollout_index", "task__row_json")
        .distinct()
    )
    for _task_index, rollout_index, task_json in keys.iterator(chunk_size=CHUNK):
        yield row_line(materialized_row(json.loads(task_json), rollout_index))


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
