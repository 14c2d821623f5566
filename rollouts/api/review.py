"""The API's review routes (registered on ``rollouts.api.router.api``): labels, notes and corrected
rewards on a rollout (``rollouts.review.actions``), and the user's teams' label sets."""

from __future__ import annotations

from ninja.responses import Status

from rollouts.api.errors import review_error
from rollouts.api.lookups import rollout_for
from rollouts.api.payloads import rollout_detail
from rollouts.api.router import api
from rollouts.api.schemas import CorrectionIn, Error, LabelIn, LabelOut, NewLabelIn, NoteIn, NoteOut, RolloutDetailOut
from rollouts.models import Label
from rollouts.review import actions
from rollouts.review.actions import ReviewError
from rollouts.teams import NO_TEAM, choosable_teams, not_yours, visible_labels


@api.post(
    "/rollouts/{rollout_id}/labels", response={200: RolloutDetailOut, 400: Error}, summary="Put a label on a rollout"
)
def add_label(request, rollout_id: int, payload: LabelIn):
    rollout = rollout_for(request, rollout_id)
    try:
        actions.set_label(rollout, actions.find_label(payload.label, team_id=rollout.run.team_id), True, request.user)
    except ReviewError as exc:
        raise review_error(exc) from None
    return rollout_detail(request, rollout)


@api.delete(
    "/rollouts/{rollout_id}/labels/{label}",
    response={200: RolloutDetailOut, 400: Error},
    summary="Take a label off a rollout",
)
def remove_label(request, rollout_id: int, label: str):
    rollout = rollout_for(request, rollout_id)
    try:
        actions.set_label(rollout, actions.find_label(label, team_id=rollout.run.team_id), False, request.user)
    except ReviewError as exc:
        raise review_error(exc) from None
    return rollout_detail(request, rollout)


@api.post(
    "/rollouts/{rollout_id}/notes",
    response={201: NoteOut, 400: Error},
    summary="Add a note to a rollout or one of its items",
)
def add_note(request, rollout_id: int, payload: NoteIn):
    rollout = rollout_for(request, rollout_id)
    try:
        note = actions.add_note(rollout, payload.text, request.user, item=payload.item)
    except ReviewError as exc:
        raise review_error(exc) from None
    return Status(
        201,
        {
            "id": note.pk,
            "text": note.text,
            "item": note.item_seq,
            "by": request.user.get_username(),
            "at": note.created,
        },
    )


@api.post(
    "/rollouts/{rollout_id}/correction",
    response={200: RolloutDetailOut, 400: Error},
    summary="Record a corrected reward",
)
def correct(request, rollout_id: int, payload: CorrectionIn):
    """Kept beside the env's reward, never replacing it; the reason is required."""
    rollout = rollout_for(request, rollout_id)
    try:
        actions.correct_reward(rollout, payload.reward, payload.reason, request.user)
    except ReviewError as exc:
        raise review_error(exc) from None
    return rollout_detail(request, rollout)


@api.delete("/rollouts/{rollout_id}/correction", response=RolloutDetailOut, summary="Withdraw the corrected reward")
def withdraw(request, rollout_id: int, reason: str = ""):
    rollout = rollout_for(request, rollout_id)
    actions.withdraw_correction(rollout, request.user, reason)
    return rollout_detail(request, rollout)


@api.get(
    "/labels",
    response=list[LabelOut],
    summary="Your teams' labels, by team and in order (the first nine of a team answer keys 1–9)",
)
def list_labels(request):
    return [_label_out(lab) for lab in visible_labels(request.user).order_by("team_id", "position", "id")]


@api.post("/labels", response={201: LabelOut, 400: Error}, summary="Add a label")
def create_label(request, payload: NewLabelIn):
    try:
        mine = choosable_teams(request.user)
        team_id = (
            mine.filter(pk=payload.team).values_list("pk", flat=True).first() if payload.team is not None else None
        )
        if payload.team is not None and team_id is None:
            raise ReviewError(not_yours(request.user, payload.team), "team")
        team_id = team_id or mine.values_list("pk", flat=True).first()
        if team_id is None:
            raise ReviewError(NO_TEAM, "team")
        lab = actions.create_label(payload.name, payload.description, request.user, team_id=team_id)
    except ReviewError as exc:
        raise review_error(exc) from None
    return Status(201, _label_out(lab))


def _label_out(lab: Label) -> dict:
    return {"name": lab.name, "description": lab.description, "position": lab.position, "team": lab.team_id}
