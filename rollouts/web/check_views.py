"""The agent check page: a form for an agent's URL and, on POST, the conformance report
(``evaluation.conformance.check_agent_sync``) with every finding and probe.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from rollouts import background, targets
from rollouts.collection import environments
from rollouts.engine.loop import InvalidBaseURL
from rollouts.evaluation.conformance import DEFAULT_SLOW_S, Finding, ProbeResult, Report, check_agent_sync
from rollouts.models import BackgroundTask
from rollouts.templatetags.gymweb_tags import pretty_json_text
from rollouts.web.forms import clean_agent_url

CHECK_TIMEOUT_MAX_S = 60.0
CHECK_TIMEOUT_DEFAULT_S = 20.0


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


def check_agent_job(task, progress) -> background.Done:
    """The background task of an agent check: ``conformance.check_agent_sync`` on the task's
    ``agent_url`` and ``timeout_s``; the report is kept in the task's result for the check page
    (``?task=ID``). A refused URL is a ``TaskFailed`` on the ``agent_url`` field."""
    url = task.params["agent_url"]
    progress(None, f"Probing {url}…", force=True)
    try:
        report = check_agent_sync(
            url, timeout_s=task.params["timeout_s"], policy=targets.policy(), max_reply_bytes=targets.max_reply_bytes()
        )
    except InvalidBaseURL as exc:  # validated by the form; kept for safety (never echoes credentials)
        raise background.TaskFailed(str(exc), {"field": "agent_url"}) from exc
    environments.name_the_meant_url(report, url)
    refused = [f for f in report.findings if f.code == "target_refused"]
    if refused:  # judged again when connecting (the name's addresses may have changed)
        raise background.TaskFailed(f"agent URL: {refused[0].title}.", {"field": "agent_url"})
    body = report.to_dict()
    return background.Done(
        f"Checked the agent: {body['errors']} error(s), {body['warnings']} warning(s).",
        url=reverse("check_agent") + f"?task={task.pk}",
        result={"report": body},
    )


def _report_from(body: dict[str, Any]) -> Report:
    return Report(
        base_url=body["base_url"],
        url=body["url"],
        findings=[Finding(**f) for f in body["findings"]],
        probes=[ProbeResult(request={}, **p) for p in body["probes"]],
    )


def _finished_check(request, form: CheckAgentForm, task: BackgroundTask) -> dict[str, Any] | None:
    """The result of a finished check task for the page, or None (its error put on ``form``)."""
    if task.status == BackgroundTask.Status.DONE and "report" in task.result:
        return _report_view(_report_from(task.result["report"]))
    form.add_error(task.result.get("field", None), task.message)
    return None


@login_required
@require_http_methods(["GET", "POST"])
def check_agent(request):
    """The agent conformance check: a form (GET; ``?agent_url=`` pre-fills it) and, on POST, a
    background task (``check_agent_job``) whose page leads back here with ``?task=ID``: the report
    of ``conformance.check_agent_sync`` with every finding and probe."""
    result = None
    if request.method == "POST":
        form = CheckAgentForm(request.POST)
        if form.is_valid():
            params = {"agent_url": form.cleaned_data["agent_url"], "timeout_s": form.cleaned_data["timeout_s"]}
            try:
                task, _ = background.start(BackgroundTask.Kind.CHECK_AGENT, request.user, params)
            except background.TooManyTasks as exc:
                form.add_error(None, str(exc))
            else:
                if not task.is_finished:
                    return redirect(reverse("task", args=[task.pk]))
                result = _finished_check(request, form, task)  # ran inline (GYMWEB_TASKS_INLINE)
    else:
        task = None
        if request.GET.get("task", "").isdigit():
            task = BackgroundTask.objects.filter(
                pk=int(request.GET["task"]), user=request.user, kind=BackgroundTask.Kind.CHECK_AGENT
            ).first()
        if task is not None and task.status == BackgroundTask.Status.DONE:
            form = CheckAgentForm(initial=task.params)
            result = _finished_check(request, form, task)
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
