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
each successful reply as an *agent turn* bound to its call:

================================== ===================================================================
check                              gymweb's evidence (NeMo Gym's meaning kept)
================================== ===================================================================
rollout_missing_agent_turns        no agent call returned a reply (e.g. the first call failed)
rollout_ended_on_failed_model_call the rollout's last agent call failed (its reward-0 row is then not a
                                   real zero)
agent_turn_hollow                  a reply with no message text, reasoning or tool call
model_call_zero_completion_tokens  a reply whose ``usage.output_tokens`` is 0
model_call_missing_token_counts    a reply without ``usage`` (or without input/output tokens)
trajectory_capture_mismatch        two replies of one rollout share a response id (NeMo Gym binds
                                   turns to calls by it)
model_call_failed                  an agent call that failed (HTTP >= 400, bad or invalid reply,
                                   timeout...); NeMo Gym can only see failed calls it could bind,
                                   gymweb sees every one
rollout_token_count_mismatch       the row's ``response.usage`` (what trains) differs from the sum of
                                   the calls' usage
model_call_runaway_generation      ``incomplete_details.reason`` is a length limit and the reply has
                                   no content
tool_results_not_executed          gymweb's own: the agent's replies carry results of the env's tools
                                   (declared by the task) that the env never executed through gymweb
                                   (``rollouts.nemo.miswiring``; collected runs only)
task_consistently_unhealthy        every computable repeat of a task is unhealthy (>= 2 computable)
task_no_successful_model_calls     no repeat of a task got one successful agent call
================================== ===================================================================

Which rollouts of a run: one per (task, rollout) key that finished: its success, else its latest
failed attempt (NeMo Gym checks ``rollouts.jsonl``, which for a remote agent holds successes only;
gymweb's failed keys are where agent failures show, so they are checked too; ``successes_only``
restricts to NeMo Gym's set). Imported runs have no per-call evidence: their rows are checked like
files. Verdicts are stored (``RolloutHealth``) and the summary on ``Run.health_summary``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from django.db import transaction
from django.utils import timezone

from rollouts.models import AgentCall, Rollout, RolloutHealth, Run, Task, TrajectoryItem
from rollouts.nemo import miswiring
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "CHECK_IDS",
    "ROLLOUT_CHECK_IDS",
    "TASK_CHECK_IDS",
    "QUALITY_SUMMARY_FILENAME",
    "ROLLOUT_VERDICTS_FILENAME",
    "Evidence",
    "Digest",
    "HealthResult",
    "OutputExists",
    "check_evidence",
    "check_files",
    "check_run",
    "evidence_from_file",
    "format_report",
    "store_run_health",
    "write_reports",
    "run_health_check",
]

QUALITY_SUMMARY_FILENAME = "quality_summary.json"
ROLLOUT_VERDICTS_FILENAME = "rollout_verdicts.jsonl"

