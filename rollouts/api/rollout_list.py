"""The API's rollout list (registered on ``rollouts.api.router.api``): a run's rollouts under the run
table's filter, a page at a time."""

from __future__ import annotations

from django.db.models.functions import Substr

from rollouts.api.lookups import OFFSET, filtered, limit_query, page_limit
from rollouts.api.payloads import rollout_out
from rollouts.api.router import api
from rollouts.api.schemas import Error, RolloutPage
from rollouts.lossless import LosslessTextField
from rollouts.models import Rollout
from rollouts.review import actions
from rollouts.review.filters import corrected_reward
from rollouts.web.access import run_for


@api.get(
    "/runs/{run_id}/rollouts",
    response={200: RolloutPage, 400: Error},
    summary="List a run's rollouts, filtered like the run page",
)
def list_rollouts(
    request,
    run_id: int,
    limit: int = limit_query(100),
    offset: int = OFFSET,
    status: str = "",
    kind: str = "",
    reward_min: float | None = None,
    reward_max: float | None = None,
    task: int | None = None,
    sort: str = "",
    label: str = "",
    not_label: str = "",
    notes: str = "",
    corrected: str = "",
    reward_source: str = "",
    text: str = "",
    tool: str = "",
    output: str = "",
    error: str = "",
):
    """Every filter of the run page's table (and any it gains): the querystring is read by the same
    form, so an invalid value is a 400 naming it. Ordered like the table (``sort``). Content search
    (``rollouts.search``): ``text`` in any item, ``tool`` called (exact name), ``output`` in a tool
    output, ``error`` in the failure message; case-insensitive substrings."""
    run = run_for(request, run_id)
    limit = page_limit(limit)
    qs, _form = filtered(request, run)
    count = qs.order_by().count()
    ids = list(qs.values_list("id", flat=True)[offset : offset + limit])
    loaded = (
        Rollout.objects.filter(id__in=ids)
        .annotate(error_head=Substr("error", 1, 500, output_field=LosslessTextField()), corrected=corrected_reward())
        .defer("verify_json", "profile_json", "partial_response_json")
        .in_bulk()
    )
    page = [loaded[i] for i in ids if i in loaded]
    actions.attach_to_rows(page)
    items = [rollout_out(request, r, r.review_label_names, r.review_note_count, r.corrected) for r in page]
    return {"count": count, "offset": offset, "limit": limit, "items": items}
