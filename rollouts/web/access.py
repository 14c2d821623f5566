"""Who may see what, and the one way a run is launched from the new-run form.

``run_for``: the run of a page or an API route, if the user may see it (every signed-in user sees
every run: one team per instance); one place to change that rule. ``launch_from_form``: the new-run
form's (and ``POST /api/v1/runs``'s) dataset and run stored and launched, all or nothing.
"""

from __future__ import annotations

from django.db import transaction
from django.shortcuts import get_object_or_404

from rollouts.collection import runs
from rollouts.models import Run
from rollouts.web.forms import RunForm


def run_for(request, run_id: int) -> Run:
    """The run, if this user may see it (every signed-in user may; one place to change that); 404
    otherwise. Its dataset, creator and the run it re-scores come with it (one query)."""
    return get_object_or_404(Run.objects.select_related("dataset", "created_by", "reverified_from"), pk=run_id)


def launch_from_form(form: RunForm, user) -> tuple[Run, bool]:
    """Store the dataset (for an upload; an identical earlier upload of the same user is reused
    instead) and the run, and launch it: all or nothing. Returns the run and whether an earlier
    upload was reused."""
    reused = False
    with transaction.atomic():
        if form.parsed is not None:
            dataset, reused = runs.store_or_reuse_dataset(form.parsed, form.dataset_name(), user)
            parsed = form.parsed
        else:
            dataset = form.cleaned_data["dataset"]
            parsed = runs.load_dataset(dataset)
        run = runs.create_run(
            parsed,
            name=form.cleaned_data["name"] or form.dataset_name(),
            user=user,
            dataset=dataset,
            **form.run_options(),
        )
        runs.launch(run)  # marked running: the workers pick it up
    return run, reused
