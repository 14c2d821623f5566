"""Run-page evaluation tools (NeMo Gym's ``gym eval`` beside a run): the health check's verdict
counts, findings by check and its two files; reverify (button, source link, reward flips); the ATIF
download. Plus the per-step findings the rollout page shows.

Plain function views; access through ``access.run_for`` like the other run pages. The evaluation section
is its own partial (``rollouts/partials/run_evaluation.html``), loaded by HTMX after the page (with
a real link as fallback) so the run page's own views stay as they are. Everything shown from the
data (errors, URLs, check details) is autoescaped text.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import orjson
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from rollouts import background
from rollouts.collection import archive
from rollouts.downloads import bytes_download, file_download
from rollouts.evaluation import atif, health, health_checks, health_report, reverify
from rollouts.models import BackgroundTask, Rollout, RolloutHealth, Run
from rollouts.web.access import run_for
from rollouts.web.forms import clean_target_url
from rollouts.web.htmx import vary_on_htmx, wants_partial

HEALTH_FILES = {
    "quality_summary": (health_report.QUALITY_SUMMARY_FILENAME, "application/json"),
    "rollout_verdicts": (health_report.ROLLOUT_VERDICTS_FILENAME, "application/jsonl"),
}
FLIPS_SHOWN = 100


class ReverifyForm(forms.Form):
    """Where to re-score the run; validated like the new-run form's env URL."""

    env_url = forms.CharField(
        label="Env base URL",
        max_length=2000,
        widget=forms.TextInput(attrs={"size": 40, "autocomplete": "off"}),
        help_text='GET /reverify_mode must answer "stateless"; POST /verify re-scores each success.',
    )
    force = forms.BooleanField(label="force (env not stateless: new run marked unsafe_)", required=False)

    def clean_env_url(self) -> str:
        return clean_target_url(self, "env_url", "env URL")


def _health_context(run: Run, url_base: str) -> dict[str, Any]:
    summary = run.health_summary
    if not summary:
        return {"health": None}
    verdicts = summary["run"]["verdicts"]
    issues = [
        {
            "check": c,
            "count": n,
            "text": health_checks.CHECK_TEXT.get(c, c),
            "url": f"{url_base}?check={c}#rollouts"
            if c in health_checks.ROLLOUT_CHECK_IDS + health_checks.GYMWEB_CHECK_IDS
            else "",
        }
        for c, n in summary["run"]["issues"].items()
        if n
    ]
    coverage = summary["run"]["artifacts"]["coverage"]
    unobserved = [c for c, cov in coverage.items() if cov["unobserved"] and not cov["evaluated"]]
    flagged_tasks = [(t, v["flags"]) for t, v in summary["tasks"].items() if v["flags"]]
    return {
        "health": {
            "checked": run.health_checked,
            "verdicts": [
                {"name": v, "count": verdicts.get(v, 0), "url": f"{url_base}?verdict={v}#rollouts"}
                for v in ("healthy", "unhealthy", "unobserved")
            ],
            "records": summary["run"]["artifacts"]["records"],
            "issues": issues,
            "unobserved": unobserved,
            "flagged_tasks": flagged_tasks[:50],
            "more_tasks": max(len(flagged_tasks) - 50, 0),
            "ignored": summary["run"]["ignored_checks"],
            "stats": summary["run"]["stats"],
        }
    }


def _evaluation_context(request, run: Run, form: ReverifyForm | None = None) -> dict[str, Any]:
    run_url = reverse("run", args=[run.pk])
    flips = reverify.reward_flips(run) if run.reverified_from_id else []
    reverified = list(run.reverifications.order_by("-id").values("id", "name", "created")[:10])
    return {
        "run": run,
        **_health_context(run, run_url),
        "form": form or ReverifyForm(initial={"env_url": run.env_url}),
        "can_reverify": run.is_final and Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).exists(),
        "flips": [
            {
                **f,
                "url": reverse("rollout", args=[run.pk, f["rollout_id"]]),
                "source_url": reverse("rollout", args=[run.reverified_from_id, f["source_rollout_id"]]),
            }
            for f in flips[:FLIPS_SHOWN]
        ],
        "flips_count": len(flips),
        "reverifications": reverified,
        "health_files": HEALTH_FILES,
    }


