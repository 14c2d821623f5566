"""Labels, notes and corrected rewards: the writes of a review, each with who and when.

Views, the API and tests all go through these functions, so each rule lives here once. They raise
``ReviewError`` (a clear message naming the field) for bad input and store nothing then.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, Max, OuterRef, Subquery

from rollouts.models import Label, Note, RewardCorrection, Rollout, RolloutLabel, Run, Team, TrajectoryItem

LABEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}$")
NOTE_MAX_CHARS = 20_000
REASON_MAX_CHARS = 5_000
LABEL_DESCRIPTION_MAX_CHARS = 200  # Label.description's column
KEYED_LABELS = 9  # keys 1–9 in review mode
# The set every team starts with; migration 0012 stored it for the first team, and
# ``ensure_default_labels`` stores it for every team that has no label at all (a new team, a
# flushed database).
DEFAULT_LABELS = [
    ("good", "a trajectory worth training on"),
    ("bad", "a trajectory not to train on"),
    ("reward-hack", "the reward was earned by gaming the verifier"),
    ("verifier-wrong", "the verifier scored it wrongly: see the corrected reward"),
    ("env-bug", "the environment misbehaved"),
]


class ReviewError(ValueError):
    """Bad review input. ``field`` names the input at fault (``"label"``, ``"text"``, ``"item"``,
    ``"reward"``, ``"reason"``); ``str(exc)`` says what is wrong."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


# -- labels ------------------------------------------------------------------------------------
def clean_label_name(name: Any) -> str:
    """A label name as stored: trimmed, lower case, 1–40 of ``a-z 0-9 . _ -``, starting with a
    letter or digit (``reward-hack``). Raises ``ReviewError`` otherwise."""
    text = str(name or "").strip().lower()
    if not LABEL_NAME.fullmatch(text):
        raise ReviewError(
            f"label name {str(name)[:60]!r}: use 1–40 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit",
            "label",
        )
    return text


def ensure_default_labels(team: Team | None = None, **_kwargs) -> int:
    """Store ``DEFAULT_LABELS`` for ``team`` (None: every team) when it has no label at all (never
    brings back one a team removed from a set it has). Connected to ``post_migrate`` and to a new
    team's ``post_save``. Returns how many were made."""
    teams = (
        [team] if team is not None else list(Team.objects.exclude(Exists(Label.objects.filter(team=OuterRef("pk")))))
    )
    made = 0
    for t in teams:
        if team is not None and Label.objects.filter(team=t).exists():
            continue
        Label.objects.bulk_create(
            [Label(team=t, name=n, description=d, position=i) for i, (n, d) in enumerate(DEFAULT_LABELS)],
            ignore_conflicts=True,
        )
        made += len(DEFAULT_LABELS)
    return made


def labels_of(team_id: int):
    """The label set of the team ``team_id`` (a queryset, in key order)."""
    return Label.objects.filter(team_id=team_id).order_by("position", "id")


def create_label(name: Any, description: str = "", user=None, *, team_id: int) -> Label:
    """Add a label to the team ``team_id``'s set (placed last). Raises ``ReviewError`` for a bad or
    taken name or a description over 200 characters."""
    clean = clean_label_name(name)
    description = str(description or "").strip()
    if len(description) > LABEL_DESCRIPTION_MAX_CHARS:  # cut silently, it would be stored otherwise than typed
        raise ReviewError(
            f"the description has {len(description):,} characters; at most {LABEL_DESCRIPTION_MAX_CHARS}", "description"
        )
    if labels_of(team_id).filter(name=clean).exists():
        raise ReviewError(f"label {clean!r} exists already", "label")
    position = (labels_of(team_id).aggregate(m=Max("position"))["m"] or 0) + 1
    try:
        with transaction.atomic():
            return Label.objects.create(
                team_id=team_id, name=clean, description=description, position=position, created_by=user
            )
    except IntegrityError:  # created meanwhile by someone else
        raise ReviewError(f"label {clean!r} exists already", "label") from None


