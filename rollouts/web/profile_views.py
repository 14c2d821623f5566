"""The profile page: a run's evaluation profile (NeMo Gym's, with gymweb's pass@k), its files, the
env's /aggregate_metrics reply, and the aggregate metrics download.

Everything shown is untrusted text (agent names, env replies): templates only autoescape it,
nothing here marks data safe.

Speed. The profile is NeMo Gym's (``profile_report.profile_run``), which reads each success's stored
numbers (its cost: benchmarks/README.md). The page's view of it is cached under the run's finished
counts (``analysis.run_cached``). The cached value is compact: the small summaries as they are,
each task row pickled on its own (only the shown page of rows is unpickled) and the task order for
every sort precomputed. The profile files are written fresh for every download (exactly
``write_run_profile``'s bytes).
"""

from __future__ import annotations

import math
import pickle
import tempfile
import warnings
from array import array
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from rollouts.downloads import bytes_download
from rollouts.evaluation.aggregate_metrics import aggregate_metrics_bytes, aggregate_metrics_path
from rollouts.evaluation.profile_report import RUN_STEM, profile_run, write_profile
from rollouts.evaluation.reward_profile import COLLAPSED_INTERVAL_NOTE, plain_notes
from rollouts.evaluation.run_aggregate_metrics import run_aggregate_entries
from rollouts.models import Rollout, Run
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.review.query import export_filename
from rollouts.templatetags.gymweb_tags import pretty_json_text
from rollouts.web import charts
from rollouts.web.access import run_for
from rollouts.web.analysis import cell_text, run_cached
from rollouts.web.chart_views import charts_context
from rollouts.web.htmx import vary_on_htmx, wants_partial

PROFILE_FILES = {
    # kind: (file name, content type, what it holds)
    "reward_profiling": (
        f"{RUN_STEM}_reward_profiling.jsonl",
        "application/jsonl",
        "NeMo Gym's per-task profile, one task per line (successes only)",
    ),
    "agent_metrics": (
        f"{RUN_STEM}_agent_metrics.json",
        "application/json",
        "NeMo Gym's agent-level metrics, with the *_across_repeats figures and their 95% intervals",
    ),
    "repeat_level_metrics": (
        f"{RUN_STEM}_repeat_level_metrics.json",
        "application/json",
        "NeMo Gym's per-repeat metrics (one entry per agent and rollout index)",
    ),
    "gymweb_pass_at_k": (
        f"{RUN_STEM}_gymweb_pass_at_k.json",
        "application/json",
        "gymweb's pass@k and pass@1[avg-of-k], failures counted as 0",
    ),
}
TASKS_PER_PAGE = 50
TASK_SORTS = ("task", "-task", "reward", "-reward")
GROUP_ROWS_MAX = 200
GROUP_COLUMNS_MAX = 24
STATS = ("mean", "median", "std", "min", "max")
ACROSS = ("mean", "ci_low_95", "ci_high_95", "se", "std", "median", "min", "max")


def _agent_name(entry: dict) -> str | None:
    ref = entry.get("agent_ref")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


def _sort_key_number(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else math.nan
    )


# -- profile: building the cached view -------------------------------------------------------------
def _field_stats(entry: dict, stats: Iterable[str] = ("mean", "max", "min", "median", "std")) -> list[dict[str, Any]]:
    """``stat/field`` keys of a NeMo Gym profile entry as ``[{"name": field, stat: value, ...}]``,
    reward first, then in the entry's order."""
    fields: dict[str, dict[str, Any]] = {}
    wanted = set(stats)
    for k, v in entry.items():
        head, sep, rest = k.partition("/")
        if sep and head in wanted and rest and "/" not in head:
            fields.setdefault(rest, {"name": rest})[head] = v
    names = sorted(fields, key=lambda n: n != "reward")
    return [fields[n] for n in names]


def _rollout_info(info: dict) -> dict[str, str]:
    """A compact record of one ``rollout_infos`` entry: a short label and a tooltip."""
    index = info.get(ROLLOUT_INDEX_KEY_NAME)
    parts = [f"rollout {index}"]
    parts += [
        f"{k} {cell_text(v)}"
        for k, v in info.items()
        if k not in ("rollout_id", TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)
    ]
    reward = info.get("reward")
    return {
        "label": f"#{index}",
        "reward": cell_text(reward),
        "title": " · ".join(parts),
        "cls": "ok" if reward == 1 else "bad" if reward == 0 else "",
    }


