"""Renaming a run from its page (the header's small rename form)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from rollouts.collection.run_names import clean_name
from rollouts.models import Run
from rollouts.web.access import run_for


@login_required
@require_POST
def run_rename(request, run_id):
    """``POST name=…``: the run's new name (stripped, 1 to 200 characters); any user who may see
    the run may rename it, as with the run's other actions. Redirects to the run page, saying what
    happened."""
    run = run_for(request, run_id)
    try:
        name = clean_name(request.POST.get("name", ""))
    except ValueError as exc:
        messages.error(request, str(exc))
    else:
        Run.objects.filter(pk=run.pk).update(name=name)
        messages.success(request, f"Renamed to “{name}”.")
    return HttpResponseRedirect(reverse("run", args=[run.pk]))