# NeMo Gym's CHECK_REGISTRY order (rollout scope first, then task scope); the files list them so.
ROLLOUT_CHECK_IDS = (
    "check_execution_error",
    "record_unreadable",
    "rollout_duplicate_identity",
    "rollout_missing_agent_turns",
    "rollout_ended_on_failed_model_call",
    "agent_turn_hollow",
    "model_call_zero_completion_tokens",
    "model_call_missing_token_counts",
    "trajectory_capture_mismatch",
    "model_call_failed",
    "rollout_token_count_mismatch",
    "model_call_runaway_generation",
)
TASK_CHECK_IDS = ("task_consistently_unhealthy", "task_no_successful_model_calls")
CHECK_IDS = ROLLOUT_CHECK_IDS + TASK_CHECK_IDS
# gymweb's own checks, on runs gymweb collected only (a file has no record of which tool results the
# env executed); they appear in a summary only when some rollout could be checked, so NeMo Gym's
# files come out byte for byte.
TOOL_RESULTS_NOT_EXECUTED = "tool_results_not_executed"
GYMWEB_CHECK_IDS = (TOOL_RESULTS_NOT_EXECUTED,)
# Checks that need the record only; every other rollout check reads the trajectory.
RECORD_ONLY = {"check_execution_error", "record_unreadable", "rollout_duplicate_identity"}
TURN_CHECKS = {"rollout_missing_agent_turns", "agent_turn_hollow"}
LENGTH_LIMIT_REASONS = frozenset({"length", "max_output_tokens", "max_tokens"})
TOOL_CALL_TYPES = frozenset(
    {
        "function_call",
        "tool_call",
        "tool_use",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "file_search_call",
        "web_search_call",
        "computer_call",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "custom_tool_call",
    }
)
CONTENT_KEYS = (
    "text",
    "content",
    "output_text",
    "answer",
    "refusal",
    "encrypted_content",
    "reasoning",
    "reasoning_content",
    "summary",
)
CHECK_TEXT = {
    "check_execution_error": "a check raised an exception",
    "record_unreadable": "the row cannot be read",
    "rollout_duplicate_identity": "two rows claim the same (task, rollout)",
    "rollout_missing_agent_turns": "no agent reply at all",
    "rollout_ended_on_failed_model_call": "the rollout ended on a failed agent call",
    "agent_turn_hollow": "a reply with no message or tool call",
    "model_call_zero_completion_tokens": "a reply with 0 output tokens",
    "model_call_missing_token_counts": "a reply without token counts",
    "trajectory_capture_mismatch": "replies that cannot be told apart (same response id)",
    "model_call_failed": "a failed agent call",
    "rollout_token_count_mismatch": "the row's usage differs from the calls' usage",
    "model_call_runaway_generation": "hit the length limit with no content",
    "task_consistently_unhealthy": "every repeat of the task is unhealthy",
    "task_no_successful_model_calls": "no repeat of the task got a successful agent call",
    TOOL_RESULTS_NOT_EXECUTED: "the agent reported results of the env's tools that the env never executed",
}


class OutputExists(FileExistsError):
    """A report file exists and ``overwrite`` was not given (NeMo Gym's flag name)."""


def nonempty(value: Any) -> bool:
    """NeMo Gym's ``_nonempty``: text with non-space characters, somewhere under the content keys."""
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, tuple)):
        return any(nonempty(v) for v in value)
    if isinstance(value, dict):
        return any(nonempty(value.get(k)) for k in CONTENT_KEYS)
    return False


def has_tool_call(item: Any) -> bool:
    """NeMo Gym's ``_item_has_tool_call``: a tool-call item type, or ``tool_calls`` somewhere."""
    if isinstance(item, (list, tuple)):
        return any(has_tool_call(v) for v in item)
    if not isinstance(item, dict):
        return False
    return item.get("type") in TOOL_CALL_TYPES or bool(item.get("tool_calls"))