@login_required
@require_safe
def run_evaluation(request, run_id):
    """The run page's evaluation section (HTMX partial; a whole page for a plain request)."""
    run = run_for(request, run_id)
    context = _evaluation_context(request, run)
    template = "rollouts/partials/run_evaluation.html" if wants_partial(request) else "rollouts/run_evaluation.html"
    return vary_on_htmx(render(request, template, context))


def _not_now(run: Run, what: str) -> str | None:
    """Why ``what`` cannot run on ``run`` now, or None."""
    if not run.is_final:
        return f"The run is still going: {what} when it is finished."
    if run.is_archived:
        return str(archive.RunArchived(run, "the health check" if what.startswith("check") else "reverify"))
    return None


def health_check_job(task, progress) -> background.Done:
    """The background task of a health check: ``health.run_health_check`` on the task's run."""
    run = Run.objects.get(pk=task.params["run_id"])
    refused = _not_now(run, "check its health")
    if refused:
        raise background.TaskFailed(refused)
    progress(None, f"Checking the health of {run.rollouts.count()} rollout(s)…", force=True)
    result, _ = health.run_health_check(run)
    v = result.summary["run"]["verdicts"]
    return background.Done(
        f"Health checked: {v['healthy']} healthy, {v['unhealthy']} unhealthy, {v['unobserved']} unobserved.",
        url=reverse("run", args=[run.pk]) + "#evaluation",
    )


def _follow_task(request, task, back: str):
    """Where a page goes after starting ``task``: its task page, or (ran inline) ``back`` with the
    task's message, or the task's result."""
    if not task.is_finished:
        return HttpResponseRedirect(reverse("task", args=[task.pk]))
    if task.status == BackgroundTask.Status.DONE:
        messages.success(request, task.message)
        return HttpResponseRedirect(task.result_url or back)
    messages.error(request, task.message)
    return HttpResponseRedirect(back)


@login_required
@require_POST
def run_health_check(request, run_id):
    """Check the health of a stored run (it also runs after every collect and import) as a
    background task (``health_check_job``)."""
    run = run_for(request, run_id)
    back = reverse("run", args=[run.pk]) + "#evaluation"
    refused = _not_now(run, "check its health")
    if refused:
        messages.error(request, refused)
        return HttpResponseRedirect(back)
    try:
        task, _ = background.start(BackgroundTask.Kind.HEALTH_CHECK, request.user, {"run_id": run.pk})
    except background.TooManyTasks as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)
    return _follow_task(request, task, back)


@login_required
@require_safe
def run_health_file(request, run_id, kind):
    """``quality_summary.json`` or ``rollout_verdicts.jsonl`` of the last check, NeMo Gym's bytes."""
    if kind not in HEALTH_FILES:
        raise Http404("unknown file")
    run = run_for(request, run_id)
    if not run.health_summary:
        raise Http404("the run has not been health-checked")
    name, content_type = HEALTH_FILES[kind]
    if kind == "quality_summary":
        body = orjson.dumps(run.health_summary, option=orjson.OPT_INDENT_2)
    else:
        rows = RolloutHealth.objects.filter(run=run).order_by("task_index", "rollout_index")
        body = b"".join(
            orjson.dumps(
                health_report.verdict_row(
                    health_checks.Digest(
                        h.task_index,
                        h.rollout_index,
                        f"{h.task_index}-{h.rollout_index}",
                        h.verdict,
                        h.findings,
                        h.finding_steps,
                        h.unobserved,
                    )
                ),
                option=orjson.OPT_APPEND_NEWLINE,
            )
            for h in rows
        )
    return bytes_download(body, name, content_type)


def reverify_job(task, progress) -> background.Done:
    """The background task of a reverify: ``reverify.reverify_run`` of the task's run against its
    ``env_url`` (``force``); the new run is the result. A refusal names its form field."""
    run = Run.objects.get(pk=task.params["run_id"])
    refused = _not_now(run, "reverify it")
    if refused:
        raise background.TaskFailed(refused)
    progress(None, "Calling the env's /verify for each success…", force=True)
    try:
        result = reverify.reverify_run(run, task.params["env_url"], force=task.params["force"], user=task.user)
    except reverify.ReverifyError as exc:
        field = "env_url" if isinstance(exc, reverify.ReverifyRefused) else None
        raise background.TaskFailed(str(exc), {"field": field}) from exc
    note = f" Warning: {result.warning}." if result.warning else ""
    return background.Done(
        f"Reverified {result.reverified} rollout(s) ({result.failed} /verify failure(s)); "
        f"{len(result.flips)} reward(s) changed.{note}",
        url=reverse("run", args=[result.run.pk]) + "#evaluation",
        result={"run": result.run.pk},
    )