GROUP_ORDER = ("mean", "max", "min", "median", "std")  # NeMo Gym's order in a task row


def _task_raw(prow: dict | None, extra: dict | None, expected: int | None) -> dict[str, Any]:
    """One task of the profile page, raw numbers only (cached; formatted for the shown page by
    ``_task_view``), from NeMo Gym's row (``prow``, None when the task has no success row) and
    gymweb's pass@k entry (``extra``)."""
    source = prow if prow is not None else extra
    fields = [(f["name"], *[f.get(x) for x in GROUP_ORDER]) for f in _field_stats(prow)] if prow is not None else []
    reward = next((f for f in fields if f[0] == "reward"), None)
    n = prow.get("num_rollouts", 0) if prow is not None else 0
    expected = prow.get("expected_num_rollouts", expected) if prow is not None else expected
    keys = int(extra.get("num_rollouts") or 0) if extra is not None else 0
    return {
        "task": source[TASK_INDEX_KEY_NAME],
        "agent": _agent_name(source) or "",
        "n": n,
        "expected": expected,
        "missing": prow.get("missing_num_rollouts")
        if prow is not None
        else (expected - n if expected is not None else None),
        "mean_reward": reward[1] if reward else None,
        "fields": fields,
        "infos": [
            {k: v for k, v in i.items() if k not in ("rollout_id", TASK_INDEX_KEY_NAME)}
            for i in prow.get("rollout_infos") or []
        ]
        if prow is not None
        else [],
        "keys": keys,
        "passes": [(k, extra.get(f"pass@{k}"), extra.get(f"pass@1[avg-of-{k}]")) for k in range(1, keys + 1)],
        "num_passed": extra.get("num_passed") if extra is not None else None,
    }


def _task_view(raw: dict[str, Any]) -> dict[str, Any]:
    """A cached task row formatted for the page (every cell a string)."""
    fields = [{"name": f[0], "cells": [cell_text(v) for v in f[1:]]} for f in raw["fields"]]
    reward = next((f for f in raw["fields"] if f[0] == "reward"), None)
    by_stat = dict(zip(GROUP_ORDER, reward[1:])) if reward else {}
    passes = [(k, cell_text(p), cell_text(avg)) for k, p, avg in raw["passes"]]
    tokens = next((f[1] for f in raw["fields"] if f[0] == "total_tokens"), None)
    return {
        **raw,
        "reward": [cell_text(by_stat.get(x)) for x in STATS] if reward else None,
        "tokens": cell_text(tokens),
        "fields": fields,
        "infos": [_rollout_info(i) for i in raw["infos"]],
        "passes": passes,
        "pass1": passes[0][1] if passes else "—",
        "passk": passes[-1][1] if passes else "—",
        "k": len(passes),
    }


def _agent_tables(entry: dict) -> dict[str, Any]:
    """NeMo Gym's agent metrics entry as table rows: per field its statistics over successes and,
    for ``mean/<field>``, the ``*_across_repeats`` figures with the 95% interval."""
    stats: dict[str, dict[str, Any]] = {}
    across: dict[str, dict[str, Any]] = {}
    other = []
    for k, v in entry.items():
        if k == "agent_ref":
            continue
        head, sep, rest = k.partition("/")
        if head.endswith("_across_repeats") and rest.startswith("mean/"):
            across.setdefault(rest[5:], {})[head[: -len("_across_repeats")]] = v
        elif sep and head in STATS and rest:
            stats.setdefault(rest, {})[head] = v
        else:
            other.append((k, cell_text(v)))
    names = sorted(dict.fromkeys([*stats, *across]), key=lambda n: n != "reward")
    rows = []
    for name in names:
        s, a = stats.get(name, {}), across.get(name)
        row: dict[str, Any] = {"name": name, "cells": [cell_text(s.get(x)) for x in STATS], "across": None}
        if a:
            ci = "—"
            if a.get("ci_low_95") is not None and a.get("ci_high_95") is not None:
                ci = f"[{cell_text(a['ci_low_95'])}, {cell_text(a['ci_high_95'])}]"
            row["across"] = {
                "mean": cell_text(a.get("mean")),
                "ci": ci,
                "se": cell_text(a.get("se")),
                "std": cell_text(a.get("std")),
                "range": f"{cell_text(a.get('min'))} – {cell_text(a.get('max'))}",
            }
        rows.append(row)
    return {"agent": _agent_name(entry) or "", "rows": rows, "other": other, "has_across": bool(across)}


