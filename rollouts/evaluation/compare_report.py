"""NeMo Gym's ``gym eval compare``: a baseline run against 1 to ``MAX_CANDIDATES`` candidates, from
each run's aggregate metrics, written as ``compare_report.json`` / ``compare_report.md``; plus gymweb's
paired interval of ``mean/reward``.

Definitions are NeMo Gym 0.7.0's (``nemo_gym/comparison/``): every side is read as its
``<stem>_aggregate_metrics.json`` entry per agent (``agent_metrics``, ``key_metrics``,
``group_level_metrics``, ``repeat_level_metrics``); a stored run's entry is the env's
``/aggregate_metrics`` reply when it answered with all four, else computed here the way NeMo Gym's
``compute_aggregate_metrics`` computes it from the success rows. For each primary metric
(``rollouts.nemo.metrics_config``): the value (``mean_across_repeats/<m>`` when recorded), its 95%
interval across repeats as recorded, the delta, and the two-sided 95% Welch t-interval of the delta
from the repeat-level values (``scipy.stats.ttest_ind(..., equal_var=False).confidence_interval``).
Flips: tasks joined on ``_ng_task_index``; a task passes when its mean reward over repeats is above
0.5; binary mode when every min/max reward is 0 or 1, else the largest changes ("continuous").

gymweb adds, per candidate and for ``mean/reward``, a *paired* interval: both runs solved the same
tasks, so the per-task differences d_t = mean_cand(t) - mean_base(t) over the common tasks are
resampled with replacement (tasks, not repeats) ``PAIRED_BOOTSTRAP_RESAMPLES`` times with
``numpy.random.default_rng(PAIRED_BOOTSTRAP_SEED)``; the interval is the 2.5th-97.5th percentile of
the resampled means (numpy's linear interpolation). Pairing removes the between-task variance the
Welch interval carries; the report says which interval is narrower. It lives under the report's
``gymweb`` key (NeMo Gym's own keys are unchanged).

The sides are read by ``compare_sides``; the two files are written by ``compare_files``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rollouts.evaluation.compare_sides import CompareError, Side, is_number, numeric
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.nemo.metrics_config import is_primary_metric

__all__ = [
    "compare_sides",
    "flip_summary",
    "paired_bootstrap",
    "welch_delta_interval",
]

NEMO_GYM_SCHEMA_VERSION = "0.7.0"
MAX_CANDIDATES = 4
MAX_FLIPS_SHOWN = 10
PASS_THRESHOLD = 0.5
PAIRED_BOOTSTRAP_RESAMPLES = 10_000
PAIRED_BOOTSTRAP_SEED = 0
COMPARE_MD = "compare_report.md"
COMPARE_JSON = "compare_report.json"


# -- metric rows -----------------------------------------------------------------------------------
def _metric_value(metrics: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = numeric(metrics.get(name))
    if value is None:
        return None
    return {
        "value": value,
        "ci_low": numeric(metrics.get(f"ci_low_95_across_repeats/{name}")),
        "ci_high": numeric(metrics.get(f"ci_high_95_across_repeats/{name}")),
        "se_across_repeats": numeric(metrics.get(f"se_across_repeats/{name}")),
        "mean_across_repeats": numeric(metrics.get(f"mean_across_repeats/{name}")),
        "std_err_across_runs": numeric(metrics.get(f"{name}/std_err_across_runs")),
    }


def metric_point(value: dict[str, Any]) -> float:
    return value["mean_across_repeats"] if value["mean_across_repeats"] is not None else value["value"]


def _repeat_values(entry: dict[str, Any], name: str) -> list[float]:
    values = [numeric(e.get(name)) for e in entry.get("repeat_level_metrics") or [] if isinstance(e, dict)]
    return [v for v in values if v is not None and math.isfinite(v)]


def welch_delta_interval(baseline: Sequence[float], candidate: Sequence[float]) -> tuple[float | None, float | None]:
    """Two-sided 95% Welch t-interval of mean(candidate) - mean(baseline) (scipy's
    ``ttest_ind(candidate, baseline, equal_var=False).confidence_interval(0.95)``); (None, None) with
    fewer than 2 values on a side."""
    from scipy import stats

    if len(baseline) < 2 or len(candidate) < 2:
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical values: scipy warns and the interval is degenerate
        interval = stats.ttest_ind(list(candidate), list(baseline), equal_var=False).confidence_interval(
            confidence_level=0.95
        )
    low, high = float(interval.low), float(interval.high)
    return (None, None) if math.isnan(low) or math.isnan(high) else (low, high)


def _welch(base: dict[str, Any], cand: dict[str, Any], name: str) -> tuple[float | None, float | None]:
    if any(numeric((e.get("agent_metrics") or {}).get(f"mean_across_repeats/{name}")) is None for e in (base, cand)):
        return None, None
    return welch_delta_interval(_repeat_values(base, name), _repeat_values(cand, name))


def _metric_rows(base: dict[str, Any], cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base_metrics = {**(base.get("key_metrics") or {}), **(base.get("agent_metrics") or {})}
    cand_metrics = [{**(c.get("key_metrics") or {}), **(c.get("agent_metrics") or {})} for c in cands]
    key_names = set(base.get("key_metrics") or {}) | {n for c in cands for n in (c.get("key_metrics") or {})}
    names = [n for n in base_metrics if is_number(base_metrics[n])]
    seen = set(names)
    for m in cand_metrics:
        for n in m:
            if n not in seen and is_number(m[n]):
                names.append(n)
                seen.add(n)
    rows = []
    for name in names:
        if not is_primary_metric(name):
            continue
        b = _metric_value(base_metrics, name)
        b_point = metric_point(b) if b else None
        candidates: list[dict[str, Any] | None] = []
        for c_entry, metrics in zip(cands, cand_metrics):
            c = _metric_value(metrics, name)
            if c is None:
                candidates.append(None)
                continue
            low, high = _welch(base, c_entry, name) if b else (None, None)
            value = metric_point(c)
            delta = None if b_point is None else value - b_point
            candidates.append(
                {
                    **c,
                    "delta": delta,
                    "delta_pct": None if delta is None or not b_point else delta / abs(b_point) * 100.0,
                    "delta_ci_low": low,
                    "delta_ci_high": high,
                }
            )
        present = (["baseline"] if b else []) + [f"candidate[{i}]" for i, c in enumerate(candidates) if c is not None]
        rows.append(
            {
                "metric": name,
                "is_key_metric": name in key_names,
                "present_in": present,
                "baseline": b,
                "candidates": candidates,
            }
        )
    return rows


# -- flips -------------------------------------------------------------------------------------------
def _groups(entry: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {
        g[TASK_INDEX_KEY_NAME]: g
        for g in entry.get("group_level_metrics") or []
        if isinstance(g, dict) and TASK_INDEX_KEY_NAME in g
    }


def _per_repeat_rewards(group: dict[str, Any]) -> list[float] | None:
    infos = group.get("rollout_infos")
    if not isinstance(infos, list) or not infos:
        return None
    rewards = [numeric(i.get("reward")) for i in sorted(infos, key=lambda i: i.get(ROLLOUT_INDEX_KEY_NAME, 0))]
    return None if any(r is None for r in rewards) else rewards


def _looks_binary(common: list, bg: dict, cg: dict) -> bool:
    for t in common:
        for groups in (bg, cg):
            g = groups[t]
            observed = [v for v in (g.get("min/reward"), g.get("max/reward")) if v is not None] or [
                g.get("mean/reward")
            ]
            for v in observed:
                n = numeric(v)
                if n is None or n not in (0.0, 1.0):
                    return False
    return True


def _cap(flips: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for f in flips:
        n = counts.get(f["direction"], 0)
        counts[f["direction"]] = n + 1
        if n >= MAX_FLIPS_SHOWN:
            f["baseline_rewards"] = f["candidate_rewards"] = None
    return flips


def _direction(b: float, c: float) -> str | None:
    if PASS_THRESHOLD in (b, c):
        return None
    if b > PASS_THRESHOLD and not c > PASS_THRESHOLD:
        return "pass_to_fail"
    if c > PASS_THRESHOLD and not b > PASS_THRESHOLD:
        return "fail_to_pass"
    return None


def flip_summary(base: dict[str, Any], cand: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """NeMo Gym's ``FlipSummary`` of one candidate (see the section comment)."""
    bg, cg = _groups(base), _groups(cand)
    common = sorted(set(bg) & set(cg))
    out: dict[str, Any] = {
        "candidate_index": index,
        "mode": "unavailable",
        "reason": None,
        "field": "reward",
        "common_task_count": len(common),
        "baseline_only_task_count": len(set(bg) - set(cg)),
        "candidate_only_task_count": len(set(cg) - set(bg)),
        "pass_to_fail_count": None,
        "fail_to_pass_count": None,
        "tied_count": None,
        "unchanged_count": None,
        "net": None,
        "flips": [],
    }
    if not bg or not cg:
        out["reason"] = "one or both runs recorded no per-task metrics."
        return out
    if not common:
        out["reason"] = f"no overlapping task indices (baseline has {len(bg)}, candidate has {len(cg)})."
        return out
    scored = [(t, numeric(bg[t].get("mean/reward")), numeric(cg[t].get("mean/reward"))) for t in common]
    scored = [s for s in scored if s[1] is not None and s[2] is not None]
    if not scored:
        out["reason"] = "no `mean/reward` recorded for the overlapping tasks."
        return out

    def flip(t, b, c, direction):
        return {
            "task_index": t,
            "baseline_score": b,
            "candidate_score": c,
            "delta": c - b,
            "direction": direction,
            "baseline_rewards": _per_repeat_rewards(bg[t]),
            "candidate_rewards": _per_repeat_rewards(cg[t]),
        }

    if not _looks_binary([s[0] for s in scored], bg, cg):
        movers = [flip(t, b, c, "changed") for t, b, c in scored if c != b]
        movers.sort(key=lambda f: (-abs(f["delta"]), f["task_index"]))
        out.update(mode="continuous", unchanged_count=len(scored) - len(movers), flips=_cap(movers))
        return out
    flips, tied, unchanged = [], 0, 0
    for t, b, c in scored:
        d = _direction(b, c)
        if d is None:
            if PASS_THRESHOLD in (b, c):
                tied += 1
            else:
                unchanged += 1
            continue
        flips.append(flip(t, b, c, d))
    flips.sort(key=lambda f: (f["direction"] != "pass_to_fail", -abs(f["delta"]), f["task_index"]))
    p2f = sum(1 for f in flips if f["direction"] == "pass_to_fail")
    out.update(
        mode="binary",
        pass_to_fail_count=p2f,
        fail_to_pass_count=len(flips) - p2f,
        tied_count=tied,
        unchanged_count=unchanged,
        net=len(flips) - 2 * p2f,
        flips=_cap(flips),
    )
    return out


