"""Rollout health check: NeMo Gym 0.7.0's ``gym eval health-check`` (``nemo_gym/rollout_health.py``,
``nemo_gym/health/``) on files, and on stored runs with the evidence gymweb keeps.

Each rollout gets a verdict: ``unhealthy`` when any check found something, else ``unobserved`` when
some check could not be evaluated for lack of evidence, else ``healthy``. Checks return *findings*
(``check``, ``locator``, ``detail``); the check ids, the verdict rule, the task-level reduction and
the two files (``quality_summary.json``, ``rollout_verdicts.jsonl``, written with orjson as NeMo Gym
writes them) are NeMo Gym's.

Evidence. NeMo Gym reads a rollout's turns and model calls from the ``ng_trajectory`` its own agents
persist in the row; a remote_agent row has none, so every trajectory check is ``unobserved`` there
(as in ``../shared/data/nemo_gym/eval_0.7.0/run*/quality_summary.json``). ``--rollouts FILE`` does
exactly that (rows with an ``ng_trajectory`` get the record-level checks only; docs/evaluate.md).
A run collected by gymweb has every agent call (``AgentCall``: HTTP status, error, usage,
``incomplete_details``) and every item, so each agent call is read as NeMo Gym's *model call* and
each successful reply as an *agent turn* bound to its call (what each check reads: ``health_checks``).

Which rollouts of a run: one per (task, rollout) key that finished: its success, else its latest
failed attempt (NeMo Gym checks ``rollouts.jsonl``, which for a remote agent holds successes only;
gymweb's failed keys are where agent failures show, so they are checked too; ``successes_only``
restricts to NeMo Gym's set). Imported runs have no per-call evidence: their rows are checked like
files. Verdicts are stored (``RolloutHealth``) and the summary on ``Run.health_summary``.

The checks are ``health_checks``; the summary and the two files, ``health_report``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from rollouts.evaluation.health_checks import Call, Evidence, Turn, has_tool_call, nonempty, usage_tokens
from rollouts.evaluation.health_report import HealthResult, check_all, format_report, write_reports
from rollouts.models import AgentCall, Rollout, RolloutHealth, Run, Task, TrajectoryItem
from rollouts.nemo import miswiring

__all__ = [
    "check_run",
    "store_run_health",
    "run_health_check",
]


def checked_rollouts(run: Run, successes_only: bool = False) -> list[int]:
    """Ids of the rollouts a run's health check covers: per finished key its success, else its
    latest failed attempt (by attempt number)."""
    S = Rollout.Status
    wanted = [S.SUCCEEDED] if successes_only else [S.SUCCEEDED, S.FAILED]
    rows = (
        Rollout.objects.filter(run=run, status__in=wanted)
        .order_by("task_index", "rollout_index", "attempt", "id")
        .values_list("id", "task_index", "rollout_index", "status")
    )
    chosen: dict[tuple[int, int], tuple[int, str]] = {}
    for pk, task, rollout, status in rows.iterator(chunk_size=2000):
        previous = chosen.get((task, rollout))
        if previous is None or previous[1] != S.SUCCEEDED:
            chosen[(task, rollout)] = (pk, status)
    return [pk for pk, _ in chosen.values()]


def _calls_of(calls: list[AgentCall], items_by_step: dict[int, list[dict]]) -> tuple[list[Call], list[Turn]]:
    out_calls, turns = [], []
    for c in calls:
        failed = bool(c.error) or (c.http_status is not None and c.http_status >= 400)
        tokens_in, tokens_out = usage_tokens(c.usage)
        items = items_by_step.get(c.index, [])
        reason = c.incomplete_details.get("reason") if isinstance(c.incomplete_details, dict) else None
        content = nonempty(items) or has_tool_call(items)
        out_calls.append(
            Call(
                step=c.index,
                started_at=c.started.timestamp() if c.started else None,
                response_id=c.response_id,
                status_code=c.http_status,
                error_category=_error_category(c) if failed else "",
                finish_reason=reason,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                has_content=content,
                failed=failed,
            )
        )
        if not failed:
            turns.append(Turn(step=c.index, has_message=nonempty(items), has_tool_calls=has_tool_call(items)))
    return out_calls, turns


def _error_category(call: AgentCall) -> str:
    if call.http_status is not None and call.http_status >= 400:
        return "http_error"
    return "agent_call_failed"


def _record(r: Rollout) -> dict[str, Any]:
    if r.status == Rollout.Status.SUCCEEDED and r.verify_json:
        try:
            row = json.loads(r.verify_json)
        except ValueError:
            row = {}
        return row if isinstance(row, dict) else {}
    # a failed attempt's exported row has a placeholder response without usage
    return {"reward": 0.0, "response": {"usage": None}}


def _task_row(text: str) -> dict | None:
    try:
        row = json.loads(text)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def run_evidence(run: Run, ids: list[int], chunk: int = 200) -> Iterator[Evidence]:
    """Evidence of the given rollouts of a stored run, read in chunks (calls and the agent's items
    of each). Imported runs give record-only evidence (no per-call data exists for them)."""
    imported = run.status == Run.Status.IMPORTED
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        rollouts = list(Rollout.objects.filter(id__in=part).order_by("task_index", "rollout_index"))
        calls_of: dict[int, list[AgentCall]] = defaultdict(list)
        items_of: dict[int, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
        if not imported:
            for c in AgentCall.objects.filter(rollout_id__in=part).order_by("rollout_id", "index"):
                calls_of[c.rollout_id].append(c)
            agent_items = TrajectoryItem.objects.filter(rollout_id__in=part, origin=TrajectoryItem.Origin.AGENT)
            for rid, step, payload in agent_items.order_by("rollout_id", "seq").values_list(
                "rollout_id", "step", "payload"
            ):
                items_of[rid][step].append(payload)
            tools_of: dict[int, list[tuple[dict, str]]] = defaultdict(list)
            tool_items = TrajectoryItem.objects.filter(
                rollout_id__in=part, kind__in=("function_call", "function_call_output")
            )
            for rid, payload, origin in tool_items.order_by("rollout_id", "seq").values_list(
                "rollout_id", "payload", "origin"
            ):
                tools_of[rid].append((payload, origin))
            declared = {
                t.pk: miswiring.declared_tools((_task_row(t.row_json) or {}).get("responses_create_params"))
                for t in Task.objects.filter(rollouts__id__in=part).distinct().only("id", "row_json")
            }
        for r in rollouts:
            ev = Evidence(
                task_index=r.task_index,
                rollout_index=r.rollout_index,
                rollout_id=f"{r.task_index}-{r.rollout_index}",
                record=_record(r),
                rollout_pk=r.pk,
            )
            if not imported:
                ev.calls, ev.turns = _calls_of(calls_of.get(r.pk, []), items_of.get(r.pk, {}))
                ev.unexecuted_tool_results = miswiring.unexecuted_tool_results(
                    tools_of.get(r.pk, []), declared.get(r.task_id)
                )
            yield ev


def check_run(run: Run, ignored: frozenset[str] = frozenset(), successes_only: bool = False) -> HealthResult:
    """The health check of a stored run (see the module docstring for the evidence used)."""
    return check_all(run_evidence(run, checked_rollouts(run, successes_only)), ignored)


def store_run_health(run: Run, result: HealthResult) -> None:
    """Replace the run's stored verdicts and summary with ``result`` (one transaction)."""
    with transaction.atomic():
        RolloutHealth.objects.filter(run=run).delete()
        RolloutHealth.objects.bulk_create(
            [
                RolloutHealth(
                    run=run,
                    rollout_id=d.rollout_pk,
                    task_index=d.task_index,
                    rollout_index=d.rollout_index,
                    verdict=d.verdict,
                    checks="," + ",".join(dict.fromkeys(f["check"] for f in d.findings)) + "," if d.findings else "",
                    findings=d.findings,
                    finding_steps=d.finding_steps,
                    unobserved=d.unobserved,
                )
                for d in result.digests
                if d.rollout_pk is not None
            ],
            batch_size=500,
        )
        run.health_summary = result.summary
        run.health_checked = timezone.now()
        run.save(update_fields=["health_summary", "health_checked"])


