"""The run page's charts: the agent-call latency histogram and failed attempts by kind over time,
drawn from cached SQL aggregates (``analysis.run_cached``) as numbers (``rollouts.web.charts``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Avg, Case, Count, IntegerField, Max, Min, Value, When
from django.db.models.functions import TruncDay, TruncHour, TruncMinute, TruncSecond
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_safe

from rollouts.models import AgentCall, Rollout, Run
from rollouts.web import charts
from rollouts.web.access import run_for
from rollouts.web.analysis import FINISHED, S, run_cached
from rollouts.web.htmx import vary_on_htmx


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


def charts_context(run: Run) -> dict[str, Any]:
    """The latency histogram and the failures-over-time chart of a run (cached SQL aggregates)."""
    data = run_cached("charts", run, lambda: {"latency": _latency_buckets(run), "failures": _failure_buckets(run)})
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
    run = run_for(request, run_id)
    return vary_on_htmx(render(request, "rollouts/partials/chart_run.html", {"run": run, **charts_context(run)}))