# -- paired interval (gymweb) -----------------------------------------------------------------------
def paired_bootstrap(
    base: dict[str, Any],
    cand: dict[str, Any],
    *,
    resamples: int = PAIRED_BOOTSTRAP_RESAMPLES,
    seed: int = PAIRED_BOOTSTRAP_SEED,
    tasks: set[int] | None = None,
) -> dict[str, Any]:
    """The paired 95% bootstrap interval of the candidate-minus-baseline ``mean/reward`` over the
    common tasks (see the section comment), or over those of ``tasks`` only (the task indices that
    are the same task on both sides). Returns ``{"metric", "tasks", "delta", "ci_low", "ci_high",
    "resamples", "seed"}``; the interval is None with fewer than 2 common tasks."""
    import numpy as np

    bg, cg = _groups(base), _groups(cand)
    diffs = []
    for t in sorted(set(bg) & set(cg)):
        if tasks is not None and t not in tasks:
            continue
        b, c = numeric(bg[t].get("mean/reward")), numeric(cg[t].get("mean/reward"))
        if b is not None and c is not None:
            diffs.append(c - b)
    out: dict[str, Any] = {
        "metric": "mean/reward",
        "method": "bootstrap over common tasks of per-task mean differences",
        "tasks": len(diffs),
        "delta": float(np.mean(diffs)) if diffs else None,
        "ci_low": None,
        "ci_high": None,
        "resamples": resamples,
        "seed": seed,
    }
    if len(diffs) >= 2:
        d = np.asarray(diffs, dtype=float)
        rng = np.random.default_rng(seed)
        means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
        low, high = np.percentile(means, [2.5, 97.5])
        out["ci_low"], out["ci_high"] = float(low), float(high)
    return out


