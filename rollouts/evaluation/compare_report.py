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
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollouts.models import Run
from rollouts.nemo.jsonl import JsonlError, iter_objects
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.nemo.metrics_config import is_primary_metric

__all__ = [
    "CompareError",
    "Side",
    "aggregate_entry_from_rows",
    "compare_sides",
    "flip_summary",
    "paired_bootstrap",
    "render_markdown",
    "resolve_side",
    "run_entries",
    "side_from_run",
    "welch_delta_interval",
    "write_compare_report",
]

NEMO_GYM_SCHEMA_VERSION = "0.7.0"
MAX_CANDIDATES = 4
MAX_FLIPS_SHOWN = 10
PASS_THRESHOLD = 0.5
PAIRED_BOOTSTRAP_RESAMPLES = 10_000
PAIRED_BOOTSTRAP_SEED = 0
MISSING = "—"
COMPARE_MD = "compare_report.md"
COMPARE_JSON = "compare_report.json"


class CompareError(JsonlError):
    """The sides cannot be compared (missing metrics file, no common agent or metric...); the
    message says what and where."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numeric(v: Any) -> float | None:
    return float(v) if _is_number(v) else None


@dataclass
class Side:
    """One run of a comparison. ``entries``: its aggregate-metrics entries by agent name;
    ``run``: the stored run, when it is one; paths as the report shows them."""

    role: str
    index: int
    rollouts_jsonl_fpath: str
    aggregate_metrics_fpath: str
    label: str
    entries: dict[str, dict[str, Any]]
    run: Run | None = None

    def run_file(self) -> dict[str, Any]:
        """NeMo Gym's ``RunFile`` as the report writes it."""
        return {
            "role": self.role,
            "index": self.index,
            "rollouts_jsonl_fpath": self.rollouts_jsonl_fpath,
            "aggregate_metrics_fpath": self.aggregate_metrics_fpath,
            "label": self.label,
            "agent_names": sorted(self.entries),
        }


