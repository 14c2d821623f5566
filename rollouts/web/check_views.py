"""The agent check page: a form for an agent's URL and, on POST, the conformance report
(``evaluation.conformance.check_agent_sync``) with every finding and probe.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from rollouts import targets
from rollouts.collection import environments
from rollouts.engine.loop import InvalidBaseURL
from rollouts.evaluation.conformance import DEFAULT_SLOW_S, check_agent_sync
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
