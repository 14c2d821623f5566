"""Rollout health checks of one rollout: NeMo Gym 0.7.0's rollout-scope checks
(``nemo_gym/health/``) on the ``Evidence`` of one row, giving its ``Digest`` (verdict and findings).
No Django here.

Each rollout gets a verdict: ``unhealthy`` when any check found something, else ``unobserved`` when
some check could not be evaluated for lack of evidence, else ``healthy``. Checks return *findings*
(``check``, ``locator``, ``detail``). The evidence each check reads (gymweb's, NeMo Gym's meaning kept):

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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHECK_IDS",
    "ROLLOUT_CHECK_IDS",
    "TASK_CHECK_IDS",
    "Evidence",
    "Digest",
    "check_evidence",
    "normalize_ignored",
]


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


def make_finding(check: str, locator: dict | None = None, detail: dict | None = None) -> dict[str, Any]:
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
            make_finding(
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
                    make_finding(
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
        return [(make_finding(check, None, {"reason": "no agent turn with model activity"}), None)]
    if check == "agent_turn_hollow":
        return [
            (make_finding(check, {"turn": t.step + 1}, {"reason": "agent turn has no message or tool calls"}), t.step)
            for t in turns
            if not t.has_message and not t.has_tool_calls
        ]
    if check == "rollout_ended_on_failed_model_call":
        return _ended_on_failed_call(check, calls)
    if check == "model_call_zero_completion_tokens":
        return [(make_finding(check, c.locator, {"completion_tokens": 0}), c.step) for c in bound if c.tokens_out == 0]
    if check == "model_call_missing_token_counts":
        return [
            (
                make_finding(
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
                make_finding(
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
                    make_finding(
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
            (make_finding(check, c.locator, {"finish_reason": c.finish_reason}), c.step)
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
                    make_finding(check, locator, {"reason": "rollout record is unreadable", "error": ev.parse_error})
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
                    make_finding(
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
                make_finding(
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