def usage_tokens(usage: Any) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens of a usage object (Responses or Chat names); None when absent
    or not a whole number >= 0 (NeMo Gym's ``_usage_tokens``)."""
    if not isinstance(usage, dict):
        return None, None
    prompt = usage.get("input_tokens", usage.get("prompt_tokens"))
    completion = usage.get("output_tokens", usage.get("completion_tokens"))
    ok = lambda v: v if type(v) is int and v >= 0 else None  # noqa: E731
    return ok(prompt), ok(completion)


@dataclass
class Call:
    """One agent call read as NeMo Gym's model call. ``step``: gymweb's agent-call index; times in
    epoch seconds; ``failed``: the call got no usable reply; ``has_content``: the reply's items hold
    text, reasoning or a tool call (None when unknown)."""

    step: int
    started_at: float | None
    response_id: str
    status_code: int | None
    error_category: str
    finish_reason: str | None
    tokens_in: int | None
    tokens_out: int | None
    has_content: bool | None
    failed: bool

    @property
    def locator(self) -> dict[str, str]:
        return {"call_id": self.response_id or str(self.step)}


@dataclass
class Turn:
    """One successful reply (an agent turn). ``step`` is its agent-call index; NeMo Gym numbers
    turns from 1 (``turn`` in the locator)."""

    step: int
    has_message: bool
    has_tool_calls: bool


@dataclass
class Evidence:
    """What the checks read about one rollout. ``record``: the row (a ``rollouts.jsonl`` or failures
    row), None when ``parse_error`` names why it could not be read; ``calls``/``turns``: None when not
    observed (a file row without gymweb's steps)."""

    task_index: int | str
    rollout_index: int | str
    rollout_id: str
    record: dict[str, Any] | None = None
    parse_error: str | None = None
    source: tuple[str, int] | None = None  # (file, line) for record_unreadable
    calls: list[Call] | None = None
    turns: list[Turn] | None = None
    stage_index: Any = None
    rollout_pk: int | None = None
    # call_ids of tool results the agent reported for the env's tools that the env never executed
    # (rollouts.nemo.miswiring); None when not observed (a file row).
    unexecuted_tool_results: list[str] | None = None


@dataclass
class Digest:
    """One rollout's outcome (NeMo Gym's ``RolloutDigest``). ``finding_steps`` parallels
    ``findings``: the agent-call index each concerns, or None."""

    task_index: int | str
    rollout_index: int | str
    rollout_id: str
    verdict: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    finding_steps: list[int | None] = field(default_factory=list)
    unobserved: list[str] = field(default_factory=list)
    stage_index: Any = None
    capture_observed: bool = False
    policy_calls_observed: bool = False
    successful_model_calls: int = 0
    model_call_errors: int = 0
    errors_by_status: dict[str, int] = field(default_factory=dict)
    ended_on_error: bool = False
    duplicated_calls: int = 0
    transcript_prompt_tokens: int = 0
    transcript_completion_tokens: int = 0
    capture_prompt_tokens: int = 0
    capture_completion_tokens: int = 0
    rollout_pk: int | None = None
    gymweb_observed: bool = False


@dataclass
class HealthResult:
    """``summary``: the ``quality_summary.json`` object; ``digests``: per rollout, sorted."""

    summary: dict[str, Any]
    digests: list[Digest]


def _finding(check: str, locator: dict | None = None, detail: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"check": check}
    if locator is not None:
        out["locator"] = locator
    out["detail"] = detail or {}
    return out


def _transcript_tokens(record: dict[str, Any]) -> tuple[int, int, bool]:
    response = record.get("response")
    prompt, completion = usage_tokens(response.get("usage") if isinstance(response, dict) else None)
    return prompt or 0, completion or 0, prompt is not None and completion is not None


def _ended_on_failed_call(check: str, calls: list[Call]) -> list[tuple[dict[str, Any], int | None]]:
    """``rollout_ended_on_failed_model_call``: the last model call (by start, then step) failed."""
    ordered = sorted(calls, key=lambda c: (c.started_at or 0.0, c.step))
    last = ordered[-1]
    if not last.failed:
        return []
    return [
        (
            _finding(
                check,
                last.locator,
                {
                    "model_ref": None,
                    "status": last.status_code,
                    "error_category": last.error_category or None,
                    "observed_calls": len(calls),
                    "successful_calls": sum(1 for c in calls if not c.failed),
                },
            ),
            last.step,
        )
    ]


def _duplicated_captures(check: str, bound: list[Call]) -> list[tuple[dict[str, Any], int | None]]:
    """``trajectory_capture_mismatch``: a captured call (by response id) bound more than once."""
    ids = Counter(c.response_id for c in bound if c.response_id)
    out, seen = [], set()
    for c in bound:
        if c.response_id and ids[c.response_id] > 1 and c.response_id not in seen:
            seen.add(c.response_id)
            out.append(
                (
                    _finding(
                        check,
                        {"call_id": c.response_id},
                        {"kind": "duplicated_captured_call", "count": ids[c.response_id]},
                    ),
                    c.step,
                )
            )
    return out


def _run_check(check: str, ev: Evidence, bound: list[Call]) -> list[tuple[dict[str, Any], int | None]]:
    """Findings of one rollout check, each with the step it concerns."""
    calls, turns = ev.calls or [], ev.turns or []
    if check in RECORD_ONLY:
        return []
    if check == "rollout_missing_agent_turns":
        if turns:
            return []
        return [(_finding(check, None, {"reason": "no agent turn with model activity"}), None)]
    if check == "agent_turn_hollow":
        return [
            (_finding(check, {"turn": t.step + 1}, {"reason": "agent turn has no message or tool calls"}), t.step)
            for t in turns
            if not t.has_message and not t.has_tool_calls
        ]
    if check == "rollout_ended_on_failed_model_call":
        return _ended_on_failed_call(check, calls)
    if check == "model_call_zero_completion_tokens":
        return [(_finding(check, c.locator, {"completion_tokens": 0}), c.step) for c in bound if c.tokens_out == 0]
    if check == "model_call_missing_token_counts":
        return [
            (
                _finding(
                    check,
                    c.locator,
                    {
                        "missing": [
                            name
                            for name, v in (("prompt_tokens", c.tokens_in), ("completion_tokens", c.tokens_out))
                            if v is None
                        ]
                    },
                ),
                c.step,
            )
            for c in bound
            if c.tokens_in is None or c.tokens_out is None
        ]
    if check == "trajectory_capture_mismatch":
        return _duplicated_captures(check, bound)
    if check == "model_call_failed":
        last_step = max((c.step for c in calls), default=None)
        return [
            (
                _finding(
                    check,
                    c.locator,
                    {
                        "status": c.status_code,
                        "error_category": c.error_category or None,
                        "terminal": c.step == last_step,
                    },
                ),
                c.step,
            )
            for c in calls
            if c.failed
        ]
    if check == "rollout_token_count_mismatch":
        prompt, completion, _ = _transcript_tokens(ev.record or {})
        capture_prompt = sum(c.tokens_in or 0 for c in bound)
        capture_completion = sum(c.tokens_out or 0 for c in bound)
        if prompt != capture_prompt or completion != capture_completion:
            return [
                (
                    _finding(
                        check,
                        None,
                        {
                            "transcript_prompt": prompt,
                            "transcript_completion": completion,
                            "capture_prompt": capture_prompt,
                            "capture_completion": capture_completion,
                        },
                    ),
                    None,
                )
            ]
        return []
    if check == "model_call_runaway_generation":
        return [
            (_finding(check, c.locator, {"finish_reason": c.finish_reason}), c.step)
            for c in bound
            if c.finish_reason in LENGTH_LIMIT_REASONS and not c.has_content
        ]
    raise KeyError(check)


def _observable(check: str, ev: Evidence, bound: list[Call]) -> bool:
    """Whether the evidence for ``check`` exists (else the check is ``unobserved``), following
    NeMo Gym's gating in ``rollout_health._worker``."""
    if check in RECORD_ONLY:
        return True
    if ev.calls is None and ev.turns is None:
        return False
    if check in TURN_CHECKS:
        return ev.turns is not None
    if check in ("rollout_ended_on_failed_model_call", "model_call_failed"):
        return bool(ev.calls)
    if check == "rollout_token_count_mismatch":
        return (
            bool(bound)
            and _transcript_tokens(ev.record or {})[2]
            and all(c.tokens_in is not None and c.tokens_out is not None for c in bound)
        )
    if check == "model_call_runaway_generation":
        return bool(bound) and not any(c.finish_reason in LENGTH_LIMIT_REASONS and c.has_content is None for c in bound)
    return bool(bound)


def check_evidence(ev: Evidence, ignored: frozenset[str] = frozenset()) -> Digest:
    """Run every rollout-scope check on one rollout's evidence (NeMo Gym's per-rollout worker)."""
    digest = Digest(
        ev.task_index, ev.rollout_index, ev.rollout_id, "healthy", stage_index=ev.stage_index, rollout_pk=ev.rollout_pk
    )
    calls = ev.calls or []
    bound = [c for c in calls if not c.failed]
    for check in ROLLOUT_CHECK_IDS:
        if check in ignored:
            continue
        if ev.parse_error is not None:
            if check == "record_unreadable":
                locator = {"source_file": ev.source[0], "line": ev.source[1]} if ev.source else None
                digest.findings.append(
                    _finding(check, locator, {"reason": "rollout record is unreadable", "error": ev.parse_error})
                )
                digest.finding_steps.append(None)
            else:
                digest.unobserved.append(check)
            continue
        if not _observable(check, ev, bound):
            digest.unobserved.append(check)
            continue
        try:
            found = _run_check(check, ev, bound)
        except Exception as exc:  # NeMo Gym's rule: a crashing check is itself a finding
            digest.unobserved.append(check)
            if "check_execution_error" not in ignored:
                digest.findings.append(
                    _finding(
                        "check_execution_error",
                        None,
                        {
                            "reason": "check raised an unexpected exception",
                            "failed_check": check,
                            "error": type(exc).__name__,
                        },
                    )
                )
                digest.finding_steps.append(None)
            continue
        for finding, step in found:
            digest.findings.append(finding)
            digest.finding_steps.append(step)
    if ev.unexecuted_tool_results is not None and TOOL_RESULTS_NOT_EXECUTED not in ignored:
        digest.gymweb_observed = True
        if ev.unexecuted_tool_results:
            digest.findings.append(
                _finding(
                    TOOL_RESULTS_NOT_EXECUTED,
                    {"call_id": ev.unexecuted_tool_results[0]},
                    {
                        "reason": "the agent's replies carry results of the env's tools that the env never executed "
                        "(is the agent URL NeMo Gym's own agent server?)",
                        "count": len(ev.unexecuted_tool_results),
                    },
                )
            )
            digest.finding_steps.append(None)
    digest.verdict = "unhealthy" if digest.findings else "unobserved" if digest.unobserved else "healthy"
    failed = [c for c in calls if c.failed]
    digest.capture_observed = bool(calls)
    digest.policy_calls_observed = ev.calls is not None and ev.turns is not None
    digest.successful_model_calls = len(bound)
    digest.model_call_errors = len(failed)
    digest.errors_by_status = dict(
        Counter(str(c.status_code) if c.status_code is not None else "unknown" for c in failed)
    )
    if calls:
        digest.ended_on_error = sorted(calls, key=lambda c: (c.started_at or 0.0, c.step))[-1].failed
    ids = Counter(c.response_id for c in calls if c.response_id)
    digest.duplicated_calls = sum(n - 1 for n in ids.values() if n > 1)
    if ev.record is not None:
        digest.transcript_prompt_tokens, digest.transcript_completion_tokens, _ = _transcript_tokens(ev.record)
    digest.capture_prompt_tokens = sum(c.tokens_in or 0 for c in calls)
    digest.capture_completion_tokens = sum(c.tokens_out or 0 for c in calls)
    return digest


def _mark_duplicates(digests: list[Digest], ignored: frozenset[str]) -> None:
    if "rollout_duplicate_identity" in ignored:
        return
    groups: dict[tuple, list[Digest]] = defaultdict(list)
    for d in digests:
        groups[(_hashable(d.stage_index), _hashable(d.task_index), _hashable(d.rollout_index))].append(d)
    for copies in groups.values():
        if len(copies) < 2:
            continue
        for d in copies:
            d.findings.append(_finding("rollout_duplicate_identity", None, {"duplicate_count": len(copies)}))
            d.finding_steps.append(None)
            d.verdict = "unhealthy"


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def _reduce(digests: list[Digest], ignored: frozenset[str]) -> dict[str, Any]:
    """NeMo Gym's ``_reduce``: coverage, verdict and issue counts, stats, per-task flags."""
    repeats_of = _repeats_by_task(digests)
    coverage = _rollout_coverage(digests, ignored)
    task_flags = _task_flags(repeats_of, ignored, coverage)
    issues = Counter(f["check"] for d in digests for f in d.findings)
    issues.update(flag for flags in task_flags.values() for flag in flags)
    verdicts = Counter(d.verdict for d in digests)
    statuses: Counter[str] = Counter()
    for d in digests:
        statuses.update(d.errors_by_status)
    tasks = _task_table(digests, repeats_of, task_flags)
    issue_counts = _gymweb_coverage(digests, ignored, issues, coverage)
    return {
        "run": {
            "ignored_checks": sorted(ignored),
            "artifacts": {
                "records": len(digests),
                "captures": sum(d.capture_observed for d in digests),
                "coverage": coverage,
            },
            "verdicts": {v: verdicts[v] for v in ("healthy", "unhealthy", "unobserved")},
            "issues": issue_counts,
            "stats": {
                "model_call_errors": {
                    "total": sum(d.model_call_errors for d in digests),
                    "by_status": dict(sorted(statuses.items())),
                    "rollouts_affected": sum(bool(d.model_call_errors) for d in digests),
                    "ended_on_error": sum(d.ended_on_error for d in digests),
                },
                "duplicated_calls": {
                    "replayed": sum(d.duplicated_calls for d in digests),
                    "rollouts": sum(bool(d.duplicated_calls) for d in digests),
                },
                "tokens": {
                    "prompt": sum(d.transcript_prompt_tokens for d in digests),
                    "completion": sum(d.transcript_completion_tokens for d in digests),
                    "capture_prompt": sum(d.capture_prompt_tokens for d in digests),
                    "capture_completion": sum(d.capture_completion_tokens for d in digests),
                },
            },
        },
        "tasks": tasks,
    }


def _repeats_by_task(digests: list[Digest]) -> dict[Any, list[tuple[str, bool, int]]]:
    """Per task: one ``(verdict, policy calls observed, successful model calls)`` per repeat (the
    copies of a repeat agree on a verdict, else it is unobserved)."""
    by_task: dict[Any, list[Digest]] = defaultdict(list)
    for d in digests:
        by_task[_hashable(d.task_index)].append(d)
    repeats_of: dict[Any, list[tuple[str, bool, int]]] = {}
    for task, records in by_task.items():
        per_rollout: dict[Any, list[Digest]] = defaultdict(list)
        for d in records:
            per_rollout[_hashable(d.rollout_index)].append(d)
        repeats = []
        for copies in per_rollout.values():
            seen = {c.verdict for c in copies}
            repeats.append(
                (
                    seen.pop() if len(seen) == 1 else "unobserved",
                    all(c.policy_calls_observed for c in copies),
                    max(c.successful_model_calls for c in copies),
                )
            )
        repeats_of[task] = repeats
    return repeats_of


def _rollout_coverage(digests: list[Digest], ignored: frozenset[str]) -> dict[str, dict[str, int]]:
    """Every check's coverage, with the rollout checks' counted: evaluated, unobserved or ignored."""
    coverage = {c: {"evaluated": 0, "unobserved": 0, "ignored": 0} for c in CHECK_IDS}
    for d in digests:
        unobserved = set(d.unobserved)
        for c in ROLLOUT_CHECK_IDS:
            if c in ignored:
                coverage[c]["ignored"] += 1
            else:
                coverage[c]["unobserved" if c in unobserved else "evaluated"] += 1
    return coverage


def _task_flags(
    repeats_of: dict[Any, list[tuple[str, bool, int]]], ignored: frozenset[str], coverage: dict[str, dict[str, int]]
) -> dict[Any, list[str]]:
    """The task checks' flags per task, counting their coverage into ``coverage``."""
    task_flags: dict[Any, list[str]] = defaultdict(list)
    for task, repeats in repeats_of.items():
        if "task_consistently_unhealthy" in ignored:
            coverage["task_consistently_unhealthy"]["ignored"] += 1
        else:
            computable = [r for r in repeats if r[0] != "unobserved"]
            if len(computable) >= 2:
                coverage["task_consistently_unhealthy"]["evaluated"] += 1
                if all(r[0] == "unhealthy" for r in computable):
                    task_flags[task].append("task_consistently_unhealthy")
            else:
                coverage["task_consistently_unhealthy"]["unobserved"] += 1
        if "task_no_successful_model_calls" in ignored:
            coverage["task_no_successful_model_calls"]["ignored"] += 1
        elif repeats and all(r[1] for r in repeats):
            coverage["task_no_successful_model_calls"]["evaluated"] += 1
            if not any(r[2] for r in repeats):
                task_flags[task].append("task_no_successful_model_calls")
        else:
            coverage["task_no_successful_model_calls"]["unobserved"] += 1
    return task_flags


def _task_table(
    digests: list[Digest], repeats_of: dict[Any, list[tuple[str, bool, int]]], task_flags: dict[Any, list[str]]
) -> dict[str, Any]:
    """Per task (by its original index, as text): repeats, verdict counts and flags."""
    tasks: dict[str, Any] = {}
    originals = {_hashable(d.task_index): d.task_index for d in digests}
    for task in sorted(repeats_of, key=lambda v: (isinstance(originals[v], str), str(originals[v]))):
        counts = Counter(r[0] for r in repeats_of[task])
        tasks[str(originals[task])] = {
            "repeats": len(repeats_of[task]),
            "healthy": counts["healthy"],
            "unhealthy": counts["unhealthy"],
            "unobserved": counts["unobserved"],
            "flags": task_flags.get(task, []),
        }
    return tasks


def _gymweb_coverage(
    digests: list[Digest], ignored: frozenset[str], issues: Counter, coverage: dict[str, dict[str, int]]
) -> dict[str, int]:
    """The issue counts of NeMo Gym's checks, plus gymweb's own checks (and their coverage, into
    ``coverage``) when observed or ignored."""
    issue_counts = {c: issues[c] for c in CHECK_IDS}
    for c in GYMWEB_CHECK_IDS:
        if c in ignored or any(d.gymweb_observed for d in digests):
            issue_counts[c] = issues[c]
            coverage[c] = {
                "evaluated": sum(d.gymweb_observed for d in digests),
                "unobserved": 0,
                "ignored": len(digests) if c in ignored else 0,
            }
            coverage[c]["unobserved"] = len(digests) - coverage[c]["evaluated"] - coverage[c]["ignored"]
    return issue_counts


def _sort_key(d: Digest) -> tuple:
    part = lambda v: (0, v) if isinstance(v, int) and not isinstance(v, bool) else (1, str(v))  # noqa: E731
    return part(d.task_index), part(d.rollout_index), part(d.stage_index)


def normalize_ignored(checks: str | Sequence[str] | None) -> frozenset[str]:
    """Check ids to skip, from a comma-separated string or a list. Raises ``ValueError`` naming
    unknown ids (NeMo Gym's ``normalize_ignored_checks``)."""
    if not checks:
        return frozenset()
    raw = checks.split(",") if isinstance(checks, str) else checks
    ids = [c.strip() for c in raw if c.strip()]
    unknown = sorted(set(ids) - set(CHECK_IDS) - set(GYMWEB_CHECK_IDS))
    if unknown:
        raise ValueError(f"Unknown rollout health check(s): {', '.join(unknown)}")
    return frozenset(ids)


def check_all(evidence: Iterable[Evidence], ignored: frozenset[str] = frozenset()) -> HealthResult:
    """Check every rollout, mark duplicate identities, reduce. Digests come back sorted."""
    digests = [check_evidence(ev, ignored) for ev in evidence]
    _mark_duplicates(digests, ignored)
    summary = _reduce(digests, ignored)
    digests.sort(key=_sort_key)
    return HealthResult(summary, digests)


# -- files ----------------------------------------------------------------------------------------
def evidence_from_file(paths: Sequence[str | Path]) -> Iterator[Evidence]:
    """One ``Evidence`` per non-blank line of the given ``rollouts.jsonl`` files, read like NeMo
    Gym reads them: a row without ``_ng_task_index`` is numbered by its position among all rows; an
    unreadable line becomes a ``record_unreadable`` finding (never an error). Raises
    ``FileNotFoundError`` for a missing file."""
    ordinal = 0
    for source_index, path in enumerate(Path(p) for p in paths):
        with path.open("rb") as fh:
            for line_number, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    record = orjson.loads(raw)
                    if not isinstance(record, dict):
                        raise ValueError("rollout line is not an object")
                    error = None
                except Exception as exc:
                    record, error = {}, type(exc).__name__
                fallback = f"__unreadable_record__:input-{source_index}:line-{line_number}" if error else ordinal
                task_index = record.get(TASK_INDEX_KEY_NAME, fallback)
                rollout_index = record.get(ROLLOUT_INDEX_KEY_NAME, 0)
                trajectory = record.get("ng_trajectory")
                traj_id = trajectory.get("rollout_id") if isinstance(trajectory, dict) else None
                yield Evidence(
                    task_index=task_index,
                    rollout_index=rollout_index,
                    rollout_id=str(record.get("rollout_id") or traj_id or f"{task_index}-{rollout_index}"),
                    record=None if error else record,
                    parse_error=error,
                    source=(str(path), line_number),
                    stage_index=record.get("stage_index"),
                )
                ordinal += 1


def check_files(paths: Sequence[str | Path], ignored: frozenset[str] = frozenset()) -> HealthResult:
    """NeMo Gym's health check of ``rollouts.jsonl`` files (``gym eval health-check``)."""
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"Rollout JSONL not found: {p}")
    return check_all(evidence_from_file(paths), ignored)


