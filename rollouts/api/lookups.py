"""What the API's routes look up: page bounds, the runs, datasets and rollouts the token's user may
see (the pages' access rule, review queues too, ``rollouts.web.access``: their teams' rows, 404 for another team's),
a run's rollouts under the run table's filter."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from ninja import Query

from rollouts.api.errors import form_error
from rollouts.models import Dataset, ReviewQueue, Rollout, Run
from rollouts.review.query import filtered_rollouts
from rollouts.web import access

MAX_PAGE = 1000
MAX_OFFSET = 10**12  # past any table; larger ones would overflow the database's bigint (a 500)
OFFSET = Query(0, ge=0, le=MAX_OFFSET, description="rows to skip (0 to 10^12)")


def limit_query(default: int) -> Any:
    """A list route's ``limit``: rows per answer, at least 1 (less is a 400 naming it); the route
    answers at most ``MAX_PAGE`` (``page_limit``), as it always has, so a script asking for more
    gets a full page, not an error."""
    described = f"rows per answer (at least 1, default {default}; more than {MAX_PAGE} gives {MAX_PAGE})"
    return Query(default, ge=1, description=described)


def page_limit(limit: int) -> int:
    """The rows a list route answers for ``limit`` (already at least 1): at most ``MAX_PAGE``."""
    return min(limit, MAX_PAGE)


def rollout_for(request, rollout_id: int) -> Rollout:
    """The rollout, if the token's user may see its run (the pages' rule); 404 otherwise."""
    return get_object_or_404(
        Rollout.objects.select_related("run", "task").filter(run__in=access.runs_for(request.user)), pk=rollout_id
    )


def dataset_for(request, dataset_id: int) -> Dataset:
    """The dataset, if the token's user may see it (a dataset of their teams); 404 otherwise."""
    return access.dataset_for(request, dataset_id)


def queue_for(request, queue_id: int) -> ReviewQueue:
    """The review queue, if the token's user may see it (a queue of their teams); 404 otherwise."""
    return access.queue_for(request, queue_id)


def runs_for(request):
    """The runs the token's user sees (the runs list's rule), a queryset."""
    return access.runs_for(request.user)


def datasets_for(request):
    """The datasets the token's user sees, a queryset."""
    return access.datasets_for(request.user)


def filtered(request, run: Run):
    """The run's rollouts under the querystring's filter (the run table's); 400 on an invalid value."""
    qs, form = filtered_rollouts(run, request.GET)
    if form.errors:
        raise form_error(form)
    return qs, form