def move_label_up(label: Label) -> None:
    """Swap ``label`` with the one before it in its team's set (the first nine answer keys 1–9)."""
    labels = list(labels_of(label.team_id))
    i = next((n for n, lab in enumerate(labels) if lab.pk == label.pk), 0)
    if i == 0:
        return
    labels[i - 1], labels[i] = labels[i], labels[i - 1]
    with transaction.atomic():
        for position, lab in enumerate(labels):
            if lab.position != position:
                Label.objects.filter(pk=lab.pk).update(position=position)


def find_label(name: Any, *, team_id: int) -> Label:
    """The label called ``name`` in the team ``team_id``'s set; ``ReviewError`` when there is none
    (also for a name no label can have, such as one with a NUL, which PostgreSQL would refuse to
    look up). Another team's label of that name is not found."""
    text = str(name or "").strip().lower()
    if not LABEL_NAME.fullmatch(text):
        raise ReviewError(f"no label {str(name)[:60]!r}: label names are 1–40 of a-z 0-9 . _ -", "label")
    try:
        return labels_of(team_id).get(name=text)
    except Label.DoesNotExist:
        raise ReviewError(f"no label {str(name)[:60]!r} (add it on the Labels page first)", "label") from None


def set_label(rollout: Rollout, label: Label, on: bool, user=None) -> bool:
    """Put ``label`` on ``rollout`` (``on``) or take it off. Returns True when something changed.
    Raises ``ReviewError`` for a label of another team than the rollout's run."""
    if label.team_id != Run.objects.filter(pk=rollout.run_id).values_list("team_id", flat=True).first():
        raise ReviewError(f"no label {label.name!r} in this run's team", "label")
    if not on:
        return RolloutLabel.objects.filter(rollout=rollout, label=label).delete()[0] > 0
    try:
        with transaction.atomic():
            _, created = RolloutLabel.objects.get_or_create(rollout=rollout, label=label, defaults={"created_by": user})
    except IntegrityError:  # two clicks at once
        return False
    return created


def toggle_label(rollout: Rollout, label: Label, user=None) -> bool:
    """Flip ``label`` on ``rollout``; returns whether it is on afterwards."""
    on = not RolloutLabel.objects.filter(rollout=rollout, label=label).exists()
    set_label(rollout, label, on, user)
    return on


# -- notes -------------------------------------------------------------------------------------
def add_note(rollout: Rollout, text: Any, user=None, item: Any = None) -> Note:
    """A note on ``rollout``, or on its trajectory item ``#item`` (``TrajectoryItem.seq``). Plain
    text, 1–20,000 characters. Raises ``ReviewError`` (``text`` or ``item``)."""
    body = str(text or "").strip()
    if not body:
        raise ReviewError("the note is empty", "text")
    if len(body) > NOTE_MAX_CHARS:
        raise ReviewError(f"the note has {len(body):,} characters; at most {NOTE_MAX_CHARS:,}", "text")
    seq = None
    if item not in (None, ""):
        try:
            seq = int(str(item).strip().lstrip("#"))
        except ValueError:
            raise ReviewError(
                f"item {str(item)[:40]!r}: give the item's number (#N on the trajectory page)", "item"
            ) from None
        if seq < 0 or not TrajectoryItem.objects.filter(rollout=rollout, seq=seq).exists():
            raise ReviewError(f"this rollout has no item #{seq}", "item")
    return Note.objects.create(rollout=rollout, item_seq=seq, text=body, created_by=user)


def delete_note(note: Note, user) -> None:
    """Delete a note: its author (or a staff user) only. Raises ``ReviewError`` otherwise."""
    if note.created_by_id != getattr(user, "pk", None) and not getattr(user, "is_staff", False):
        raise ReviewError("only the note's author can delete it", "note")
    note.delete()


