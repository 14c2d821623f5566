"""The API's review queue and rubric routes (registered on ``rollouts.api.router.api``): queues
(list, create, add rollouts, next unreviewed, progress; ``rollouts.review.queues``) and the label
set's rubric and its answers (``rollouts.review.rubric``). A queue is looked up by the pages' rule
(another team's queue: 404)."""

from __future__ import annotations

from django.http import QueryDict
from ninja.errors import HttpError
from ninja.responses import Status

from rollouts.api.errors import form_error, review_error
from rollouts.api.lookups import queue_for, rollout_for, runs_for
from rollouts.api.router import api
from rollouts.api.schemas import (
    Error,
    NewQueueIn,
    QueueAddedOut,
    QueueAddIn,
    QueueNextIn,
    QueueNextOut,
    QueueOut,
    QueueProgressOut,
    RubricAnswerIn,
    RubricAnswerOut,
    RubricIn,
    RubricOut,
)
from rollouts.models import QueueEntry, ReviewQueue, Rollout
from rollouts.review import queues, rubric
from rollouts.review.actions import ReviewError
from rollouts.review.query import FILTER_FIELDS, filtered_rollouts, unknown_filter_names
from rollouts.web.access import queues_for, run_for


def _queue_out(queue: ReviewQueue, reviewed: int, total: int) -> dict:
    return {
        "id": queue.pk,
        "name": queue.name,
        "team": queue.team.name,
        "created": queue.created,
        "created_by": queue.created_by.get_username() if queue.created_by else None,
        "reviewed": reviewed,
        "total": total,
        "url": queue.get_absolute_url(),
    }


@api.get("/queues", response=list[QueueOut], summary="List the review queues of the token user's teams")
def list_queues(request):
    rows = queues.with_counts(queues_for(request.user).select_related("team", "created_by"))
    return [_queue_out(q, q.n_reviewed, q.n_total) for q in rows]


@api.post("/queues", response={201: QueueOut, 400: Error}, summary="Make a review queue")
def create_queue(request, payload: NewQueueIn):
    try:
        queue = queues.create_queue(payload.name, request.user, payload.team)
    except ReviewError as exc:
        raise review_error(exc) from None
    return Status(201, _queue_out(queue, 0, 0))


@api.post(
    "/queues/{queue_id}/rollouts",
    response={200: QueueAddedOut, 400: Error},
    summary="Add rollouts to a review queue (by id, or a run's filtered list)",
)
def add_rollouts(request, queue_id: int, payload: QueueAddIn):
    """Either ``rollouts`` (ids) or ``run`` with the run table's ``filter``; rollouts of runs of
    another team than the queue's are refused (400) and nothing is added. At most 10,000 at once."""
    queue = queue_for(request, queue_id)
    if (payload.run is None) == (not payload.rollouts):
        raise review_error(ReviewError("give either `rollouts` (ids) or `run` (with its `filter`)", "rollouts"))
    if payload.run is not None:
        run = run_for(request, payload.run)
        params = QueryDict(payload.filter)
        unknown = unknown_filter_names(params)
        if unknown:  # a typo would add the whole run
            names = ", ".join(map(repr, unknown))
            raise review_error(ReviewError(f"unknown filter {names} (filters: {', '.join(FILTER_FIELDS)})", "filter"))
        qs, form = filtered_rollouts(run, params)
        if form.errors:
            raise form_error(form)
    else:
        ids = list(dict.fromkeys(payload.rollouts))
        visible = Rollout.objects.filter(pk__in=ids, run__in=runs_for(request))
        missing = sorted(set(ids) - set(visible.values_list("id", flat=True)))
        if missing:
            shown = ", ".join(str(i) for i in missing[:10])
            raise review_error(
                ReviewError(f"no rollout {shown} (or not visible to you): nothing was added", "rollouts")
            )
        qs = visible
    try:
        added = queues.add_rollouts(queue, qs, request.user)
    except ReviewError as exc:
        raise review_error(exc) from None
    return {"added": added.added, "already": added.already}


@api.get("/queues/{queue_id}/progress", response=QueueProgressOut, summary="A review queue's progress")
def queue_progress(request, queue_id: int):
    """Reviewed of total, and per assignee (``user`` null: the unassigned entries)."""
    done = queues.progress(queue_for(request, queue_id))
    return {"reviewed": done.reviewed, "total": done.total, "assignees": done.rows}


@api.post("/queues/{queue_id}/next", response=QueueNextOut, summary="The next unreviewed rollout of a queue for you")
def queue_next(request, queue_id: int, payload: QueueNextIn | None = None):
    """The token user's own unreviewed entries first, then an unassigned one (assigned to them as
    it is handed out); never another user's. ``done``: a rollout of the queue to count as reviewed
    first. ``entry`` null: nothing left for this user."""
    queue = queue_for(request, queue_id)
    if payload is not None and payload.done is not None:
        entry = queues.entry_for(queue, payload.done)
        if entry is not None:
            queues.mark_reviewed(queue, entry.rollout, request.user)
    entry = queues.next_entry(queue, request.user)
    left = QueueEntry.objects.filter(queue=queue, reviewed_at__isnull=True).count()
    if entry is None:
        return {"entry": None, "rollout": None, "run": None, "url": None, "left": left}
    return {
        "entry": entry.pk,
        "rollout": entry.rollout_id,
        "run": entry.rollout.run_id,
        "url": queues.rollout_url(queue.pk, entry.rollout),
        "left": left,
    }


@api.get("/rubric", response=RubricOut, summary="The label set's rubric")
def get_rubric(request):
    definition = rubric.definition_of(rubric.current())
    return {"fields": [f.model_dump() for f in definition.fields] if definition else []}


@api.put("/rubric", response={200: RubricOut, 400: Error, 403: Error}, summary="Set the label set's rubric")
def put_rubric(request, payload: RubricIn):
    """Score ranges (``min``, ``max``) or ``choices``; a bad field is named (400) and the rubric in
    force stays. Earlier answers keep the rubric they were given against. Staff only (403): the
    rubric is every team's."""
    if not rubric.may_edit(request.user):
        raise HttpError(403, rubric.STAFF_ONLY)
    try:
        row = rubric.set_rubric({"fields": payload.fields} if payload.fields else None, request.user)
    except ReviewError as exc:
        raise review_error(exc) from None
    definition = rubric.definition_of(row)
    return {"fields": [f.model_dump() for f in definition.fields] if definition else []}


@api.put(
    "/rollouts/{rollout_id}/rubric",
    response={200: RubricAnswerOut, 400: Error},
    summary="Answer the rubric for a rollout",
)
def answer_rubric(request, rollout_id: int, payload: RubricAnswerIn):
    """The token user's answers (replacing theirs); each checked against the rubric in force: an
    unknown or missing field, a score out of range or a choice not offered is a 400 naming it."""
    rollout = rollout_for(request, rollout_id)
    try:
        answer = rubric.save_answer(rollout, request.user, payload.values)
    except ReviewError as exc:
        raise review_error(exc) from None
    return {"by": request.user.get_username(), "at": answer.updated, "values": rubric.answer_values(answer)}