def _repeat_tables(entries: list[dict]) -> list[dict[str, Any]]:
    """NeMo Gym's repeat-level metrics, one table per agent: a row per rollout index with the
    reward's mean, 95% interval, std, quartiles, and the mean of every other field."""
    by_agent: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        by_agent[_agent_name(e) or ""].append(e)
    tables = []
    for agent, rows in by_agent.items():
        others = []
        for e in rows:
            for f in _field_stats(e, ("mean",)):
                if f["name"] != "reward" and f["name"] not in others:
                    others.append(f["name"])
        body = []
        for e in sorted(rows, key=lambda e: e.get(ROLLOUT_INDEX_KEY_NAME, 0)):
            ci = "—"
            if "ci_low_95/reward" in e and "ci_high_95/reward" in e:
                ci = f"[{cell_text(e['ci_low_95/reward'])}, {cell_text(e['ci_high_95/reward'])}]"
            body.append(
                [
                    cell_text(e.get(ROLLOUT_INDEX_KEY_NAME)),
                    cell_text(e.get("sample_count")),
                    cell_text(e.get("missing_count")),
                    cell_text(e.get("mean/reward")),
                    ci,
                    cell_text(e.get("std/reward")),
                    f"{cell_text(e.get('p25/reward'))} – {cell_text(e.get('p75/reward'))}",
                    *[cell_text(e.get(f"mean/{name}")) for name in others],
                ]
            )
        tables.append({"agent": agent, "others": others, "rows": body})
    return tables


def _overall(extras: dict) -> list[dict[str, Any]]:
    """gymweb's overall pass@k per agent: ``[{"agent", "num_tasks", "ks": [(k, pass@k, avg, tasks)]}]``
    with raw numbers (the chart needs them)."""
    out = []
    for entry in extras.get("overall", []):
        ks = sorted(int(key[5:]) for key in entry if key.startswith("pass@") and key[5:].isdigit())
        out.append(
            {
                "agent": _agent_name(entry) or "",
                "num_tasks": entry.get("num_tasks", 0),
                "ks": [
                    (k, entry.get(f"pass@{k}"), entry.get(f"pass@1[avg-of-{k}]"), entry.get(f"num_tasks@{k}"))
                    for k in ks
                ],
            }
        )
    return out


def _keys_per_task(run: Run) -> dict[int, int]:
    """Distinct rollout indices per task (the materialised keys): one grouped query."""
    rows = (
        Rollout.objects.filter(run=run)
        .values("task_index")
        .annotate(n=Count("rollout_index", distinct=True))
        .order_by()
    )
    return {r["task_index"]: r["n"] for r in rows}


def _build_profile(run: Run) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, extras = profile_run(run)
    # NeMo Gym's profiler notes: a collapsed interval (identical values) is routine, missing
    # rollouts are worth a warning.
    notes = [
        {"text": text, "cls": "muted" if text == COLLAPSED_INTERVAL_NOTE else "warn"}
        for text in plain_notes(str(w.message) for w in caught)
    ]
    by_key: dict[tuple[Any, str | None], dict] = {}
    by_task: dict[Any, list[dict]] = defaultdict(list)
    for e in extras.get("per_task", []):
        by_key[(e[TASK_INDEX_KEY_NAME], _agent_name(e))] = e
        by_task[e[TASK_INDEX_KEY_NAME]].append(e)
    used: set[int] = set()
    pairs = []
    for prow in result.reward_profiling:
        task, agent = prow[TASK_INDEX_KEY_NAME], _agent_name(prow)
        extra = by_key.get((task, agent))
        if extra is None and agent is None and len(by_task.get(task, ())) == 1:
            extra = by_task[task][0]
        if extra is not None:
            used.add(id(extra))
        pairs.append((prow, extra))
    unprofiled = [e for e in extras.get("per_task", []) if id(e) not in used]
    expected = _keys_per_task(run) if unprofiled else {}
    pairs += [(None, e) for e in unprofiled]
    rows = [_task_raw(prow, extra, expected.get((prow or extra)[TASK_INDEX_KEY_NAME])) for prow, extra in pairs]
    rows.sort(key=lambda r: (r["task"], r["agent"]))

    n = len(rows)
    by_task_order = array("l", range(n))
    with_reward = [i for i in range(n) if not math.isnan(_sort_key_number(rows[i]["mean_reward"]))]
    without = [i for i in range(n) if math.isnan(_sort_key_number(rows[i]["mean_reward"]))]
    ascending = sorted(with_reward, key=lambda i: (rows[i]["mean_reward"], rows[i]["task"]))
    descending = sorted(with_reward, key=lambda i: (-rows[i]["mean_reward"], rows[i]["task"]))
    orders = {
        "task": by_task_order,
        "-task": array("l", reversed(by_task_order)),
        "reward": array("l", ascending + without),  # tasks without a success row last either way
        "-reward": array("l", descending + without),
    }
    summary = {
        "completion": result.completion_summary,
        "masked": result.masked_rollouts,
        "notes": notes,
        "agents": [_agent_tables(e) for e in result.agent_metrics],
        "repeats": _repeat_tables(result.repeat_level_metrics),
        "overall": _overall(extras),
        "estimator_lines": [f"{k}: {v}" for k, v in (extras.get("estimator") or {}).items()],
        "num_tasks": n,
        "unprofiled": len(unprofiled),
    }
    return {
        "summary": summary,
        "orders": orders,
        "blobs": [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in rows],
    }


