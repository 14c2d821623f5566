"""Review mode's progress, kept per user and per list ("12 of 40 reviewed").

A *list* is a run's rollouts under one filter: its key is the filter's canonical querystring
without the sort (``RolloutFilterForm.querystring``), so the same filter sorted differently is the
same list. A rollout is *reviewed* in a list once the user moved past it with ``j`` (or "next"),
or labelled, noted or corrected it while reviewing that list. Progress counts the reviewed
rollouts that are in the list now (a label can move a rollout out of a list filtered by label).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from rollouts.models import ReviewList, ReviewMark, Rollout, Run


def list_key(form) -> str:
    """The list's key: the valid filter values as a querystring, sort left out."""
    return form.querystring(sort="")


def get_list(user, run: Run, form, create: bool = True) -> ReviewList | None:
    """The user's review list for ``run`` under ``form``'s filter (created when asked)."""
    key = list_key(form)[:2000]
    if not create:
        return ReviewList.objects.filter(user=user, run=run, filters=key).first()
    try:
        with transaction.atomic():
            review_list, _ = ReviewList.objects.get_or_create(user=user, run=run, filters=key)
    except IntegrityError:  # created at the same moment by another request of this user
        review_list = ReviewList.objects.get(user=user, run=run, filters=key)
    return review_list


def mark(review_list: ReviewList, rollout: Rollout) -> None:
    """Count ``rollout`` as reviewed in ``review_list`` (idempotent)."""
    try:
        with transaction.atomic():
            ReviewMark.objects.get_or_create(review_list=review_list, rollout=rollout)
    except IntegrityError:
        pass
    ReviewList.objects.filter(pk=review_list.pk).update(updated=timezone.now())


def progress(review_list: ReviewList | None, rollouts: QuerySet) -> tuple[int, int]:
    """``(reviewed, total)`` for the list's rollouts ``rollouts`` (the filtered queryset)."""
    total = rollouts.order_by().count()
    if review_list is None or not total:
        return 0, total
    reviewed = ReviewMark.objects.filter(
        review_list=review_list, rollout_id__in=rollouts.order_by().values("id")
    ).count()
    return reviewed, total


def first_unreviewed(review_list: ReviewList | None, rollouts: QuerySet) -> int | None:
    """The id of the first rollout of the (sorted) list not reviewed yet; None when all are."""
    if review_list is not None:
        rollouts = rollouts.exclude(id__in=ReviewMark.objects.filter(review_list=review_list).values("rollout_id"))
    return rollouts.values_list("id", flat=True).first()


def reset(review_list: ReviewList) -> int:
    """Forget the list's marks (review it again). Returns how many were dropped."""
    return ReviewMark.objects.filter(review_list=review_list).delete()[0]