@login_required
@require_POST
def run_reverify(request, run_id):
    """Reverify the run against the posted env URL as a background task (``reverify_job``; only
    ``/verify`` calls, at most ``GYMWEB_REVERIFY_WEB_MAX_ROWS`` successes; larger runs use
    ``manage.py reverify``); its result is the new run."""
    run = run_for(request, run_id)
    form = ReverifyForm(request.POST)
    limit = int(settings.GYMWEB_REVERIFY_WEB_MAX_ROWS)
    if form.is_valid():
        n = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).count()
        refused = _not_now(run, "reverify it")
        if refused:
            form.add_error(None, refused)
        elif n > limit:
            form.add_error(
                None,
                f"The run has {n} successes; the page reverifies at most {limit} "
                f"(GYMWEB_REVERIFY_WEB_MAX_ROWS). Use: manage.py reverify {run.pk} --env-url URL",
            )
        else:
            params = {"run_id": run.pk, "env_url": form.cleaned_data["env_url"], "force": form.cleaned_data["force"]}
            try:
                task, _ = background.start(BackgroundTask.Kind.REVERIFY, request.user, params)
            except background.TooManyTasks as exc:
                form.add_error(None, str(exc))
            else:
                if not task.is_finished or task.status == BackgroundTask.Status.DONE:
                    return _follow_task(request, task, reverse("run", args=[run.pk]) + "#evaluation")
                form.add_error(task.result.get("field"), task.message)  # ran inline and was refused
    context = _evaluation_context(request, run, form)
    return render(request, "rollouts/run_evaluation.html", context, status=400)


@login_required
@require_safe
def run_atif(request, run_id):
    """The run's ATIF v1.7 export as a zip (``?failures=1`` adds failed keys), built in a temporary
    file so memory stays bounded."""
    run = run_for(request, run_id)
    if run.is_archived:
        return HttpResponse(
            str(archive.RunArchived(run, "the ATIF export")) + "\n",
            status=409,
            content_type="text/plain; charset=utf-8",
        )
    include_failures = request.GET.get("failures") == "1"
    spool = tempfile.TemporaryFile()
    try:
        count = atif.write_export(run, spool, include_failures=include_failures)
    except atif.AtifError as exc:
        spool.close()
        return HttpResponse(f"ATIF export failed: {exc}", status=500, content_type="text/plain; charset=utf-8")
    if not count:
        spool.close()
        raise Http404("the run has no rollouts to export")
    spool.seek(0)
    return file_download(spool, f"gymweb-run-{run.pk}-atif.zip", "application/zip")


# -- the rollout page -------------------------------------------------------------------------------
def rollout_findings(rollout: Rollout, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The health verdict of ``rollout`` for its page: sets ``step["findings"]`` on each step a
    finding concerns and returns ``{"verdict", "findings" (whole-rollout ones), "unobserved",
    "checked"}`` (``None`` values when the rollout was not checked). One query."""
    h = RolloutHealth.objects.filter(rollout=rollout).first()
    if h is None:
        return {"health": None}
    by_step: dict[int, list] = {}
    whole: list[dict[str, Any]] = []
    for finding, step in zip(h.findings, h.finding_steps or [None] * len(h.findings)):
        view = {
            "check": finding.get("check"),
            "text": health_checks.CHECK_TEXT.get(finding.get("check"), ""),
            "detail": json.dumps(finding.get("detail") or {}, ensure_ascii=False, sort_keys=True),
            "locator": json.dumps(finding.get("locator"), ensure_ascii=False) if finding.get("locator") else "",
        }
        (by_step.setdefault(step, []) if step is not None else whole).append(view)
    known = {s["index"] for s in steps}
    for s in steps:
        s["findings"] = by_step.get(s["index"], [])
    for step, views in by_step.items():
        if step not in known:  # a step without a row on the page: show it with the rollout's findings
            whole.extend(views)
    return {"health": {"verdict": h.verdict, "findings": whole, "unobserved": h.unobserved, "count": len(h.findings)}}
