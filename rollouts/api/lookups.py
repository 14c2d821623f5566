"""What the API's routes look up: page bounds, a rollout the token's user may see (the pages'
access rule), a run's rollouts under the run table's filter."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from ninja import Query

from rollouts.api.errors import form_error
from rollouts.models import Rollout, Run
from rollouts.review.query import filtered_rollouts
from rollouts.web.access import run_for

MAX_PAGE = 1000
MAX_OFFSET = 10**12  # past any table; larger ones would overflow the database's bigint (a 500)
OFFSET = Query(0, ge=0, le=MAX_OFFSET, description="rows to skip (0 to 10^12)")


def rollout_for(request, rollout_id: int) -> Rollout:
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id)
    run_for(request, rollout.run_id)  # the same access rule as the pages
    return rollout


def filtered(request, run: Run):
    """The run's rollouts under the querystring's filter (the run table's); 400 on an invalid value."""
    qs, form = filtered_rollouts(run, request.GET)
    if form.errors:
        raise form_error(form)
    return qs, form