def _tighter(paired: dict[str, Any], row: dict[str, Any] | None, index: int) -> dict[str, Any]:
    cand = row["candidates"][index] if row else None
    welch_width = (cand["delta_ci_high"] - cand["delta_ci_low"]) if cand and cand["delta_ci_low"] is not None else None
    paired_width = (paired["ci_high"] - paired["ci_low"]) if paired["ci_low"] is not None else None
    if welch_width is None or paired_width is None:
        tighter = None
    else:
        tighter = "paired" if paired_width < welch_width else "welch" if welch_width < paired_width else "equal"
    return {**paired, "width": paired_width, "welch_width": welch_width, "tighter": tighter}


def _matched(baseline: Side, candidate: Side) -> set[int] | None:
    """The task indices that are the same task on both sides (``compare.matched_tasks``) when both
    are stored runs; None (every common index) for a file side."""
    if baseline.run is None or candidate.run is None:
        return None
    from rollouts.evaluation.compare import matched_tasks

    return matched_tasks(baseline.run, candidate.run)


def _only(entry: dict[str, Any], tasks: set[int]) -> dict[str, Any]:
    groups = [g for g in entry.get("group_level_metrics") or [] if g.get(TASK_INDEX_KEY_NAME) in tasks]
    return {**entry, "group_level_metrics": groups}