def _profile_data(run: Run) -> dict[str, Any]:
    return run_cached("profile", run, lambda: _build_profile(run))


def _pass_at_k_chart(overall: list[dict[str, Any]]) -> charts.LineChart:
    series, dashed = [], []
    several = len(overall) > 1
    for entry in overall:
        prefix = f"{entry['agent']}: " if several else ""
        series.append((f"{prefix}pass@k", [(k, p) for k, p, _, _ in entry["ks"] if p is not None]))
        dashed.append(False)
        series.append((f"{prefix}pass@1[avg-of-k]", [(k, a) for k, _, a, _ in entry["ks"] if a is not None]))
        dashed.append(True)
    return charts.line_chart(
        series,
        id="pass-at-k",
        title="pass@k and pass@1[avg-of-k] by k (failures count as 0)",
        desc="For each k from 1 to the number of rollouts per task: gymweb's pass@k (unbiased estimator) and the mean "
        "reward of the first k rollouts, averaged over the tasks with at least k rollouts.",
        x_label="k",
        y_label="fraction",
        y_range=(0.0, 1.0),
        dashed=dashed,
    )


def _sort_links(base: str, current: str) -> dict[str, dict[str, str]]:
    """Per sortable column: the URL that sorts by it (toggling direction) and its arrow."""
    links = {}
    for column, first in (("task", "task"), ("reward", "-reward")):
        if current == column:
            target, arrow = f"-{column}", "↑"
        elif current == f"-{column}":
            target, arrow = column, "↓"
        else:
            target, arrow = first, ""
        qs = "" if target == "task" else urlencode({"sort": target})
        links[column] = {"url": f"{base}?{qs}" if qs else base, "arrow": arrow}
    return links


# -- profile pages -------------------------------------------------------------------------------
@login_required
@require_safe
def run_profile(request, run_id):
    """NeMo Gym's evaluation profile of a run, gymweb's pass@k, the env's /aggregate_metrics reply,
    and a page of per-task rows (``?sort=task|-task|reward|-reward``, ``?page=N``)."""
    run = run_for(request, run_id)
    data = _profile_data(run)
    sort = request.GET.get("sort") if request.GET.get("sort") in TASK_SORTS else "task"
    page = Paginator(data["orders"][sort], TASKS_PER_PAGE).get_page(request.GET.get("page"))
    run_url = reverse("run", args=[run.pk])
    base = reverse("run_profile", args=[run.pk])
    rows = []
    for i in page.object_list:
        row = _task_view(pickle.loads(data["blobs"][i]))
        row["run_url"] = f"{run_url}?{urlencode({'task': row['task']})}#rollouts"
        rows.append(row)
    context = {
        "run": run,
        "rows": rows,
        "page": page,
        "sort": sort,
        "page_qs": "" if sort == "task" else urlencode({"sort": sort}),
        "sort_links": _sort_links(base, sort),
        "tasks_url": f"{base}?{urlencode({'sort': sort, 'page': page.number})}",
    }
    if wants_partial(request):
        return vary_on_htmx(render(request, "rollouts/partials/profile_tasks.html", context))
    summary = data["summary"]
    context.update(
        {
            "s": summary,
            "pass_chart": _pass_at_k_chart(summary["overall"]),
            "files": [(kind, name, what) for kind, (name, _, what) in PROFILE_FILES.items()],
            "agg": _aggregate_view(run),
            # NeMo Gym writes no aggregate metrics file without successes; the download would be a 404
            "has_successes": Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).exists(),
            **charts_context(run),
        }
    )
    return vary_on_htmx(render(request, "rollouts/profile.html", context))


