"""The compare report's two files: ``compare_report.md`` in NeMo Gym's layout (run table, key
metrics, other metrics, flips, notes, then gymweb's paired-interval section) and
``compare_report.json`` (orjson, 2-space indent, as NeMo Gym writes it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollouts.evaluation.compare_report import (
    COMPARE_JSON,
    COMPARE_MD,
    MAX_FLIPS_SHOWN,
    PAIRED_BOOTSTRAP_RESAMPLES,
    PAIRED_BOOTSTRAP_SEED,
    metric_point,
)
from rollouts.evaluation.compare_sides import CompareError

__all__ = [
    "REPORT_FORMATS",
    "render_markdown",
    "write_compare_report",
]

MISSING = "—"
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
    return _f(metric_point(v)) if v is not None else MISSING


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
    if any(p.get("matched_only") for p in paired):
        lines += [
            "Between stored runs only the matched tasks count (same task index and matching task rows); "
            "NeMo Gym's flips above pair tasks by `_ng_task_index` alone.",
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