def verdict_row(d: Digest) -> dict[str, Any]:
    """One ``rollout_verdicts.jsonl`` row (NeMo Gym's key order)."""
    row = {
        TASK_INDEX_KEY_NAME: d.task_index,
        ROLLOUT_INDEX_KEY_NAME: d.rollout_index,
        "rollout_id": d.rollout_id,
        "verdict": d.verdict,
        "findings": d.findings,
        "unobserved": d.unobserved,
    }
    if d.stage_index is not None:
        row["stage_index"] = d.stage_index
    return row


def report_paths(output_dir: str | Path) -> tuple[Path, Path]:
    out = Path(output_dir)
    return out / QUALITY_SUMMARY_FILENAME, out / ROLLOUT_VERDICTS_FILENAME


def write_reports(result: HealthResult, output_dir: str | Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``quality_summary.json`` (orjson, 2-space indent) and ``rollout_verdicts.jsonl`` into
    ``output_dir`` byte for byte as NeMo Gym does. Raises ``OutputExists`` when either exists and
    ``overwrite`` is false (nothing is written then)."""
    summary_path, verdicts_path = report_paths(output_dir)
    if not overwrite:
        existing = [str(p) for p in (summary_path, verdicts_path) if p.exists()]
        if existing:
            raise OutputExists(f"{', '.join(existing)} already exist(s); pass --overwrite to replace")
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_bytes(orjson.dumps(result.summary, option=orjson.OPT_INDENT_2))
    with verdicts_path.open("wb") as fh:
        for d in result.digests:
            fh.write(orjson.dumps(verdict_row(d), option=orjson.OPT_APPEND_NEWLINE))
    return summary_path, verdicts_path


def format_report(result: HealthResult, where: Path | None = None) -> str:
    """NeMo Gym's one-line recap, plus the issues found."""
    v = result.summary["run"]["verdicts"]
    ignored = result.summary["run"]["ignored_checks"]
    lines = [
        f"Rollout health: {sum(v.values())} checked, {v['healthy']} healthy, {v['unhealthy']} unhealthy, "
        f"{v['unobserved']} unobserved" + (f" (ignored: {', '.join(ignored)})" if ignored else "")
    ]
    issues = {k: n for k, n in result.summary["run"]["issues"].items() if n}
    if issues:
        lines.append("Issues: " + ", ".join(f"{k}={n}" for k, n in issues.items()))
    if where is not None:
        lines.append(f"Quality summary: {where}")
    return "\n".join(lines)


# -- stored runs ------------------------------------------------------------------------------------
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
