"""Who may see what, and the one way a run is launched from the new-run form.

``run_for``: the run of a page or an API route, if the user may see it: a run of one of their teams
(``rollouts.teams``; a superuser sees every run), else 404, never 403, so a run of another team is
not revealed. ``queue_for``/``label_for``: a review queue or label by the same rule. ``runs_for``/
``datasets_for``/``queues_for``/``labels_for``: the lists a user sees (runs list, pickers, the API's lists). One
place for that rule. ``launch_from_form``: the new-run form's (and
``POST /api/v1/runs``'s) dataset and run stored and launched, all or nothing.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404
from django.utils.html import escape

from rollouts import teams
from rollouts.collection import runs, streamed_upload
from rollouts.models import Dataset, Label, ReviewQueue, Rollout, Run
from rollouts.web.forms import RunForm


def runs_for(user):
    """The runs ``user`` may see and act on (a queryset; ``rollouts.teams.visible_runs``)."""
    return teams.visible_runs(user)


def datasets_for(user):
    """The datasets ``user`` may see and reuse (a queryset; ``rollouts.teams.visible_datasets``)."""
    return teams.visible_datasets(user)


def run_for(request, run_id: int) -> Run:
    """The run, if ``request.user`` may see it (a run of one of their teams; any run for a
    superuser); 404 otherwise, as for a run that does not exist. Its dataset, creator and the run
    it re-scores come with it (one query)."""
    return get_object_or_404(
        runs_for(request.user).select_related("dataset", "created_by", "reverified_from"), pk=run_id
    )


def rollout_for(request, run_id: int, rollout_id: int) -> Rollout:
    """The rollout of that run, if ``request.user`` may see the run (``run_for``'s rule); 404
    otherwise. Its run and task come with it."""
    return get_object_or_404(
        Rollout.objects.select_related("run", "task").filter(run__in=runs_for(request.user)),
        pk=rollout_id,
        run_id=run_id,
    )


def dataset_for(request, dataset_id: int) -> Dataset:
    """The dataset, if ``request.user`` may see it (the runs' rule); 404 otherwise."""
    return get_object_or_404(datasets_for(request.user), pk=dataset_id)


def queues_for(user):
    """The review queues ``user`` may see (a queryset; ``rollouts.teams.visible_queues``)."""
    return teams.visible_queues(user)


def queue_for(request, queue_id: int) -> ReviewQueue:
    """The review queue, if ``request.user`` may see it (a queue of one of their teams); 404
    otherwise, as for a queue that does not exist. Its team comes with it."""
    return get_object_or_404(queues_for(request.user).select_related("team", "created_by"), pk=queue_id)


def labels_for(user):
    """The review labels ``user`` may see and use (a queryset; ``rollouts.teams.visible_labels``)."""
    return teams.visible_labels(user)


def label_for(request, label_id: int) -> Label:
    """The label, if it is in one of ``request.user``'s teams' sets; 404 otherwise."""
    return get_object_or_404(labels_for(request.user), pk=label_id)


def launch_from_form(form: RunForm, user, **run_fields: Any) -> tuple[Run, bool]:
    """Store the dataset (for an upload; an identical earlier upload of the same user is reused
    instead) and the run, and launch it: all or nothing. An upload (validated by the form) is read
    again and stored in bounded memory, in short transactions (``streamed_upload``), shown nowhere
    until its last batch is in; so is a run over a stored dataset (its rows read in batches).
    ``run_fields``: more ``Run`` fields than the form's. Returns the run and whether an earlier
    upload was reused."""
    team = form.cleaned_data.get("team")  # None: the dataset's team, else the user's first
    options = {**form.run_options(), **run_fields}
    if form.found is not None:
        upload = form.cleaned_data["dataset_file"]
        run, reused = streamed_upload.store_and_create_run(
            upload,
            upload.name,
            form.found,
            dataset_name=form.dataset_name(),
            run_name=form.cleaned_data["name"] or form.dataset_name(),
            user=user,
            team=team,
            max_line_bytes=int(settings.GYMWEB_MAX_LINE_BYTES),
            **options,
        )
        runs.launch(run)  # marked running: the workers pick it up
        return run, reused
    run = streamed_upload.create_run_from_dataset(
        form.cleaned_data["dataset"],
        name=form.cleaned_data["name"] or form.dataset_name(),
        user=user,
        team=team,
        **options,
    )
    runs.launch(run)  # marked running: the workers pick it up
    return run, False


class NoTeamMiddleware:
    """A page that would make a run, dataset or queue for a user in no team (``teams.NoTeam``,
    raised before anything is stored) answers 400 saying so, not a 500."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, teams.NoTeam):
            return HttpResponseBadRequest(escape(str(exception)), content_type="text/plain; charset=utf-8")
        return None