def _matched_fields(base: dict[str, Any], cand: dict[str, Any], index: int, tasks: set[int] | None) -> dict[str, Any]:
    """gymweb's additions beside the paired interval: ``matched_only`` (whether only matched tasks
    were used), ``paired_by_index`` (tasks NeMo Gym's flips pair by ``_ng_task_index``) and
    ``matched_flips`` (NeMo Gym's flip summary over the matched tasks alone; None for file sides)."""
    common = set(_groups(base)) & set(_groups(cand))
    if tasks is None:
        return {"matched_only": False, "paired_by_index": len(common), "matched_flips": None}
    return {
        "matched_only": True,
        "paired_by_index": len(common),
        "matched_flips": flip_summary(_only(base, tasks), _only(cand, tasks), index),
    }


# -- the report --------------------------------------------------------------------------------------
def _pick_agents(
    baseline: Side, candidates: list[Side], baseline_agent: str | None, candidate_agents: list[str] | None
) -> None:
    """NeMo Gym's ``--baseline-agent``/``--candidate-agents``: compare one named agent of each side
    (in ``--candidates`` order), whatever their names; each side keeps only that entry."""
    if candidate_agents is not None and len(candidate_agents) != len(candidates):
        raise CompareError(
            f"--candidate-agents names {len(candidate_agents)} agent(s) for {len(candidates)} candidate(s)"
        )
    names = [baseline_agent, *(candidate_agents or [None] * len(candidates))]
    sides = [baseline, *candidates]
    for s, name in zip(sides, names):
        if name is None:
            if len(s.entries) != 1:
                raise CompareError(
                    f"{s.aggregate_metrics_fpath} holds several agents ({', '.join(sorted(s.entries))}): "
                    "name one with --baseline-agent/--candidate-agents"
                )
        elif name not in s.entries:
            raise CompareError(
                f"agent '{name}' is not in {s.aggregate_metrics_fpath}; available: {', '.join(sorted(s.entries))}"
            )
    chosen = [name or next(iter(s.entries)) for s, name in zip(sides, names)]
    for s, name in zip(sides, chosen):
        s.entries = {chosen[0]: {**s.entries[name], "_gymweb_agent": name}}


def _agent_selection(baseline: Side, candidates: list[Side], agent: str | None) -> tuple[list[str], list[str], dict]:
    if agent:
        for s in (baseline, *candidates):
            if agent not in s.entries:
                raise CompareError(
                    f"agent '{agent}' is not in {s.aggregate_metrics_fpath}; available: {', '.join(sorted(s.entries))}"
                )
        return [agent], [], {}
    # A stored run is one agent under the run's agent name: pair it with the other side's only agent.
    sides = [baseline, *candidates]
    if all(len(s.entries) == 1 for s in sides):
        names = [next(iter(s.entries)) for s in sides]
        if len(set(names)) > 1:
            for s, name in zip(sides, names):
                s.entries = {names[0]: {**s.entries[name], "_gymweb_agent": name}}
        return [names[0]], [], {}
    matched = set(baseline.entries)
    for s in candidates:
        matched &= set(s.entries)
    if not matched:
        raise CompareError(
            "no agent name is present in every run: "
            + "; ".join(f"{s.label}: {', '.join(sorted(s.entries))}" for s in sides)
            + " (give --agent-name)"
        )
    notes, skipped = [], {}
    for s in sides:
        extras = sorted(set(s.entries) - matched)
        if extras:
            label = f"candidate[{s.index}]" if s.role == "candidate" else s.role
            skipped[label] = extras
            notes.append(f"Agent(s) {', '.join(extras)} are present only in {label} and were not compared.")
    return sorted(matched), notes, skipped


def _num_repeats(entry: dict[str, Any]) -> int | None:
    expected = [
        g["expected_num_rollouts"]
        for g in entry.get("group_level_metrics") or []
        if isinstance(g.get("expected_num_rollouts"), int) and not isinstance(g.get("expected_num_rollouts"), bool)
    ]
    if expected:
        return max(expected)
    return len(entry["repeat_level_metrics"]) if entry.get("repeat_level_metrics") else None


