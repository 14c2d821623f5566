"""Analysis pages: a run's evaluation profile and its files, the run comparison with side-by-side
trajectories, the run page's charts, and the agent conformance check.

Plain function views. Access goes through ``_run_for`` (every signed-in user sees every run, as on
the run pages). Everything shown is untrusted text (run names, agent names, failure kinds, env
replies, agent replies): templates only autoescape it, charts are drawn from numbers
(``rollouts.web.charts``), nothing here marks data safe.

Speed. The profile is NeMo Gym's (``profile_report.profile_run``), which reads each success's stored numbers
(its cost: benchmarks/README.md). Finished rows never change, so the page's view of it is cached under
the run's succeeded and failed attempt counts (like ``metrics``; ``GYMWEB_SUMMARY_CACHE_S``, 0
turns caching off). The cached value is compact: the small summaries as they are, each task row
pickled on its own (only the shown page of rows is unpickled) and the task order for every sort
precomputed. The charts' SQL aggregates are cached the same way. The profile files are written
fresh for every download (exactly ``write_run_profile``'s bytes).
"""

from __future__ import annotations

import json
import math
import pickle
import tempfile
import warnings
from array import array
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.paginator import Paginator
from django.db.models import Avg, Case, Count, IntegerField, Max, Min, Value, When
from django.db.models.functions import TruncDay, TruncHour, TruncMinute, TruncSecond
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_safe

from rollouts import targets
from rollouts.collection import environments
from rollouts.engine.loop import InvalidBaseURL
from rollouts.evaluation import compare_report as nemo_compare
from rollouts.evaluation.aggregate_metrics import aggregate_metrics_bytes, aggregate_metrics_path
from rollouts.evaluation.compare import compare_runs, pick_pair
from rollouts.evaluation.conformance import DEFAULT_SLOW_S, check_agent_sync
from rollouts.evaluation.profile_report import RUN_STEM, profile_run, write_profile
from rollouts.evaluation.run_aggregate_metrics import run_aggregate_entries
from rollouts.models import AgentCall, Rollout, Run
from rollouts.templatetags.gymweb_tags import num, pretty_json_text
from rollouts.web import charts
from rollouts.web.forms import clean_agent_url, export_filename
from rollouts.web.htmx import vary_on_htmx, wants_partial
from rollouts.web.trajectory_views import _task_input, _timeline, item_url_base

S = Rollout.Status
FINISHED = (S.SUCCEEDED, S.FAILED)

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
COMPARE_ROWS_PER_PAGE = 100
COMPARE_SHOWS = ("all", "regressions", "improvements", "unchanged", "unfinished", "mismatched")
COMPARE_TOP = 10
COMPARE_FLIPS_SHOWN = 50
INDEX_LIST_MAX = 200
GROUP_ROWS_MAX = 200
GROUP_COLUMNS_MAX = 24
CHECK_TIMEOUT_MAX_S = 60.0
CHECK_TIMEOUT_DEFAULT_S = 20.0
STATS = ("mean", "median", "std", "min", "max")
ACROSS = ("mean", "ci_low_95", "ci_high_95", "se", "std", "median", "min", "max")


# -- helpers -------------------------------------------------------------------------------------
def _run_for(request, run_id: int) -> Run:
    """The run, if this user may see it (every signed-in user may, as on the run pages)."""
    return get_object_or_404(Run.objects.select_related("dataset"), pk=run_id)


