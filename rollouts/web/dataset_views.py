"""Stored datasets: renaming one (a small form under the new-run form's dataset choice)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseForbidden
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from rollouts import teams
from rollouts.web.forms import DatasetRenameForm


def may_rename(user, dataset) -> bool:
    """Whoever stored the dataset renames it; staff rename any."""
    return bool(user.is_staff or (dataset.created_by_id is not None and dataset.created_by_id == user.pk))


@login_required
@require_POST
def dataset_rename(request):
    """POST ``dataset`` (id) and ``name``: give a stored dataset a new name (its source name is
    kept). Redirects to the new-run form with that dataset chosen; an invalid form redirects there
    with the problem as a message; 403 for a dataset the user did not store (unless staff)."""
    form = DatasetRenameForm(request.POST, queryset=teams.visible_datasets(request.user))  # another team's: invalid
    if not form.is_valid():
        problems = "; ".join(str(e) for errors in form.errors.values() for e in errors)
        messages.error(request, f"The dataset was not renamed: {problems}")
        return redirect("run_new")
    dataset = form.cleaned_data["dataset"]
    if not may_rename(request.user, dataset):
        return HttpResponseForbidden("Only the user who stored this dataset (or staff) can rename it.")
    old = dataset.name
    dataset.name = form.cleaned_data["name"]
    dataset.save(update_fields=["name"])
    messages.success(request, f"Dataset #{dataset.pk} “{old}” is now “{dataset.name}”.")
    return redirect(reverse("run_new") + f"?dataset={dataset.pk}")