def _agent_comparison(base: dict[str, Any], cands: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    rows = _metric_rows(base, cands)
    if not any(r["baseline"] is not None and any(r["candidates"]) for r in rows):
        raise CompareError(
            "baseline and candidate share no metric keys, so there is nothing to compare "
            "(runs collected with different --num-repeats produce different pass@k names)"
        )
    notes = []
    base_repeats = _num_repeats(base)
    cand_repeats = [_num_repeats(c) for c in cands]
    if base_repeats is not None and any(n is not None and n != base_repeats for n in cand_repeats):
        notes.append(
            f"Repeat counts differ (baseline {base_repeats}, candidate {', '.join(str(n) for n in cand_repeats)}). "
            "Metric names that embed k (e.g. pass@1[avg-of-k]) will not line up across the runs."
        )
    has_cis = lambda e: any(k.startswith("ci_low_95_across_repeats/") for k in e.get("agent_metrics") or {})  # noqa: E731
    if not has_cis(base) and not any(has_cis(c) for c in cands):
        notes.append(
            "Neither run recorded per-run cross-repeat confidence intervals, so every baseline/candidate "
            "CI cell is empty. They are written for repeat-aggregated metrics when a run has 2 or more repeats."
        )
    one_sided = [r["metric"] for r in rows if len(r["present_in"]) < 1 + len(cands)]
    if one_sided:
        notes.append(f"{len(one_sided)} metric(s) were reported by only one of the runs.")
    agent_names = lambda e: e.get("_gymweb_agent", agent)  # noqa: E731
    return {
        "baseline_agent": agent_names(base),
        "candidate_agents": [agent_names(c) for c in cands],
        "baseline_task_count": len(base.get("group_level_metrics") or []),
        "candidate_task_counts": [len(c.get("group_level_metrics") or []) for c in cands],
        "baseline_repeat_count": base_repeats,
        "candidate_repeat_counts": cand_repeats,
        "metrics": rows,
        "flips": [flip_summary(base, c, i) for i, c in enumerate(cands)],
        "notes": notes,
    }


def compare_sides(
    baseline: Side,
    candidates: list[Side],
    *,
    command: str = "",
    agent: str | None = None,
    baseline_agent: str | None = None,
    candidate_agents: list[str] | None = None,
) -> dict[str, Any]:
    """The ``compare_report.json`` object (NeMo Gym's schema, version "1") for a baseline and 1 to
    ``MAX_CANDIDATES`` candidates, plus gymweb's ``gymweb`` key: per agent and candidate the paired
    interval of ``mean/reward`` and which interval is tighter. ``agent``: the one agent on every
    side; ``baseline_agent``/``candidate_agents``: a named agent per side (NeMo Gym's flags). Raises
    ``CompareError``."""
    if not 1 <= len(candidates) <= MAX_CANDIDATES:
        raise CompareError(f"give 1 to {MAX_CANDIDATES} candidates (got {len(candidates)})")
    if baseline_agent is not None or candidate_agents is not None:
        if agent:
            raise CompareError("give --agent-name, or --baseline-agent/--candidate-agents, not both")
        _pick_agents(baseline, candidates, baseline_agent, candidate_agents)
    agents, warns, skipped = _agent_selection(baseline, candidates, agent)
    matched = [_matched(baseline, s) for s in candidates]
    comparisons, paired = [], []
    for name in agents:
        base = baseline.entries[name]
        cands = [s.entries[name] for s in candidates]
        comparison = _agent_comparison(base, cands, name)
        comparisons.append(comparison)
        reward_row = next((r for r in comparison["metrics"] if r["metric"] == "mean/reward"), None)
        paired.append(
            {
                "agent": comparison["baseline_agent"],
                "candidates": [
                    {
                        **_tighter(paired_bootstrap(base, c, tasks=matched[i]), reward_row, i),
                        **_matched_fields(base, c, i, matched[i]),
                    }
                    for i, c in enumerate(cands)
                ],
            }
        )
    return {
        "schema_version": "1",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "nemo_gym_version": NEMO_GYM_SCHEMA_VERSION,
        "command": command,
        "baseline": baseline.run_file(),
        "candidates": [s.run_file() for s in candidates],
        "comparisons": comparisons,
        "skipped_agents": skipped,
        "warnings": warns,
        "gymweb": {
            "generator": "gymweb",
            "paired_intervals": paired,
            "runs": {
                "baseline": baseline.run.pk if baseline.run else None,
                "candidates": [s.run.pk if s.run else None for s in candidates],
            },
        },
    }