def _fmt(value: Any) -> str:
    """A value for a table cell: numbers like the trajectory page shows them, ``—`` for
    missing or NaN, other JSON compactly."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, (bool, int, float)):
        return num(value)
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(value)


def _finished_counts(run: Run) -> tuple[int, int]:
    """(succeeded, failed) attempt rows: one grouped count on the (run, status) index. Finished
    rows never change and each new one raises a count, so the pair keys caches of finished data."""
    counts = dict(
        Rollout.objects.filter(run=run, status__in=FINISHED).values_list("status").annotate(n=Count("id")).order_by()
    )
    return counts.get(S.SUCCEEDED, 0), counts.get(S.FAILED, 0)


def _cached(kind: str, run: Run, build):
    """``build()``, cached under the run and its finished counts (``GYMWEB_SUMMARY_CACHE_S``).
    While the run is running those counts change all the time (a team opening its profile during
    collection recomputed it on every view): then it is cached under the run alone for
    ``GYMWEB_LIVE_ANALYSIS_CACHE_S``, and the run's end (a new status) starts exact caching again."""
    ttl = float(settings.GYMWEB_SUMMARY_CACHE_S)
    if ttl <= 0:
        return build()
    created = run.created.timestamp() if run.created else 0
    live_ttl = float(settings.GYMWEB_LIVE_ANALYSIS_CACHE_S)
    if run.status == Run.Status.RUNNING and live_ttl > 0:
        key, ttl = f"gymweb:{kind}-live:v1:{run.pk}:{created}", live_ttl
    else:
        succeeded, failed = _finished_counts(run)
        key = f"gymweb:{kind}:v1:{run.pk}:{created}:{succeeded}:{failed}"
    value = cache.get(key)
    if value is None:
        value = build()
        cache.set(key, value, ttl)
    return value


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
    index = info.get("_ng_rollout_index")
    parts = [f"rollout {index}"]
    parts += [
        f"{k} {_fmt(v)}" for k, v in info.items() if k not in ("rollout_id", "_ng_task_index", "_ng_rollout_index")
    ]
    reward = info.get("reward")
    return {
        "label": f"#{index}",
        "reward": _fmt(reward),
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
        "task": source["_ng_task_index"],
        "agent": _agent_name(source) or "",
        "n": n,
        "expected": expected,
        "missing": prow.get("missing_num_rollouts")
        if prow is not None
        else (expected - n if expected is not None else None),
        "mean_reward": reward[1] if reward else None,
        "fields": fields,
        "infos": [
            {k: v for k, v in i.items() if k not in ("rollout_id", "_ng_task_index")}
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
    fields = [{"name": f[0], "cells": [_fmt(v) for v in f[1:]]} for f in raw["fields"]]
    reward = next((f for f in raw["fields"] if f[0] == "reward"), None)
    by_stat = dict(zip(GROUP_ORDER, reward[1:])) if reward else {}
    passes = [(k, _fmt(p), _fmt(avg)) for k, p, avg in raw["passes"]]
    tokens = next((f[1] for f in raw["fields"] if f[0] == "total_tokens"), None)
    return {
        **raw,
        "reward": [_fmt(by_stat.get(x)) for x in STATS] if reward else None,
        "tokens": _fmt(tokens),
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
            other.append((k, _fmt(v)))
    names = sorted(dict.fromkeys([*stats, *across]), key=lambda n: n != "reward")
    rows = []
    for name in names:
        s, a = stats.get(name, {}), across.get(name)
        row: dict[str, Any] = {"name": name, "cells": [_fmt(s.get(x)) for x in STATS], "across": None}
        if a:
            ci = "—"
            if a.get("ci_low_95") is not None and a.get("ci_high_95") is not None:
                ci = f"[{_fmt(a['ci_low_95'])}, {_fmt(a['ci_high_95'])}]"
            row["across"] = {
                "mean": _fmt(a.get("mean")),
                "ci": ci,
                "se": _fmt(a.get("se")),
                "std": _fmt(a.get("std")),
                "range": f"{_fmt(a.get('min'))} – {_fmt(a.get('max'))}",
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
        for e in sorted(rows, key=lambda e: e.get("_ng_rollout_index", 0)):
            ci = "—"
            if "ci_low_95/reward" in e and "ci_high_95/reward" in e:
                ci = f"[{_fmt(e['ci_low_95/reward'])}, {_fmt(e['ci_high_95/reward'])}]"
            body.append(
                [
                    _fmt(e.get("_ng_rollout_index")),
                    _fmt(e.get("sample_count")),
                    _fmt(e.get("missing_count")),
                    _fmt(e.get("mean/reward")),
                    ci,
                    _fmt(e.get("std/reward")),
                    f"{_fmt(e.get('p25/reward'))} – {_fmt(e.get('p75/reward'))}",
                    *[_fmt(e.get(f"mean/{name}")) for name in others],
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
        {"text": text, "cls": "muted" if text.startswith("Standard error is 0") else "warn"}
        for text in dict.fromkeys(str(w.message) for w in caught)
    ]
    by_key: dict[tuple[Any, str | None], dict] = {}
    by_task: dict[Any, list[dict]] = defaultdict(list)
    for e in extras.get("per_task", []):
        by_key[(e["_ng_task_index"], _agent_name(e))] = e
        by_task[e["_ng_task_index"]].append(e)
    used: set[int] = set()
    pairs = []
    for prow in result.reward_profiling:
        task, agent = prow["_ng_task_index"], _agent_name(prow)
        extra = by_key.get((task, agent))
        if extra is None and agent is None and len(by_task.get(task, ())) == 1:
            extra = by_task[task][0]
        if extra is not None:
            used.add(id(extra))
        pairs.append((prow, extra))
    unprofiled = [e for e in extras.get("per_task", []) if id(e) not in used]
    expected = _keys_per_task(run) if unprofiled else {}
    pairs += [(None, e) for e in unprofiled]
    rows = [_task_raw(prow, extra, expected.get((prow or extra)["_ng_task_index"])) for prow, extra in pairs]
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
    return _cached("profile", run, lambda: _build_profile(run))


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
    run = _run_for(request, run_id)
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
            **_run_charts(run),
        }
    )
    return vary_on_htmx(render(request, "rollouts/profile.html", context))


@login_required
@require_safe
def run_profile_file(request, run_id, kind):
    """One of the four profile files, written now exactly as ``write_run_profile`` writes it."""
    if kind not in PROFILE_FILES:
        raise Http404("unknown profile file")
    run = _run_for(request, run_id)
    name, content_type, _ = PROFILE_FILES[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NeMo Gym's notes about missing repeats: the page shows them
        result, extras = profile_run(run)
    with tempfile.TemporaryDirectory(prefix="gymweb-profile-") as tmp:
        paths = write_profile(result, extras, Path(tmp) / RUN_STEM)
        body = next(p for p in paths if p.name == name).read_bytes()
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@login_required
@require_safe
def run_aggregate_metrics_file(request, run_id):
    """``run-12_rollouts_aggregate_metrics.json``, NeMo Gym's aggregate metrics file of the run
    (what ``gym eval compare`` reads beside ``rollouts.jsonl``; named after the run's
    ``run-12_rollouts.jsonl`` download, so compare finds it beside that): the env's stored reply,
    else computed now with NeMo Gym's default computation; the ``X-Gymweb-Note`` header then says
    so. 404 when the run has no successful rollouts (NeMo Gym writes no file then)."""
    run = _run_for(request, run_id)
    entries, notes = run_aggregate_entries(run)
    if not entries:
        raise Http404(notes[0] if notes else "no aggregate metrics")
    name = aggregate_metrics_path(export_filename(run.pk, "rollouts")).name
    response = HttpResponse(aggregate_metrics_bytes(entries), content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    if notes:
        # Header values must be one line of latin-1: the notes quote env replies and URLs.
        response["X-Gymweb-Note"] = " ".join("; ".join(notes).split()).encode("ascii", "replace").decode()[:1000]
    return response


# -- the env's /aggregate_metrics reply ----------------------------------------------------------
def _kv_rows(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [(str(k), _fmt(v)) for k, v in value.items()]
    return [("", _fmt(value))]


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
            "rows": [[_fmt(g.get(c)) if c in g else "" for c in columns] for g in groups[:GROUP_ROWS_MAX]],
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


# -- charts of a run -----------------------------------------------------------------------------
def _latency_buckets(run: Run) -> dict[str, Any]:
    """Agent-call latencies of the run's finished attempts, bucketed in SQL on 1-2-5 edges. An
    imported run's calls have no timing (a NeMo Gym file records none): ``{"unknown": True}``."""
    if run.status == Run.Status.IMPORTED:
        return {"n": 0, "items": [], "unknown": True}
    calls = AgentCall.objects.filter(rollout__run=run, rollout__status__in=FINISHED)
    agg = calls.aggregate(n=Count("id"), lo=Min("latency_ms"), hi=Max("latency_ms"), mean=Avg("latency_ms"))
    if not agg["n"]:
        return {"n": 0, "items": []}
    lo, hi = max(float(agg["lo"]), 0.1), max(float(agg["hi"]), 0.1)
    edges = charts.one_two_five_edges(lo, hi)
    bucket = Case(
        *[When(latency_ms__lt=edge, then=Value(i)) for i, edge in enumerate(edges[1:-1])],
        default=Value(len(edges) - 2),
        output_field=IntegerField(),
    )
    counts = [0] * (len(edges) - 1)
    for row in calls.annotate(bucket=bucket).values("bucket").annotate(c=Count("id")).order_by():
        counts[min(max(int(row["bucket"]), 0), len(counts) - 1)] += row["c"]
    items = []
    for i, c in enumerate(counts):
        label = f"{charts.format_ms(edges[i])}–{charts.format_ms(edges[i + 1])}"
        if i == 0 and float(agg["lo"]) < edges[0]:
            label = f"< {charts.format_ms(edges[1])}"
        items.append((label, c))
    return {"n": agg["n"], "mean": agg["mean"], "min": agg["lo"], "max": agg["hi"], "items": items}


_TRUNCS = ((60, TruncSecond), (3600, TruncMinute), (86400, TruncHour))


def _failure_buckets(run: Run) -> dict[str, Any]:
    """Failed attempts per failure kind per time bucket (``Rollout.finished``): SQL groups by
    (truncated time, kind); Python folds the groups into round buckets (at most 30)."""
    failed = Rollout.objects.filter(run=run, status=S.FAILED, finished__isnull=False)
    agg = failed.aggregate(n=Count("id"), lo=Min("finished"), hi=Max("finished"))
    if not agg["n"]:
        return {"n": 0, "columns": [], "step": 0}
    start = min(t for t in (run.started, agg["lo"]) if t is not None)
    end = max(t for t in (run.finished if run.is_final else timezone.now(), agg["hi"]) if t is not None)
    step = charts.time_step((end - start).total_seconds(), 30)
    trunc = next((fn for limit, fn in _TRUNCS if step < limit), TruncDay)
    base = math.floor(start.timestamp() / step) * step
    count = int((end.timestamp() - base) // step) + 1
    buckets: list[dict[str, int]] = [defaultdict(int) for _ in range(count)]
    rows = (
        failed.annotate(t=trunc("finished", tzinfo=UTC)).values("t", "failure_kind").annotate(c=Count("id")).order_by()
    )
    for row in rows:
        i = min(max(int((row["t"].timestamp() - base) // step), 0), count - 1)
        buckets[i][row["failure_kind"] or "(unclassified)"] += row["c"]
    columns = []
    for i, values in enumerate(buckets):
        moment = timezone.localtime(datetime.fromtimestamp(base + i * step, tz=UTC))
        columns.append((charts.time_label(moment, step), dict(values)))
    return {"n": agg["n"], "columns": columns, "step": step}


def _step_text(step: int) -> str:
    return charts.format_ms(step * 1000.0)


def _run_charts(run: Run) -> dict[str, Any]:
    """The latency histogram and the failures-over-time chart of a run (cached SQL aggregates)."""
    data = _cached("charts", run, lambda: {"latency": _latency_buckets(run), "failures": _failure_buckets(run)})
    lat, fails = data["latency"], data["failures"]
    latency_chart = charts.bar_chart(
        lat["items"],
        id="latency",
        title="Agent-call latency distribution",
        desc=f"{lat['n']} agent calls of finished attempts, counted in buckets of 1-2-5 steps of milliseconds.",
        x_label="latency",
        y_label="calls",
    )
    failures_chart = charts.stacked_bar_chart(
        fails["columns"],
        id="failures-over-time",
        title="Failed attempts by kind over time",
        desc=f"{fails['n']} failed attempts, stacked by failure kind, in buckets of {_step_text(fails['step'])} "
        "by the time each attempt finished."
        if fails["n"]
        else "No failed attempts.",
        x_label=f"finished ({timezone.get_current_timezone_name()}, buckets of {_step_text(fails['step'])})"
        if fails["n"]
        else "",
        y_label="failed attempts",
    )
    return {"latency": lat, "latency_chart": latency_chart, "failures": fails, "failures_chart": failures_chart}


@login_required
@require_safe
def run_charts(request, run_id):
    """The run page's charts section (loaded by HTMX after the page; it refreshes itself while
    the run is not final)."""
    run = _run_for(request, run_id)
    return vary_on_htmx(render(request, "rollouts/partials/chart_run.html", {"run": run, **_run_charts(run)}))


# -- compare -------------------------------------------------------------------------------------
class RunChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, run: Run) -> str:
        return f"#{run.pk} · {run.name} · {run.status}"


class CompareForm(forms.Form):
    a = RunChoiceField(
        queryset=Run.objects.order_by("-created", "-id"), label="Run A (baseline)", empty_label="(choose a run)"
    )
    b = RunChoiceField(
        queryset=Run.objects.order_by("-created", "-id"), label="Run B (candidate)", empty_label="(choose a run)"
    )
    # NeMo Gym's compare takes candidates as a list; the page takes up to four (B and these).
    c = RunChoiceField(
        queryset=Run.objects.order_by("-created", "-id"), label="Candidate 2", empty_label="(none)", required=False
    )
    d = RunChoiceField(
        queryset=Run.objects.order_by("-created", "-id"), label="Candidate 3", empty_label="(none)", required=False
    )
    e = RunChoiceField(
        queryset=Run.objects.order_by("-created", "-id"), label="Candidate 4", empty_label="(none)", required=False
    )

    def candidates(self) -> list[tuple[str, Run]]:
        """``[(field name, run)]`` of the chosen candidates, B first."""
        return [(n, self.cleaned_data[n]) for n in CANDIDATE_FIELDS if self.cleaned_data.get(n) is not None]


CANDIDATE_FIELDS = ("b", "c", "d", "e")


def _compare_report_view(
    report: dict[str, Any], run_a: Run, candidates: list[tuple[str, Run]], here: str
) -> dict[str, Any]:
    """NeMo Gym's compare report (``evaluation.compare_report.compare_sides``) as page rows: key metrics
    (other metrics folded), per candidate its flips with per-repeat rewards and a side-by-side link,
    and gymweb's paired interval."""
    comp = report["comparisons"][0]
    labels = [f"{name.upper()} · #{run.pk}" for name, run in candidates]

    def cells(row):
        out = {
            "metric": row["metric"],
            "base": _fmt(
                row["baseline"]
                and (
                    row["baseline"]["mean_across_repeats"]
                    if row["baseline"]["mean_across_repeats"] is not None
                    else row["baseline"]["value"]
                )
            ),
            "base_ci": _ci(row["baseline"]),
            "cands": [],
        }
        for cand in row["candidates"]:
            if cand is None:
                out["cands"].append({"value": "—", "ci": "—", "delta": "—", "delta_ci": "—", "cls": ""})
                continue
            delta = cand["delta"]
            out["cands"].append(
                {
                    "value": _fmt(
                        cand["mean_across_repeats"] if cand["mean_across_repeats"] is not None else cand["value"]
                    ),
                    "ci": _ci(cand),
                    "delta": "—"
                    if delta is None
                    else f"{delta:+.4f}" + (f" ({cand['delta_pct']:+.1f}%)" if cand["delta_pct"] is not None else ""),
                    "delta_ci": "—"
                    if cand["delta_ci_low"] is None
                    else f"[{cand['delta_ci_low']:+.4f}, {cand['delta_ci_high']:+.4f}]",
                    "cls": ""
                    if not delta
                    else (
                        "bad"
                        if cand["delta_ci_high"] is not None and cand["delta_ci_high"] < 0
                        else "ok"
                        if cand["delta_ci_low"] is not None and cand["delta_ci_low"] > 0
                        else ""
                    ),
                }
            )
        return out

    flips = []
    for (name, run), summary, paired in zip(
        candidates, comp["flips"], report["gymweb"]["paired_intervals"][0]["candidates"]
    ):
        rows = [
            {
                **f,
                "baseline_score": _fmt(f["baseline_score"]),
                "candidate_score": _fmt(f["candidate_score"]),
                "delta": f"{f['delta']:+.4f}",
                "direction_text": f["direction"].replace("_to_", "→"),
                "base_rewards": [(r, "ok" if r == 1 else "bad" if r == 0 else "") for r in f["baseline_rewards"] or []],
                "cand_rewards": [
                    (r, "ok" if r == 1 else "bad" if r == 0 else "") for r in f["candidate_rewards"] or []
                ],
                "side_url": f"{here}&{urlencode({'task': f['task_index'], 'vs': name})}#side-by-side",
            }
            for f in summary["flips"][:COMPARE_FLIPS_SHOWN]
        ]
        flips.append(
            {
                "name": name,
                "run": run,
                "s": summary,
                "rows": rows,
                "more": max(len(summary["flips"]) - COMPARE_FLIPS_SHOWN, 0),
                "paired": {
                    **paired,
                    "ci": "—" if paired["ci_low"] is None else f"[{paired['ci_low']:+.4f}, {paired['ci_high']:+.4f}]",
                    "delta_text": _fmt(paired["delta"]),
                    "width_text": _fmt(paired["width"]),
                    "welch_text": _fmt(paired["welch_width"]),
                },
            }
        )
    return {
        "labels": labels,
        "key_rows": [cells(r) for r in comp["metrics"] if r["is_key_metric"]],
        "other_rows": [cells(r) for r in comp["metrics"] if not r["is_key_metric"]],
        "flips": flips,
        "notes": comp["notes"] + report["warnings"],
        "tasks": comp["baseline_task_count"],
        "repeats": comp["baseline_repeat_count"],
        "cand_tasks": comp["candidate_task_counts"],
        "cand_repeats": comp["candidate_repeat_counts"],
    }


def _ci(value: dict | None) -> str:
    if not value or value["ci_low"] is None or value["ci_high"] is None:
        return "—"
    return f"[{_fmt(value['ci_low'])}, {_fmt(value['ci_high'])}]"


def _nemo_side(run: Run, role: str, index: int = 0):
    """A run as one side of NeMo Gym's compare; its metrics (a profile of its successes) are
    cached under its finished counts like the profile page's."""
    side = nemo_compare.side_from_run(
        run, role, index, entries=_cached("compare-entries", run, lambda: nemo_compare.run_entries(run))
    )
    return side


def _nemo_report(run_a: Run, candidates: list[tuple[str, Run]], command: str = "") -> dict[str, Any]:
    baseline = _nemo_side(run_a, "baseline")
    sides = [_nemo_side(run, "candidate", i) for i, (_, run) in enumerate(candidates)]
    return nemo_compare.compare_sides(baseline, sides, command=command)


@login_required
@require_safe
def compare_report_file(request, fmt):
    """``compare_report.md`` or ``compare_report.json`` of ``?a=RUN&b=RUN[&c=…&d=…&e=…]``, the files
    ``manage.py compare`` writes."""
    if fmt not in ("md", "json"):
        raise Http404("unknown format")
    form = CompareForm(request.GET)
    if not form.is_valid():
        return HttpResponse(
            "choose a baseline (a) and a candidate (b)", status=400, content_type="text/plain; charset=utf-8"
        )
    try:
        report = _nemo_report(
            form.cleaned_data["a"], form.candidates(), command=f"gymweb compare page ?{request.GET.urlencode()}"
        )
    except nemo_compare.CompareError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    if fmt == "md":
        body, name, ctype = nemo_compare.render_markdown(report).encode(), nemo_compare.COMPARE_MD, "text/markdown"
    else:
        import orjson

        body, name, ctype = (
            orjson.dumps(report, option=orjson.OPT_INDENT_2),
            nemo_compare.COMPARE_JSON,
            "application/json",
        )
    response = HttpResponse(body, content_type=f"{ctype}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _status_of(comparison) -> dict[int, str]:
    status = {}
    for name in ("regressions", "improvements", "unchanged", "unfinished", "mismatched"):
        for t in getattr(comparison, name):
            status[t.task_index] = name
    return status


STATUS_TEXT = {
    "regressions": "regression",
    "improvements": "improvement",
    "unchanged": "unchanged",
    "unfinished": "unfinished",
    "mismatched": "inputs differ",
}


def _compare_row(t, status: str, urls: dict[str, str]) -> dict[str, Any]:
    delta = t.delta
    return {
        "task": t.task_index,
        "mean_a": _fmt(t.mean_a),
        "mean_b": _fmt(t.mean_b),
        "keys_a": t.keys_a,
        "keys_b": t.keys_b,
        "delta": "—" if delta is None else f"{delta:+.4f}".rstrip("0").rstrip(".") if delta else "0",
        "delta_cls": "" if status not in ("regressions", "improvements") else ("bad" if delta < 0 else "ok"),
        "status": status,
        "status_text": STATUS_TEXT.get(status, status),
        "side_url": f"{urls['self']}&{urlencode({'task': t.task_index})}#side-by-side",
        "run_a_url": f"{urls['a']}?{urlencode({'task': t.task_index})}#rollouts",
        "run_b_url": f"{urls['b']}?{urlencode({'task': t.task_index})}#rollouts",
    }


def _side(run: Run, rollout: Rollout | None) -> dict[str, Any]:
    """One column of the side-by-side view: the trajectory page's view models of a rollout."""
    side: dict[str, Any] = {"run": run, "rollout": rollout, "imported": run.status == Run.Status.IMPORTED}
    if rollout is None:
        return side
    try:
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        task_row = {}
    steps, num_items = _timeline(rollout)
    side.update(
        {
            "steps": steps,
            "num_items": num_items,
            "task_input": _task_input(task_row, item_url_base(rollout)),
            "tools": [
                t.get("name")
                for t in (task_row.get("responses_create_params") or {}).get("tools") or []
                if isinstance(t, dict)
            ],
            "url": reverse("rollout", args=[run.pk, rollout.pk]),
            "raw_url": reverse("rollout_raw", args=[run.pk, rollout.pk]),
        }
    )
    return side


def _index_list(indices: list[int]) -> dict[str, Any]:
    return {"shown": indices[:INDEX_LIST_MAX], "more": max(len(indices) - INDEX_LIST_MAX, 0), "count": len(indices)}


@login_required
@require_safe
def compare(request):
    """Compare runs (``?a=RUN&b=RUN[&c=RUN&d=RUN&e=RUN]``): NeMo Gym's compare report of the
    baseline A against up to four candidates (key metrics with the Welch interval of the delta,
    flips with per-repeat rewards, gymweb's paired interval), and A against B task by task: per-task
    mean reward, the delta, regressions, improvements, tasks in one run only, mismatched tasks;
    ``&task=N`` puts the two runs' trajectories of task N side by side (``&vs=c`` uses candidate C
    instead of B); ``&show=…`` and ``&page=N`` page the task table."""
    bound = "a" in request.GET and "b" in request.GET  # one alone (the run page's link) pre-fills the form
    form = CompareForm(
        request.GET if bound else None,
        initial={k: request.GET[k] for k in ("a", *CANDIDATE_FIELDS) if k in request.GET},
    )
    context: dict[str, Any] = {"form": form}
    if bound and form.is_valid():
        run_a, run_b = form.cleaned_data["a"], form.cleaned_data["b"]
        show = request.GET.get("show") if request.GET.get("show") in COMPARE_SHOWS else "all"
        here = reverse("compare")
        candidates = form.candidates()
        all_qs = urlencode({"a": run_a.pk, **{name: run.pk for name, run in candidates}})
        try:
            report = _nemo_report(run_a, candidates)
            context["report"] = _compare_report_view(report, run_a, candidates, f"{here}?{all_qs}")
        except nemo_compare.CompareError as exc:
            context["report_error"] = str(exc)
        context["report_qs"] = all_qs
        # ``&vs=c`` (a flip's side-by-side link) puts candidate C in B's place for the task table
        vs = request.GET.get("vs") if request.GET.get("vs") in dict(candidates) else "b"
        run_b = dict(candidates)[vs]
        comparison = compare_runs(run_a, run_b)
        pair_qs = urlencode({"a": run_a.pk, "b": run_b.pk})
        urls = {"self": f"{here}?{pair_qs}", "a": reverse("run", args=[run_a.pk]), "b": reverse("run", args=[run_b.pk])}
        status = _status_of(comparison)
        listed = comparison.tasks if show == "all" else getattr(comparison, show)
        page = Paginator(listed, COMPARE_ROWS_PER_PAGE).get_page(request.GET.get("page"))
        context.update(
            {
                "run_a": run_a,
                "run_b": run_b,
                "c": comparison,
                "show": show,
                "shows": [
                    (name, len(comparison.tasks) if name == "all" else len(getattr(comparison, name)))
                    for name in COMPARE_SHOWS
                ],
                "pair_url": urls["self"],
                "swap_url": f"{here}?{urlencode({'a': run_b.pk, 'b': run_a.pk})}",
                "page": page,
                "page_qs": urlencode({"a": run_a.pk, "b": run_b.pk, **({"show": show} if show != "all" else {})}),
                "rows": [_compare_row(t, status.get(t.task_index, ""), urls) for t in page.object_list],
                "regressions": [_compare_row(t, "regressions", urls) for t in comparison.regressions[:COMPARE_TOP]],
                "improvements": [_compare_row(t, "improvements", urls) for t in comparison.improvements[:COMPARE_TOP]],
                "only_a": _index_list(comparison.only_in_a),
                "only_b": _index_list(comparison.only_in_b),
                "not_compared": len(comparison.unfinished) + len(comparison.mismatched),
                "delta": _fmt(comparison.delta) if comparison.delta is None else f"{comparison.delta:+.4f}",
            }
        )
        task = request.GET.get("task")
        if task is not None:
            try:
                task_index = int(task)
            except ValueError:
                context["task_error"] = "task must be a whole number"
            else:
                a, b = pick_pair(run_a, run_b, task_index)
                context["side"] = {
                    "task": task_index,
                    "status": STATUS_TEXT.get(status.get(task_index, ""), ""),
                    "a": _side(run_a, a),
                    "b": _side(run_b, b),
                    "mismatched": task_index in {t.task_index for t in comparison.mismatched},
                }
    return render(request, "rollouts/compare.html", context, status=400 if form.is_bound and form.errors else 200)


# -- agent conformance check ---------------------------------------------------------------------
class CheckAgentForm(forms.Form):
    """The agent to probe. The URL is validated exactly like the new-run form's agent URL
    (``loop.validate_base_url``: http(s), no credentials, query or fragment; and
    ``GYMWEB_ALLOWED_TARGET_HOSTS``; no trailing ``/v1/responses``), with the same helper
    (``forms.clean_agent_url``); a value holding ``@`` is never rendered back."""

    agent_url = forms.CharField(
        label="Agent base URL",
        max_length=2000,
        help_text="Your service: the check POSTs probe conversations to {agent_url}/v1/responses.",
        widget=forms.TextInput(attrs={"placeholder": "http://127.0.0.1:9102", "size": 48, "autocomplete": "off"}),
    )
    timeout_s = forms.FloatField(
        label="Timeout per probe (s)",
        min_value=0.5,
        max_value=CHECK_TIMEOUT_MAX_S,
        initial=CHECK_TIMEOUT_DEFAULT_S,
        help_text=f"Each of the four probes waits at most this long (up to {CHECK_TIMEOUT_MAX_S:g} s). "
        f"Replies slower than {DEFAULT_SLOW_S:g} s get a warning.",
        widget=forms.NumberInput(attrs={"step": "any", "size": 6}),
    )

    def clean_agent_url(self) -> str:
        return clean_agent_url(self)


def _report_view(report) -> dict[str, Any]:
    findings = []
    for f in sorted(report.findings, key=lambda f: f.severity != "error"):  # errors first, in the order found
        sent, sent_is_json = pretty_json_text(f.sent)
        findings.append({"f": f, "sent": sent if sent_is_json else f.sent})
    probes = []
    for p in report.probes:
        sent, sent_is_json = pretty_json_text(p.sent)
        probes.append(
            {
                "p": p,
                "sent": sent if sent_is_json else p.sent,
                "outcome": f"HTTP {p.status}" if p.status is not None else "no reply",
            }
        )
    return {
        "report": report,
        "findings": findings,
        "probes": probes,
        "errors": len(report.errors),
        "warnings": len(report.warnings),
    }


@login_required
@require_http_methods(["GET", "POST"])
def check_agent(request):
    """The agent conformance check: a form (GET; ``?agent_url=`` pre-fills it) and, on POST, the
    report of ``conformance.check_agent_sync`` with every finding and probe."""
    result = None
    if request.method == "POST":
        form = CheckAgentForm(request.POST)
        if form.is_valid():
            try:
                report = check_agent_sync(
                    form.cleaned_data["agent_url"],
                    timeout_s=form.cleaned_data["timeout_s"],
                    policy=targets.policy(),
                    max_reply_bytes=targets.max_reply_bytes(),
                )
            except InvalidBaseURL as exc:  # validated above; kept for safety (the message never echoes credentials)
                form.add_error("agent_url", str(exc))
            else:
                environments.name_the_meant_url(report, form.cleaned_data["agent_url"])
                refused = [f for f in report.findings if f.code == "target_refused"]
                if refused:  # judged again when connecting (the name's addresses may have changed)
                    form.add_error("agent_url", f"agent URL: {refused[0].title}.")
                else:
                    result = _report_view(report)
    else:
        prefill = request.GET.get("agent_url", "") or settings.GYMWEB_DEFAULT_AGENT_URL
        form = CheckAgentForm(initial={"agent_url": prefill[:2000] if "@" not in prefill else ""})
    response = render(
        request,
        "rollouts/check_agent.html",
        {"form": form, "result": result},
        status=400 if form.is_bound and form.errors else 200,
    )
    response["Cache-Control"] = "no-store"
    return response