def run_health_check(
    run: Run,
    output_dir: str | Path | None = None,
    *,
    overwrite: bool = False,
    ignored: frozenset[str] = frozenset(),
    successes_only: bool = False,
) -> tuple[HealthResult, tuple[Path, Path] | None]:
    """Check a stored run, store the verdicts, and write the two files into ``output_dir`` when
    given. Returns ``(result, paths or None)``. Raises ``OutputExists`` (nothing written, verdicts
    still stored) when a file exists and ``overwrite`` is false."""
    result = check_run(run, ignored, successes_only)
    store_run_health(run, result)
    paths = write_reports(result, output_dir, overwrite=overwrite) if output_dir is not None else None
    return result, paths


def auto_check(run: Run, output_dir: str | Path | None = None) -> str:
    """The check that ends every ``collect`` and import: store the verdicts and, for ``collect``,
    write the two files beside its output (replacing the ones an earlier ``collect`` of the same
    output wrote, as that command rewrites its other files). Returns the recap line; a failure of
    the check itself is reported in the line, never raised, so it cannot fail the collection."""
    try:
        result, paths = run_health_check(run, output_dir, overwrite=True)
    except Exception as exc:  # the collection is stored either way; say what went wrong
        return f"health check failed: {exc.__class__.__name__}: {exc}"
    return format_report(result, paths[0] if paths else None)