def aggregate_entry_from_rows(rows: Iterable[Any], agent_name: str) -> dict[str, Any]:
    """An aggregate-metrics entry computed from success rows (dicts with the indices, ``reward`` and
    ``response``, or ``reward_profile.ReducedRollout``), as NeMo Gym's ``compute_aggregate_metrics`` does it
    for an env without its own metrics: every row grouped under one synthetic agent, key metrics =
    the ``mean/`` metrics. Raises ``CompareError`` when there are no rows."""
    from rollouts.evaluation.reward_profile import ReducedRollout, profile_rows

    rows = list(rows)
    if not rows:
        raise CompareError(f"agent {agent_name!r} has no successful rollouts: nothing to compare")
    synthetic: list[dict[str, Any]] = []
    filled: list[Any] = []  # ReducedRollout or row mappings, as profile_rows takes them
    for r in rows:
        if isinstance(r, ReducedRollout):
            synthetic.append(
                {
                    TASK_INDEX_KEY_NAME: r.task_index,
                    ROLLOUT_INDEX_KEY_NAME: r.rollout_index,
                    "agent_ref": {"name": "agent"},
                }
            )
            filled.append(r)
        else:
            synthetic.append(
                {
                    TASK_INDEX_KEY_NAME: r.get(TASK_INDEX_KEY_NAME, 0),
                    ROLLOUT_INDEX_KEY_NAME: r.get(ROLLOUT_INDEX_KEY_NAME, 0),
                    "agent_ref": {"name": "agent"},
                }
            )
            filled.append(r if "response" in r else {**r, "response": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NeMo Gym's collapsed-interval notes are not news here
        result = profile_rows(synthetic, filled)
    agent = {k: v for e in result.agent_metrics for k, v in e.items() if k != "agent_ref"}
    agent["num_repeats"] = len({s[ROLLOUT_INDEX_KEY_NAME] for s in synthetic})
    return {
        "agent_ref": {"name": agent_name},
        "agent_metrics": agent,
        "key_metrics": {k: v for k, v in agent.items() if k.startswith("mean/")},
        "group_level_metrics": result.reward_profiling,
        "repeat_level_metrics": [{k: v for k, v in e.items() if k != "agent_ref"} for e in result.repeat_level_metrics],
    }


def _env_entry(run: Run) -> dict[str, Any] | None:
    data = run.aggregate_metrics
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and all(
        isinstance(data.get(k), (dict, list)) for k in ("agent_metrics", "group_level_metrics", "repeat_level_metrics")
    ):
        return data
    return None


def run_entries(run: Run) -> dict[str, dict[str, Any]]:
    """A stored run's aggregate-metrics entries by agent name (one: the run's agent), from its env's
    reply or computed (see the section comment). Raises ``CompareError`` when it has no successes."""
    from rollouts.evaluation.profile_report import run_success_rows

    entry = _env_entry(run)
    if entry is None:
        entry = {**aggregate_entry_from_rows(run_success_rows(run), run.agent_name), "_gymweb_source": "computed"}
    else:
        entry = {"agent_ref": {"name": run.agent_name}, **{k: v for k, v in entry.items() if k != "agent_ref"}}
    return {run.agent_name: entry}


def side_from_run(run: Run, role: str, index: int = 0, entries: dict[str, dict[str, Any]] | None = None) -> Side:
    """A stored run as one side (``entries``: ``run_entries(run)`` when already at hand)."""
    entries = entries if entries is not None else run_entries(run)
    computed = any(e.get("_gymweb_source") == "computed" for e in entries.values())
    how = "computed by gymweb from the success rows" if computed else "the env's /aggregate_metrics reply"
    return Side(
        role=role,
        index=index,
        rollouts_jsonl_fpath=run.source_file or f"gymweb run #{run.pk}",
        aggregate_metrics_fpath=f"gymweb run #{run.pk} ({how})",
        label=f"run #{run.pk} {run.name}"[:200],
        entries={name: {k: v for k, v in e.items() if k != "_gymweb_source"} for name, e in entries.items()},
        run=run,
    )


def aggregate_metrics_path_for(rollouts_path: Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_aggregate_metrics.json`` (NeMo Gym's rule)."""
    return rollouts_path.with_stem(rollouts_path.stem + "_aggregate_metrics").with_suffix(".json")


def side_from_file(path: str | Path, role: str, index: int = 0, metrics: str | Path | None = None) -> Side:
    """A NeMo Gym run as one side, from its ``rollouts.jsonl`` path: its aggregate-metrics file
    (``metrics``, NeMo Gym's ``--baseline-agg-metrics``/``--candidates-agg-metrics``, else the
    ``*_aggregate_metrics.json`` sibling), or, when there is none, the entry computed from the
    rollouts file (NeMo Gym stops there; gymweb computes what ``gym eval aggregate`` would). Raises
    ``CompareError``."""
    p = Path(path).expanduser()
    metrics_path = Path(metrics).expanduser() if metrics else aggregate_metrics_path_for(p)
    if metrics and not metrics_path.is_file():
        raise CompareError(f"{metrics_path}: no such aggregate-metrics file")
    if metrics_path.is_file():
        try:
            payload = json.loads(metrics_path.read_bytes())
        except ValueError as exc:
            raise CompareError(f"'{metrics_path}' is not valid JSON: {exc}") from None
        if not isinstance(payload, list) or not payload:
            raise CompareError(
                f"'{metrics_path}' is not an aggregate-metrics file "
                "(expected a non-empty JSON list of per-agent entries)"
            )
        entries: dict[str, dict[str, Any]] = {}
        for position, entry in enumerate(payload):
            name = (entry.get("agent_ref") or {}).get("name") if isinstance(entry, dict) else None
            if not name:
                raise CompareError(f"'{metrics_path}' entry {position} has no `agent_ref.name`")
            if name in entries:
                raise CompareError(f"'{metrics_path}' contains two entries for agent '{name}'")
            if "repeat_level_metrics" not in entry:
                rows = [i for g in entry.get("group_level_metrics", []) for i in g.get("rollout_infos", [])]
                computed = aggregate_entry_from_rows(rows, name)
                entry = {
                    **entry,
                    "agent_metrics": {**computed["agent_metrics"], **(entry.get("agent_metrics") or {})},
                    "repeat_level_metrics": computed["repeat_level_metrics"],
                }
            entries[name] = entry
        shown = str(metrics_path)
    elif p.is_file():
        by_agent: dict[str, list[dict]] = defaultdict(list)
        for row in _rows_of(p):
            ref = row.get("agent_ref")
            by_agent[ref.get("name") if isinstance(ref, dict) and isinstance(ref.get("name"), str) else "agent"].append(
                row
            )
        entries = {name: aggregate_entry_from_rows(rows, name) for name, rows in by_agent.items()}
        if not entries:
            raise CompareError(f"{p}: no rows")
        shown = f"{metrics_path} (absent: computed by gymweb from {p.name})"
    else:
        raise CompareError(f"{p}: no such file (and no {metrics_path.name} beside it)")
    return Side(
        role=role,
        index=index,
        rollouts_jsonl_fpath=str(p),
        aggregate_metrics_fpath=shown,
        label=p.parent.name or p.stem,
        entries=entries,
    )


def _rows_of(path: Path) -> Iterator[dict]:
    """The JSON objects of a ``rollouts.jsonl`` side, one per non-blank line. Raises
    ``CompareError`` naming the file and line for text that is not UTF-8, a line that is not JSON
    or not an object (a ``*_aggregate_metrics.json`` or a stray file given as a side). A UTF-8 byte
    order mark before the first line is skipped, as ``import_rollouts`` skips it."""
    for _number, _line, row in iter_objects(
        path,
        error=CompareError,
        not_object="a rollout row must be a JSON object",
        hint="; give a rollouts.jsonl or a run id",
    ):
        yield row


def resolve_side(spec: str | int | Run, role: str, index: int = 0, metrics: str | Path | None = None) -> Side:
    """A side from a run id (digits), a ``Run``, or a path to a ``rollouts.jsonl`` (with
    ``metrics``: its aggregate-metrics file when it is not the sibling; not for a run)."""
    if isinstance(spec, Run):
        run: Run | None = spec
    else:
        text = str(spec).strip()
        run = None
        if text.isdigit() and not Path(text).exists():
            run = Run.objects.filter(pk=int(text)).first()
            if run is None:
                raise CompareError(f"no run #{text}")
    if run is not None:
        if metrics:
            raise CompareError(
                f"an aggregate-metrics file goes with a rollouts.jsonl, not with run #{run.pk} (it has its own)"
            )
        return side_from_run(run, role, index)
    return side_from_file(text, role, index, metrics)


# -- metric rows -----------------------------------------------------------------------------------
def _metric_value(metrics: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = _numeric(metrics.get(name))
    if value is None:
        return None
    return {
        "value": value,
        "ci_low": _numeric(metrics.get(f"ci_low_95_across_repeats/{name}")),
        "ci_high": _numeric(metrics.get(f"ci_high_95_across_repeats/{name}")),
        "se_across_repeats": _numeric(metrics.get(f"se_across_repeats/{name}")),
        "mean_across_repeats": _numeric(metrics.get(f"mean_across_repeats/{name}")),
        "std_err_across_runs": _numeric(metrics.get(f"{name}/std_err_across_runs")),
    }


def _point(value: dict[str, Any]) -> float:
    return value["mean_across_repeats"] if value["mean_across_repeats"] is not None else value["value"]


def _repeat_values(entry: dict[str, Any], name: str) -> list[float]:
    values = [_numeric(e.get(name)) for e in entry.get("repeat_level_metrics") or [] if isinstance(e, dict)]
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
    if any(_numeric((e.get("agent_metrics") or {}).get(f"mean_across_repeats/{name}")) is None for e in (base, cand)):
        return None, None
    return welch_delta_interval(_repeat_values(base, name), _repeat_values(cand, name))


def _metric_rows(base: dict[str, Any], cands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base_metrics = {**(base.get("key_metrics") or {}), **(base.get("agent_metrics") or {})}
    cand_metrics = [{**(c.get("key_metrics") or {}), **(c.get("agent_metrics") or {})} for c in cands]
    key_names = set(base.get("key_metrics") or {}) | {n for c in cands for n in (c.get("key_metrics") or {})}
    names = [n for n in base_metrics if _is_number(base_metrics[n])]
    seen = set(names)
    for m in cand_metrics:
        for n in m:
            if n not in seen and _is_number(m[n]):
                names.append(n)
                seen.add(n)
    rows = []
    for name in names:
        if not is_primary_metric(name):
            continue
        b = _metric_value(base_metrics, name)
        b_point = _point(b) if b else None
        candidates: list[dict[str, Any] | None] = []
        for c_entry, metrics in zip(cands, cand_metrics):
            c = _metric_value(metrics, name)
            if c is None:
                candidates.append(None)
                continue
            low, high = _welch(base, c_entry, name) if b else (None, None)
            value = _point(c)
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
    rewards = [_numeric(i.get("reward")) for i in sorted(infos, key=lambda i: i.get(ROLLOUT_INDEX_KEY_NAME, 0))]
    return None if any(r is None for r in rewards) else rewards


def _looks_binary(common: list, bg: dict, cg: dict) -> bool:
    for t in common:
        for groups in (bg, cg):
            g = groups[t]
            observed = [v for v in (g.get("min/reward"), g.get("max/reward")) if v is not None] or [
                g.get("mean/reward")
            ]
            for v in observed:
                n = _numeric(v)
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
    scored = [(t, _numeric(bg[t].get("mean/reward")), _numeric(cg[t].get("mean/reward"))) for t in common]
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
) -> dict[str, Any]:
    """The paired 95% bootstrap interval of the candidate-minus-baseline ``mean/reward`` over the
    common tasks (see the section comment). Returns ``{"metric", "tasks", "delta", "ci_low",
    "ci_high", "resamples", "seed"}``; the interval is None with fewer than 2 common tasks."""
    import numpy as np

    bg, cg = _groups(base), _groups(cand)
    diffs = []
    for t in sorted(set(bg) & set(cg)):
        b, c = _numeric(bg[t].get("mean/reward")), _numeric(cg[t].get("mean/reward"))
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
                "candidates": [_tighter(paired_bootstrap(base, c), reward_row, i) for i, c in enumerate(cands)],
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


# -- markdown (NeMo Gym's layout) ---------------------------------------------------------------------
CI_FOOTNOTE = (
    "Displayed baseline/candidate values and each delta use `mean_across_repeats/<metric>` when recorded, "
    "otherwise the metric value. Delta CI = two-sided independent-sample 95% Welch t-interval for candidate minus "
    "baseline, computed from the named metric's values in each run's `repeat_level_metrics`. "
    f"`{MISSING}` means the required interval data was unavailable: delta intervals require at least 2 finite "
    "repeat-level values on each side. Baseline/candidate CI = 95% t-interval of the per-repeat mean across repeats, "
    "read verbatim from `ci_{low,high}_95_across_repeats/<metric>` in `*_aggregate_metrics.json`."
)


def _f(v: float | None) -> str:
    return MISSING if v is None else f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"


def _fs(v: float | None) -> str:
    return MISSING if v is None else f"{v:+.4f}" if abs(v) < 10 else f"{v:+.2f}"


def _fpoint(v: dict | None) -> str:
    return _f(_point(v)) if v is not None else MISSING


def _fci(v: dict | None) -> str:
    return (
        MISSING
        if v is None or v["ci_low"] is None or v["ci_high"] is None
        else f"[{_f(v['ci_low'])}, {_f(v['ci_high'])}]"
    )


def _fdelta(c: dict | None) -> str:
    if c is None or c["delta"] is None:
        return MISSING
    return f"{_fs(c['delta'])} (n/a)" if c["delta_pct"] is None else f"{_fs(c['delta'])} ({c['delta_pct']:+.1f}%)"


def _fdelta_ci(c: dict | None) -> str:
    return (
        MISSING
        if c is None or c["delta_ci_low"] is None or c["delta_ci_high"] is None
        else f"[{_fs(c['delta_ci_low'])}, {_fs(c['delta_ci_high'])}]"
    )


def _table(header: list[str], align: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def _metric_table(rows: list[dict[str, Any]], labels: list[str]) -> list[str]:
    header, align = (
        ["Metric", "Δ (cand − base)", "95% CI for Δ (cand − base)", "Baseline", "Baseline 95% CI"],
        ["---", "---:", "---", "---:", "---"],
    )
    for label in labels:
        header += [label, f"{label} 95% CI"]
        align += ["---:", "---"]
    body = []
    for r in rows:
        cells = [
            f"`{r['metric']}`",
            " / ".join(_fdelta(c) for c in r["candidates"]),
            " / ".join(_fdelta_ci(c) for c in r["candidates"]),
            _fpoint(r["baseline"]),
            _fci(r["baseline"]),
        ]
        for c in r["candidates"]:
            cells += [_fpoint(c), _fci(c)]
        body.append(cells)
    return _table(header, align, body)


def _runs_section(report: dict[str, Any], comp: dict[str, Any], labels: list[str]) -> list[str]:
    """The run table, the generator line and the command."""
    b, cands = report["baseline"], report["candidates"]
    rows = [
        ["Run", f"`{b['label']}`", *[f"`{c['label']}`" for c in cands]],
        ["Rollouts", f"`{b['rollouts_jsonl_fpath']}`", *[f"`{c['rollouts_jsonl_fpath']}`" for c in cands]],
        [
            "Aggregate metrics",
            f"`{b['aggregate_metrics_fpath']}`",
            *[f"`{c['aggregate_metrics_fpath']}`" for c in cands],
        ],
        ["Agent", f"`{comp['baseline_agent']}`", *[f"`{a}`" for a in comp["candidate_agents"]]],
        ["Tasks", str(comp["baseline_task_count"]), *[str(n) for n in comp["candidate_task_counts"]]],
        [
            "Repeats",
            str(comp["baseline_repeat_count"] if comp["baseline_repeat_count"] is not None else "unknown"),
            *[str(n if n is not None else "unknown") for n in comp["candidate_repeat_counts"]],
        ],
    ]
    return [
        *_table(["", "Baseline", *labels], ["---"] * (2 + len(labels)), rows),
        "",
        f"Generated {report['generated_at']} by gymweb (NeMo Gym {report['nemo_gym_version']}'s compare).",
        "",
        f"Command: `{report['command']}`",
        "",
    ]


def _metrics_section(comp: dict[str, Any], labels: list[str]) -> list[str]:
    """Key metrics, then the other metrics folded."""
    key_rows = [r for r in comp["metrics"] if r["is_key_metric"]]
    other_rows = [r for r in comp["metrics"] if not r["is_key_metric"]]
    lines = ["### Key metrics", ""]
    lines += _metric_table(key_rows, labels) if key_rows else ["No key metrics were recorded for this agent."]
    lines += ["", CI_FOOTNOTE, ""]
    if other_rows:
        lines += [
            "<details>",
            f"<summary>All other metrics ({len(other_rows)} rows)</summary>",
            "",
            *_metric_table(other_rows, labels),
            "",
            "</details>",
            "",
        ]
    return lines


def _flip_counts(s: dict[str, Any]) -> list[str]:
    """The lines above a flip table: the field and the counts, per mode."""
    if s["mode"] == "binary":
        return [
            f"Field: `{s['field']}` (task mean over its repeats). A task passes when its mean is above 0.5.",
            "",
            f"**{s['common_task_count']} common tasks · {s['pass_to_fail_count']} pass→fail · "
            f"{s['fail_to_pass_count']} fail→pass · net {s['net']:+d} · {s['unchanged_count']} unchanged · "
            f"{s['tied_count']} tied**",
            "",
        ]
    return [
        "Rewards are not binary, so this lists the largest per-task changes in "
        f"`{s['field']}` rather than pass/fail flips.",
        "",
        f"**{s['common_task_count']} common tasks · {len(s['flips'])} changed · {s['unchanged_count']} unchanged**",
        "",
    ]


def _flip_rewards(rewards: list[float] | None) -> str:
    return ", ".join(f"{x:g}" for x in rewards) if rewards else MISSING


def _flip_table(s: dict[str, Any]) -> list[str]:
    """At most ``MAX_FLIPS_SHOWN`` flips per direction, and how many more the JSON holds."""
    shown: list[dict[str, Any]] = []
    per: dict[str, int] = {}
    for f in s["flips"]:
        if per.get(f["direction"], 0) < MAX_FLIPS_SHOWN:
            per[f["direction"]] = per.get(f["direction"], 0) + 1
            shown.append(f)
    if not shown:
        return []
    lines = _table(
        ["Task", "Direction", "Baseline", "Candidate", "Δ", "Baseline per-repeat", "Candidate per-repeat"],
        ["---:", "---", "---:", "---:", "---:", "---", "---"],
        [
            [
                str(f["task_index"]),
                f["direction"].replace("_to_", "→"),
                _f(f["baseline_score"]),
                _f(f["candidate_score"]),
                _fs(f["delta"]),
                _flip_rewards(f["baseline_rewards"]),
                _flip_rewards(f["candidate_rewards"]),
            ]
            for f in shown
        ],
    )
    if len(s["flips"]) > len(shown):
        lines += ["", f"… and {len(s['flips']) - len(shown)} more (full list in `compare_report.json`)."]
    lines.append("")
    return lines


def _flips_section(s: dict[str, Any], label: str) -> list[str]:
    """One candidate's sample flips (``label``: which candidate, or empty for one)."""
    lines = [f"### Sample flips{label}", ""]
    if s["mode"] == "unavailable":
        return [*lines, f"Not available: {s['reason']}", ""]
    return [
        *lines,
        *_flip_counts(s),
        *_flip_table(s),
        "Tasks are joined on `_ng_task_index`. `*_aggregate_metrics.json` carries no task identity, so flips are "
        "reported by index only — this assumes both runs used the same dataset, split, `--limit` and ordering.",
        "",
    ]


def _paired_section(paired: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """gymweb's paired interval, one row per candidate."""
    lines = [
        "### Paired interval (gymweb)",
        "",
        f"`mean/reward`: 95% bootstrap interval of the mean per-task difference over the common tasks "
        f"({PAIRED_BOOTSTRAP_RESAMPLES} resamples of tasks, seed {PAIRED_BOOTSTRAP_SEED}). It removes the "
        "between-task variance the Welch interval carries.",
        "",
    ]
    lines += _table(
        ["Candidate", "Tasks", "Δ (paired)", "Paired 95% CI", "Width", "Welch width", "Tighter"],
        ["---", "---:", "---:", "---", "---:", "---:", "---"],
        [
            [
                labels[i],
                str(p["tasks"]),
                _fs(p["delta"]),
                MISSING if p["ci_low"] is None else f"[{_fs(p['ci_low'])}, {_fs(p['ci_high'])}]",
                _f(p["width"]),
                _f(p["welch_width"]),
                p["tighter"] or MISSING,
            ]
            for i, p in enumerate(paired)
        ],
    )
    lines.append("")
    return lines


def _one_sided_section(comp: dict[str, Any], candidates: int) -> list[str]:
    """The metrics only some runs reported, and the agent's notes."""
    lines: list[str] = []
    one_sided = [r for r in comp["metrics"] if len(r["present_in"]) < 1 + candidates]
    if one_sided:
        lines += [
            "### Metrics present in only one run",
            "",
            "Metric names embed the repeat count (`pass@1[avg-of-3]` vs `pass@1[avg-of-5]`), so runs collected "
            "with different `--num-repeats` will not line these up.",
            "",
            *(
                f"- `{r['metric']}` — {', '.join(r['present_in']) or 'no numeric value on either side'}"
                for r in one_sided
            ),
            "",
        ]
    if comp["notes"]:
        lines += ["### Notes", "", *(f"- {n}" for n in comp["notes"]), ""]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """``compare_report.md``: NeMo Gym's layout (run table, key metrics, other metrics, flips,
    notes), a column pair per candidate, then gymweb's paired-interval section."""
    cands = report["candidates"]
    labels = ["Candidate"] if len(cands) == 1 else [f"Candidate {i + 1}" for i in range(len(cands))]
    lines = ["# gym eval compare", ""]
    for ci, comp in enumerate(report["comparisons"]):
        if len(report["comparisons"]) > 1:
            lines += [f"## Agent: `{comp['baseline_agent']}`", ""]
        lines += _runs_section(report, comp, labels)
        lines += _metrics_section(comp, labels)
        for index, s in enumerate(comp["flips"]):
            lines += _flips_section(s, f" — {labels[index]}" if len(comp["flips"]) > 1 else "")
        lines += _paired_section(report["gymweb"]["paired_intervals"][ci]["candidates"], labels)
        lines += _one_sided_section(comp, len(cands))
    if report["warnings"]:
        lines += ["## Warnings", "", *(f"- {w}" for w in report["warnings"]), ""]
    lines += [
        "---",
        f"Generated by gymweb in the layout of `gym eval compare` (nemo-gym {report['nemo_gym_version']}). "
        f"Machine-readable output: `{COMPARE_JSON}` (schema_version {report['schema_version']}).",
        "",
    ]
    return "\n".join(lines)


REPORT_FORMATS = ("md", "json", "both")


def write_compare_report(
    report: dict[str, Any], output_dir: str | Path, *, overwrite: bool = False, report_format: str = "both"
) -> list[Path]:
    """Write ``compare_report.md`` and/or ``compare_report.json`` (orjson, 2-space indent, as NeMo
    Gym) into ``output_dir``; ``report_format`` is NeMo Gym's ``--report-format`` (``md``, ``json``,
    ``both``). Raises ``FileExistsError`` when one to write exists and ``overwrite`` is false
    (nothing written then), ``CompareError`` for an unknown format."""
    import orjson

    if report_format not in REPORT_FORMATS:
        raise CompareError(f"--report-format must be one of {', '.join(REPORT_FORMATS)} (got {report_format!r})")
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise CompareError(f"--output-dir '{out}' exists and is not a directory")
    paths = [p for p, fmt in ((out / COMPARE_MD, "md"), (out / COMPARE_JSON, "json")) if report_format in (fmt, "both")]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{', '.join(existing)} already exist(s); pass --overwrite to replace")
    out.mkdir(parents=True, exist_ok=True)
    for p in paths:
        if p.name == COMPARE_MD:
            p.write_text(render_markdown(report), encoding="utf-8")
        else:
            p.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return paths