# -- corrected rewards -------------------------------------------------------------------------
def parse_reward(value: Any) -> float:
    """A finite number from a form or JSON value; ``ReviewError`` (``reward``) otherwise."""
    if isinstance(value, bool):
        raise ReviewError("the corrected reward must be a number", "reward")
    try:
        reward = float(str(value).strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ReviewError(f"the corrected reward must be a number, not {str(value)[:40]!r}", "reward") from None
    if not math.isfinite(reward):
        raise ReviewError("the corrected reward must be a finite number", "reward")
    return reward


def correct_reward(rollout: Rollout, reward: Any, reason: Any, user=None) -> RewardCorrection:
    """Record a corrected reward for a succeeded rollout, with a reason (required). The env's reward
    (``Rollout.reward``) is never touched; the newest correction is the one in force."""
    if rollout.status != Rollout.Status.SUCCEEDED:
        raise ReviewError(
            f"only a succeeded rollout has a verifier reward to correct (this one is {rollout.status}); label it instead",
            "reward",
        )
    value = parse_reward(reward)
    why = str(reason or "").strip()
    if not why:
        raise ReviewError("say why the reward is wrong (the reason is kept with the correction)", "reason")
    if len(why) > REASON_MAX_CHARS:
        raise ReviewError(f"the reason has {len(why):,} characters; at most {REASON_MAX_CHARS:,}", "reason")
    return RewardCorrection.objects.create(rollout=rollout, reward=value, reason=why, created_by=user)


def withdraw_correction(rollout: Rollout, user=None, reason: Any = "") -> RewardCorrection | None:
    """Withdraw the correction in force (a history row with no reward); None when there was none."""
    if current_correction(rollout) is None:
        return None
    return RewardCorrection.objects.create(
        rollout=rollout, reward=None, reason=str(reason or "").strip()[:REASON_MAX_CHARS], created_by=user
    )


def current_correction(rollout: Rollout) -> RewardCorrection | None:
    """The correction in force: the newest row, unless it withdrew the correction."""
    latest = RewardCorrection.objects.filter(rollout=rollout).select_related("created_by").order_by("-id").first()
    return latest if latest is not None and latest.reward is not None else None


# -- reading -----------------------------------------------------------------------------------
@dataclass
class ReviewState:
    """A rollout's review for its pages: every label with whether it is on (and by whom, when),
    its notes, the correction in force and the correction history (oldest first)."""

    labels: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    correction: RewardCorrection | None = None
    history: list[RewardCorrection] = field(default_factory=list)

    @property
    def on(self) -> list[dict[str, Any]]:
        return [entry for entry in self.labels if entry["on"]]


def review_state(rollout: Rollout) -> ReviewState:
    """Three small queries: the labels (each with this rollout's use of it: who, when), its notes,
    its corrections."""
    uses = RolloutLabel.objects.filter(rollout=rollout, label=OuterRef("pk"))
    rows = labels_of(rollout.run.team_id).annotate(
        use_at=Subquery(uses.values("created")[:1]),
        use_by=Subquery(uses.values("created_by__username")[:1]),
        used=Exists(uses),
    )
    labels = []
    for n, label in enumerate(rows):
        use = {"created": label.use_at, "by": label.use_by} if label.used else None
        labels.append(
            {"label": label, "on": use is not None, "use": use, "key": str(n + 1) if n < KEYED_LABELS else ""}
        )
    history = list(RewardCorrection.objects.filter(rollout=rollout).select_related("created_by").order_by("id"))
    current = history[-1] if history and history[-1].reward is not None else None
    return ReviewState(
        labels=labels,
        notes=list(Note.objects.filter(rollout=rollout).select_related("created_by")),
        correction=current,
        history=history,
    )


def attach_to_rows(rollouts: Iterable[Rollout]) -> None:
    """Set ``review_label_names`` (list) and ``review_note_count`` (int) on each rollout of a
    table page, in two queries whatever the page size."""
    rows = {r.pk: r for r in rollouts}
    for r in rows.values():
        r.review_label_names, r.review_note_count = [], 0
    if not rows:
        return
    for rollout_id, name in (
        RolloutLabel.objects.filter(rollout_id__in=list(rows))
        .order_by("label__position", "label_id")
        .values_list("rollout_id", "label__name")
    ):
        rows[rollout_id].review_label_names.append(name)
    for rollout_id, n in (
        Note.objects.filter(rollout_id__in=list(rows)).values_list("rollout_id").annotate(n=Count("id")).order_by()
    ):
        rows[rollout_id].review_note_count = n


def on_team_saved(sender, instance, created, raw=False, **_kwargs) -> None:
    """``post_save`` of ``Team``: a new team starts with the default label set."""
    if created and not raw:
        ensure_default_labels(instance)