@login_required
@require_safe
def run_profile_file(request, run_id, kind):
    """One of the four profile files, written now exactly as ``write_run_profile`` writes it."""
    if kind not in PROFILE_FILES:
        raise Http404("unknown profile file")
    run = run_for(request, run_id)
    name, content_type, _ = PROFILE_FILES[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NeMo Gym's notes about missing repeats: the page shows them
        result, extras = profile_run(run)
    with tempfile.TemporaryDirectory(prefix="gymweb-profile-") as tmp:
        paths = write_profile(result, extras, Path(tmp) / RUN_STEM)
        body = next(p for p in paths if p.name == name).read_bytes()
    return bytes_download(body, name, content_type)


@login_required
@require_safe
def run_aggregate_metrics_file(request, run_id):
    """``run-12_rollouts_aggregate_metrics.json``, NeMo Gym's aggregate metrics file of the run
    (what ``gym eval compare`` reads beside ``rollouts.jsonl``; named after the run's
    ``run-12_rollouts.jsonl`` download, so compare finds it beside that): the env's stored reply,
    else computed now with NeMo Gym's default computation; the ``X-Gymweb-Note`` header then says
    so. 404 when the run has no successful rollouts (NeMo Gym writes no file then)."""
    run = run_for(request, run_id)
    entries, notes = run_aggregate_entries(run)
    if not entries:
        raise Http404(notes[0] if notes else "no aggregate metrics")
    name = aggregate_metrics_path(export_filename(run.pk, "rollouts")).name
    response = bytes_download(aggregate_metrics_bytes(entries), name, "application/json")
    if notes:
        # Header values must be one line of latin-1: the notes quote env replies and URLs.
        response["X-Gymweb-Note"] = " ".join("; ".join(notes).split()).encode("ascii", "replace").decode()[:1000]
    return response


# -- the env's /aggregate_metrics reply ----------------------------------------------------------
def _kv_rows(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [(str(k), cell_text(v)) for k, v in value.items()]
    return [("", cell_text(value))]


def _env_agent_table(entry: Any) -> dict[str, Any]:
    """One agent_metrics entry of the env's reply: a field × statistic table when its keys read
    like NeMo Gym's (``mean/reward``), the rest as key/value rows."""
    if not isinstance(entry, dict):
        return {"title": "", "rows": _kv_rows(entry), "matrix": None}
    tables = _agent_tables(entry)
    matrix = tables if tables["rows"] else None
    return {
        "title": _agent_name(entry) or "",
        "matrix": matrix,
        "rows": tables["other"] if matrix else _kv_rows({k: v for k, v in entry.items() if k != "agent_ref"}),
    }


def _aggregate_view(run: Run) -> dict[str, Any]:
    """``run.aggregate_metrics`` ready for tables (every cell a string; templates escape it)."""
    data = run.aggregate_metrics
    view: dict[str, Any] = {"error": run.aggregate_metrics_error, "present": data is not None}
    if data is None:
        return view
    view["raw"] = pretty_json_text(data)[0]
    if not isinstance(data, dict):
        return view
    view["key_metrics"] = _kv_rows(data["key_metrics"]) if "key_metrics" in data else None
    agents = data.get("agent_metrics")
    if agents is not None:
        view["agent_metrics"] = [_env_agent_table(a) for a in (agents if isinstance(agents, list) else [agents])]
    groups = data.get("group_level_metrics")
    if isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups):
        columns = list(dict.fromkeys(k for g in groups for k in g))[:GROUP_COLUMNS_MAX]
        view["groups"] = {
            "columns": columns,
            "rows": [[cell_text(g.get(c)) if c in g else "" for c in columns] for g in groups[:GROUP_ROWS_MAX]],
            "count": len(groups),
            "truncated": len(groups) > GROUP_ROWS_MAX,
            "more_columns": len(dict.fromkeys(k for g in groups for k in g)) > GROUP_COLUMNS_MAX,
        }
    elif groups is not None:
        view["groups"] = {
            "json": pretty_json_text(groups)[0],
            "count": len(groups) if isinstance(groups, (list, dict)) else 1,
        }
    view["other_keys"] = [k for k in data if k not in ("key_metrics", "agent_metrics", "group_level_metrics")]
    return view
