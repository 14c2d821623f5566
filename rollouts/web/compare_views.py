"""The compare page: NeMo Gym's compare report of a baseline against up to four candidates (and its
files), A against B task by task, and the two runs' trajectories of one task side by side.

Everything shown is untrusted text (run names, trajectories): templates only autoescape it,
nothing here marks data safe.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from rollouts.display import signed_number
from rollouts.downloads import bytes_download
from rollouts.evaluation import compare_files, compare_report, compare_sides
from rollouts.evaluation.compare import compare_runs, pick_pair
from rollouts.models import Rollout, Run, TrajectoryItem
from rollouts.web import compare_align
from rollouts.web.access import runs_for
from rollouts.web.analysis import cell_text, run_cached
from rollouts.web.items import item_url_base, task_input, timeline

COMPARE_ROWS_PER_PAGE = 100
COMPARE_SHOWS = ("all", "regressions", "improvements", "unchanged", "unfinished", "mismatched")
COMPARE_TOP = 10
COMPARE_FLIPS_SHOWN = 50
INDEX_LIST_MAX = 200


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

    def __init__(self, *args, user=None, **kwargs):
        """``user``: the runs offered (and accepted) are the ones they may see (``runs_for``)."""
        super().__init__(*args, **kwargs)
        for field in ("a", *CANDIDATE_FIELDS):
            self.fields[field].queryset = runs_for(user).order_by("-created", "-id")  # type: ignore[attr-defined]

    def candidates(self) -> list[tuple[str, Run]]:
        """``[(field name, run)]`` of the chosen candidates, B first."""
        return [(n, self.cleaned_data[n]) for n in CANDIDATE_FIELDS if self.cleaned_data.get(n) is not None]


CANDIDATE_FIELDS = ("b", "c", "d", "e")


def _compare_report_view(
    report: dict[str, Any], run_a: Run, candidates: list[tuple[str, Run]], here: str
) -> dict[str, Any]:
    """NeMo Gym's compare report (``evaluation.compare.compare_sides``) as page rows: key metrics
    (other metrics folded), per candidate its flips with per-repeat rewards and a side-by-side link,
    and gymweb's paired interval."""
    comp = report["comparisons"][0]
    labels = [f"{name.upper()} · #{run.pk}" for name, run in candidates]

    def cells(row):
        out = {
            "metric": row["metric"],
            "base": cell_text(
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
                    "value": cell_text(
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
                "baseline_score": cell_text(f["baseline_score"]),
                "candidate_score": cell_text(f["candidate_score"]),
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
                "matched_flips": paired.get("matched_flips"),
                "differ_by_index": (
                    paired["paired_by_index"] - paired["matched_flips"]["common_task_count"]
                    if paired.get("matched_flips")
                    else 0
                ),
                "paired": {
                    **paired,
                    "ci": "—" if paired["ci_low"] is None else f"[{paired['ci_low']:+.4f}, {paired['ci_high']:+.4f}]",
                    "delta_text": cell_text(paired["delta"]),
                    "width_text": cell_text(paired["width"]),
                    "welch_text": cell_text(paired["welch_width"]),
                    "verdict": interval_verdict(paired),
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


def interval_verdict(paired: dict) -> str:
    """The paired interval against Welch's unpaired one, in words (``""`` when either is missing):
    which is narrower, by their widths, and what an interval of width 0 means."""
    tighter, width, welch = paired.get("tighter"), paired.get("width"), paired.get("welch_width")
    if tighter is None or width is None or welch is None:
        return ""
    if tighter == "equal":
        if width == 0:
            return (
                "Both intervals are a single point (width 0): every common task changed its reward by the same "
                "amount, so there is no spread to measure."
            )
        return f"Both intervals have the same width ({cell_text(width)}): pairing the tasks changes nothing here."
    if tighter == "paired":
        return (
            f"The paired interval is narrower (width {cell_text(width)}) than the unpaired Welch interval "
            f"(width {cell_text(welch)}): comparing task by task makes the difference more certain."
        )
    return (
        f"The unpaired Welch interval is narrower (width {cell_text(welch)}) than the paired one "
        f"(width {cell_text(width)}): the tasks' rewards do not move together here."
    )


def _ci(value: dict | None) -> str:
    if not value or value["ci_low"] is None or value["ci_high"] is None:
        return "—"
    return f"[{cell_text(value['ci_low'])}, {cell_text(value['ci_high'])}]"


def _nemo_side(run: Run, role: str, index: int = 0):
    """A run as one side of NeMo Gym's compare; its metrics (a profile of its successes) are
    cached under its finished counts like the profile page's."""
    side = compare_sides.side_from_run(
        run, role, index, entries=run_cached("compare-entries", run, lambda: compare_sides.run_entries(run))
    )
    return side


def _nemo_report(run_a: Run, candidates: list[tuple[str, Run]], command: str = "") -> dict[str, Any]:
    baseline = _nemo_side(run_a, "baseline")
    sides = [_nemo_side(run, "candidate", i) for i, (_, run) in enumerate(candidates)]
    return compare_report.compare_sides(baseline, sides, command=command)


@login_required
@require_safe
def compare_report_file(request, fmt):
    """``compare_report.md`` or ``compare_report.json`` of ``?a=RUN&b=RUN[&c=…&d=…&e=…]``, the files
    ``manage.py compare`` writes."""
    if fmt not in ("md", "json"):
        raise Http404("unknown format")
    form = CompareForm(request.GET, user=request.user)
    if not form.is_valid():
        return HttpResponse(
            "choose a baseline (a) and a candidate (b)", status=400, content_type="text/plain; charset=utf-8"
        )
    try:
        report = _nemo_report(
            form.cleaned_data["a"], form.candidates(), command=f"gymweb compare page ?{request.GET.urlencode()}"
        )
    except compare_sides.CompareError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    if fmt == "md":
        body, name, ctype = compare_files.render_markdown(report).encode(), compare_report.COMPARE_MD, "text/markdown"
    else:
        import orjson

        body, name, ctype = (
            orjson.dumps(report, option=orjson.OPT_INDENT_2),
            compare_report.COMPARE_JSON,
            "application/json",
        )
    return bytes_download(body, name, ctype)


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
    "mismatched": "task differs",
}


def _compare_row(t, status: str, urls: dict[str, str]) -> dict[str, Any]:
    delta = t.delta
    return {
        "task": t.task_index,
        "mean_a": cell_text(t.mean_a),
        "mean_b": cell_text(t.mean_b),
        "keys_a": t.keys_a,
        "keys_b": t.keys_b,
        "delta": signed_number(delta),
        "delta_cls": "" if status not in ("regressions", "improvements") else ("bad" if delta < 0 else "ok"),
        "status": status,
        "status_text": STATUS_TEXT.get(status, status),
        "difference": t.difference,
        "side_url": f"{urls['self']}&{urlencode({'task': t.task_index})}#side-by-side",
        "run_a_url": f"{urls['a']}?{urlencode({'task': t.task_index})}#rollouts",
        "run_b_url": f"{urls['b']}?{urlencode({'task': t.task_index})}#rollouts",
    }


def _input_items(task_row: dict[str, Any]) -> list[Any]:
    """What the agent was given, as items to align: the instructions, the input items, the tools."""
    params = task_row.get("responses_create_params") if isinstance(task_row, dict) else None
    params = params if isinstance(params, dict) else {}
    items: list[Any] = []
    if params.get("instructions"):
        items.append({"type": "message", "role": "instructions", "content": params["instructions"]})
    first = params.get("input")
    items.extend([{"type": "message", "role": "user", "content": first}] if isinstance(first, str) else first or [])
    if params.get("tools"):
        items.append({"type": "tools", "tools": params["tools"]})
    return items


def _side(run: Run, rollout: Rollout | None) -> dict[str, Any]:
    """One column of the side-by-side view: the trajectory page's view models of a rollout, and
    the raw items to align (``input_items``, ``step_payloads``: step index -> payloads)."""
    side: dict[str, Any] = {"run": run, "rollout": rollout, "imported": run.status == Run.Status.IMPORTED}
    if rollout is None:
        return side
    try:
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        task_row = {}
    payloads: list = []
    steps, num_items = timeline(rollout, payloads=payloads)
    step_of = dict(TrajectoryItem.objects.filter(rollout=rollout).values_list("seq", "step"))
    step_payloads: dict[int, list[Any]] = {}
    for seq, payload in payloads:
        step_payloads.setdefault(step_of.get(seq, 0), []).append(payload)
    side.update(
        {
            "steps": steps,
            "num_items": num_items,
            "task_input": task_input(task_row, item_url_base(rollout)),
            "input_items": _input_items(task_row),
            "step_payloads": step_payloads,
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


def _aligned(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    return compare_align.align(
        a.get("input_items"),
        b.get("input_items"),
        a.get("steps", []),
        b.get("steps", []),
        a.get("step_payloads", {}),
        b.get("step_payloads", {}),
    )


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
        user=request.user,
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
        except compare_sides.CompareError as exc:
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
                "delta": cell_text(comparison.delta) if comparison.delta is None else f"{comparison.delta:+.4f}",
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
                side_a, side_b = _side(run_a, a), _side(run_b, b)
                rows = _aligned(side_a, side_b)
                context["side"] = {
                    "task": task_index,
                    "status": STATUS_TEXT.get(status.get(task_index, ""), ""),
                    "a": side_a,
                    "b": side_b,
                    "rows": rows,
                    "diverges": any(r["anchor"] for r in rows),
                    "identical_rows": sum(1 for r in rows if r["same"]),
                    "mismatched": task_index in {t.task_index for t in comparison.mismatched},
                    "difference": next((t.difference for t in comparison.mismatched if t.task_index == task_index), ""),
                }
    return render(request, "rollouts/compare.html", context, status=400 if form.is_bound and form.errors else 200)
