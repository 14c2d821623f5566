"""The health check's report: every rollout's digest reduced as NeMo Gym reduces them (duplicate
identities, coverage, task-level checks, stats) into ``quality_summary.json``, and the two files
(``quality_summary.json``, ``rollout_verdicts.jsonl``) read and written byte for byte as NeMo Gym
writes them (orjson). No Django here.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollouts.evaluation.health_checks import (
    CHECK_IDS,
    GYMWEB_CHECK_IDS,
    ROLLOUT_CHECK_IDS,
    Digest,
    Evidence,
    check_evidence,
    make_finding,
)
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "QUALITY_SUMMARY_FILENAME",
    "ROLLOUT_VERDICTS_FILENAME",
    "HealthResult",
    "OutputExists",
    "check_files",
    "evidence_from_file",
    "format_report",
    "write_reports",
]


QUALITY_SUMMARY_FILENAME = "quality_summary.json"
ROLLOUT_VERDICTS_FILENAME = "rollout_verdicts.jsonl"


class OutputExists(FileExistsError):
    """A report file exists and ``overwrite`` was not given (NeMo Gym's flag name)."""


@dataclass
class HealthResult:
    """``summary``: the ``quality_summary.json`` object; ``digests``: per rollout, sorted."""

    summary: dict[str, Any]
    digests: list[Digest]


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
            d.findings.append(make_finding("rollout_duplicate_identity", None, {"duplicate_count": len(copies)}))
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


def check_all(evidence: Iterable[Evidence], ignored: frozenset[str] = frozenset()) -> HealthResult:
    """Check every rollout, mark duplicate identities, reduce. Digests come back sorted."""
    digests = [check_evidence(ev, ignored) for ev in evidence]
    _mark_duplicates(digests, ignored)
    summary = _reduce(digests, ignored)
    digests.sort(key=_sort_key)
    return HealthResult(summary, digests)


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
