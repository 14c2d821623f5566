"""The Environments page (every environment gymweb knows: registered NeMo Gym head servers and the
env URLs of past runs, with health, tools and runs) and a run's settings as a NeMo Gym config."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_safe

from rollouts.collection import environments
from rollouts.downloads import bytes_download
from rollouts.teams import visible_runs
from rollouts.web.access import run_for


@login_required
@require_http_methods(["GET", "POST"])
def environments_page(request):
    """GET: the listing; POST ``head_url``: register a running head server (it must answer)."""
    context = {"head_error": "", "head_url_value": ""}
    if request.method == "POST":
        url = (request.POST.get("head_url") or "").strip()[:2000]
        try:
            head = environments.fetch_head(url)
        except environments.HeadServerError as exc:
            context.update(head_error=str(exc), head_url_value=url)
        else:
            environments.register_head(head.url)
            messages.success(request, f"Registered the head server {head.url}.")
            return redirect("environments")
    heads, past = environments.known_environments(runs=visible_runs(request.user))
    context.update(heads=heads, past=past)
    return render(request, "rollouts/environments.html", context, status=400 if context["head_error"] else 200)


@login_required
@require_safe
def run_nemo_config(request, run_id):
    """The run's settings as a NeMo Gym config (YAML) for ``gym env start`` + ``gym eval run``."""
    run = run_for(request, run_id)
    text = environments.run_config(run)
    return bytes_download(text, f"run_{run.pk}_nemo_gym.yaml", "application/yaml")
