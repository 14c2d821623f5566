"""Previous/next on the trajectory page: the run page's filter and order, read from the querystring
the run page links with (``status``, ``kind``, ``reward_min``, ``reward_max``, ``task``, ``sort``),
so previous/next walk the list the user was looking at. Unknown parameters and unusable values are
ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, F, Max, OrderBy, Q, QuerySet, Window
from django.db.models.functions import Lag, Lead, RowNumber

from rollouts.models import Rollout, Run
from rollouts.review.query import FILTER_FIELDS, filtered_rollouts

# -- the run page's filter, in SQL ---------------------------------------------------------------
# The run page's own reader of its querystring (``forms.filtered_rollouts``) decides the list, so
# previous/next walk exactly the rows the user saw; invalid values are ignored there.
FILTER_PARAMS = FILTER_FIELDS


def filter_querystring(params: Mapping[str, Any]) -> str:
    """The run-page filter part of a querystring (known parameters with values only; anything
    else dropped), ``""`` when there is none; safe to append after ``?``."""
    pairs: list[tuple[str, Any]] = []
    getlist = getattr(params, "getlist", None)
    for name in FILTER_PARAMS:
        values = getlist(name) if getlist else ([params[name]] if name in params else [])
        pairs.extend((name, v) for v in values[:1] if str(v).strip())
    # the chosen columns and the task/verify field filters (``cols``, ``f.<field>``)
    for name in params:
        if (name == "cols" or str(name).startswith("f.")) and str(params[name]).strip():
            pairs.append((name, params[name]))
    return urlencode(pairs)


def filter_rollouts(run: Run, params: Mapping[str, Any]) -> QuerySet:
    """The run's rollouts filtered and sorted like the run page does for querystring ``params``
    (unknown parameters and invalid values ignored)."""
    qs, _form = filtered_rollouts(run, params)
    return qs


def _after(order: list[str], values: dict[str, Any], forward: bool) -> Q:
    """Rows strictly after (or before) ``values`` in ``order`` (keyset comparison, no NULLs)."""
    result, equal = Q(), Q()
    for key in order:
        field = key.lstrip("-")
        ascending = not key.startswith("-")
        op = "gt" if ascending == forward else "lt"
        result |= equal & Q(**{f"{field}__{op}": values[field]})
        equal &= Q(**{field: values[field]})
    return result


def _order_key(term: Any) -> str:
    """An order_by term (``"-reward"``, ``F("reward")``, ``F("reward").desc()``) as ``"-reward"``."""
    if isinstance(term, str):
        return term
    if isinstance(term, OrderBy):
        return ("-" if term.descending else "") + term.expression.name
    return term.name


def neighbours(rollout: Rollout, params: Mapping[str, Any]) -> dict[str, Any]:
    """Previous/next rollout ids of ``rollout`` in its run's filtered, sorted list, its 1-based
    position and the list's length. ``position`` is None when the rollout is not in the list.

    Keyset queries on the run's indexes (a handful of small queries), so a run of 50,000 rollouts
    costs what a run of 50 does; a window-function query over the whole list is the fallback when
    a sort key of this rollout is NULL (keyset comparisons cannot order NULLs).
    """
    qs = filter_rollouts(rollout.run, params)
    order = [_order_key(o) for o in (qs.query.order_by or ["task_index", "rollout_index", "attempt", "id"])]
    if not any(o.lstrip("-") == "id" for o in order):
        order.append("id")
    if any(o.lstrip("-").startswith(("_sort_", "_kv_")) for o in order):  # a task or verify field's sort
        return _neighbours_by_window(qs, list(qs.query.order_by), rollout.pk)
    values = {o.lstrip("-"): getattr(rollout, o.lstrip("-")) for o in order}
    if any(v is None for v in values.values()):
        return _neighbours_by_window(qs, list(qs.query.order_by) or order, rollout.pk)
    counts = qs.order_by().aggregate(
        total=Count("id"),
        here=Count("id", filter=Q(pk=rollout.pk)),
        before=Count("id", filter=_after(order, values, False)),
    )
    if not counts["here"]:
        return {"prev_id": None, "next_id": None, "position": None, "total": counts["total"]}
    reverse_order = [o[1:] if o.startswith("-") else f"-{o}" for o in order]
    next_id = qs.filter(_after(order, values, True)).order_by(*order).values_list("id", flat=True).first()
    prev_id = qs.filter(_after(order, values, False)).order_by(*reverse_order).values_list("id", flat=True).first()
    return {"prev_id": prev_id, "next_id": next_id, "position": counts["before"] + 1, "total": counts["total"]}


def _neighbours_by_window(qs: QuerySet, order: list[str], rollout_id: int) -> dict[str, Any]:
    row = (
        qs.order_by()
        .annotate(
            prev_id=Window(Lag("id"), order_by=order),
            next_id=Window(Lead("id"), order_by=order),
            position=Window(RowNumber(), order_by=order),
            total=Window(Count("id")),
            # A filter on a plain column would apply before the windows are computed; this
            # window (equal to id) makes Django filter the windowed rows instead.
            this_id=Window(Max("id"), partition_by=[F("id")]),
        )
        .filter(this_id=rollout_id)
        .values("prev_id", "next_id", "position", "total")
        .first()
    )
    if row is None:
        return {"prev_id": None, "next_id": None, "position": None, "total": None}
    return row
