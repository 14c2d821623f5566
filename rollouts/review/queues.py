"""Review queues: a team's rollouts from any of its runs, to review one after another, with
assignment to a member of the team, "next unreviewed" and progress.

A queue belongs to one team and holds rollouts of that team's runs only (so whoever sees the queue
may see every rollout in it). "Next" gives the user's own unreviewed entries first (oldest added
first), then an unassigned one, which is assigned to the user as it is handed out (two reviewers
never get the same one). An entry is reviewed once its reviewer moves past it ("reviewed · next")
or labels, notes, corrects it or answers the rubric while reviewing the queue. Bad input raises
``ReviewError`` naming the field and stores nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from rollouts import teams
from rollouts.models import QueueEntry, ReviewQueue, Rollout
from rollouts.review.actions import ReviewError

NAME_MAX_CHARS = 200
MAX_ADD = 10_000  # rollouts one "add to queue" takes; a larger list is refused (narrow the filter)
UNASSIGNED = "unassigned"
QUEUE_PARAM = "queue"  # a rollout page opened from a queue: its review panel steps through the queue


ID_MAX = 2**63 - 1  # the largest id a database row can have (64-bit): larger ones name nothing


def rollout_url(queue_id: int, rollout: Rollout) -> str:
    """A rollout's page opened from a review queue (``?queue=ID``: the panel's queue mode)."""
    return reverse("rollout", args=[rollout.run_id, rollout.pk]) + f"?{QUEUE_PARAM}={queue_id}"


def create_queue(name: Any, user, team_id: Any = None) -> ReviewQueue:
    """A new queue named ``name`` in ``team_id`` (one of the user's teams; default their first).
    ``ReviewError`` (``name``, ``team``) otherwise."""
    clean = str(name or "").strip()
    if not clean:
        raise ReviewError("give the queue a name", "name")
    if len(clean) > NAME_MAX_CHARS:
        raise ReviewError(f"the name has {len(clean):,} characters; at most {NAME_MAX_CHARS}", "name")
    if team_id in (None, ""):
        try:
            team = teams.team_for_new(user)
        except teams.NoTeam as exc:
            raise ReviewError(str(exc), "team") from None
    else:
        try:
            team = int(team_id)
        except (TypeError, ValueError):
            raise ReviewError(f"team {str(team_id)[:20]!r}: give a team's id", "team") from None
        if not teams.choosable_teams(user).filter(pk=team).exists():
            raise ReviewError(teams.not_yours(user, team_id), "team")
    return ReviewQueue.objects.create(name=clean, team_id=team, created_by=user)


@dataclass
class Added:
    """What an add did: ``added`` new entries, ``already`` rollouts that were in the queue."""

    added: int
    already: int


def add_rollouts(queue: ReviewQueue, rollouts: QuerySet, user=None) -> Added:
    """Add the rollouts of ``rollouts`` (any runs of the queue's team; at most ``MAX_ADD``), in
    the list's order. Rollouts of another team's run are refused (``ReviewError``, ``rollouts``),
    and so is a list over ``MAX_ADD``; nothing is added then."""
    ids = list(rollouts.values_list("id", flat=True)[: MAX_ADD + 1])
    if len(ids) > MAX_ADD:
        raise ReviewError(
            f"the list has more than {MAX_ADD:,} rollouts: narrow the filter, nothing was added", "rollouts"
        )
    foreign = Rollout.objects.filter(pk__in=ids).exclude(run__team_id=queue.team_id).values_list("run_id", flat=True)
    first_foreign = foreign.first()
    if first_foreign is not None:
        raise ReviewError(
            f"run #{first_foreign} is not in the queue's team ({queue.team}): nothing was added", "rollouts"
        )
    have = set(QueueEntry.objects.filter(queue=queue, rollout_id__in=ids).values_list("rollout_id", flat=True))
    new = [i for i in dict.fromkeys(ids) if i not in have]
    with transaction.atomic():
        QueueEntry.objects.bulk_create(
            [QueueEntry(queue=queue, rollout_id=i, added_by=user) for i in new], ignore_conflicts=True
        )
    return Added(added=len(new), already=len(ids) - len(new))


def members(queue: ReviewQueue) -> QuerySet:
    """The users an entry of ``queue`` may be assigned to: its team's members, by name."""
    return queue.team.members.filter(is_active=True).order_by("username")


def find_member(queue: ReviewQueue, username: Any):
    """The team member called ``username``; ``ReviewError`` (``assignee``) otherwise."""
    user = members(queue).filter(username=str(username or "").strip()).first()
    if user is None:
        raise ReviewError(f"{str(username)[:60]!r} is not a member of the queue's team ({queue.team})", "assignee")
    return user


def assign(queue: ReviewQueue, assignee, entries: Any = UNASSIGNED) -> int:
    """Assign entries of ``queue`` to ``assignee`` (a member of its team; None: to nobody).
    ``entries``: a list of entry ids, or ``UNASSIGNED`` for every unreviewed unassigned entry.
    Returns how many changed; ``ReviewError`` (``assignee``, ``entries``) for bad input."""
    if assignee is not None and not members(queue).filter(pk=assignee.pk).exists():
        raise ReviewError(f"{assignee.get_username()!r} is not a member of the queue's team ({queue.team})", "assignee")
    qs = QueueEntry.objects.filter(queue=queue)
    if entries == UNASSIGNED:
        qs = qs.filter(assigned_to__isnull=True, reviewed_at__isnull=True)
    else:
        try:
            ids = [int(i) for i in entries]
        except (TypeError, ValueError):
            raise ReviewError("choose entries of the queue (their ids)", "entries") from None
        if any(not 0 < i <= ID_MAX for i in ids):
            raise ReviewError("choose entries of the queue (their ids)", "entries")
        if not ids:
            raise ReviewError("choose the entries to assign (or assign every unassigned one)", "entries")
        qs = qs.filter(pk__in=ids)
    return qs.update(assigned_to=assignee)


def next_entry(queue: ReviewQueue, user) -> QueueEntry | None:
    """The entry ``user`` reviews next: their own oldest unreviewed one, else the oldest unassigned
    unreviewed one, which becomes theirs (claimed atomically: two reviewers never get the same
    entry). None when neither is left. Others' assigned entries are never handed out."""
    todo = QueueEntry.objects.filter(queue=queue, reviewed_at__isnull=True).select_related("rollout")
    mine = todo.filter(assigned_to=user).order_by("id").first()
    if mine is not None:
        return mine
    for _attempt in range(20):  # lost a race for the first one: take the next
        entry = todo.filter(assigned_to__isnull=True).order_by("id").first()
        if entry is None:
            return None
        if QueueEntry.objects.filter(pk=entry.pk, assigned_to__isnull=True).update(assigned_to=user):
            entry.assigned_to = user
            return entry
    return None


def entry_for(queue: ReviewQueue, rollout_id: int) -> QueueEntry | None:
    """The queue's entry of that rollout, if it is in the queue."""
    return QueueEntry.objects.filter(queue=queue, rollout_id=rollout_id).first()


def mark_reviewed(queue: ReviewQueue, rollout: Rollout, user) -> QueueEntry | None:
    """Count the rollout's entry as reviewed by ``user`` (the first review stays; an unassigned
    entry becomes theirs). None when the rollout is not in the queue."""
    entry = entry_for(queue, rollout.pk)
    if entry is None:
        return None
    now = timezone.now()
    QueueEntry.objects.filter(pk=entry.pk, reviewed_at__isnull=True).update(reviewed_at=now, reviewed_by=user)
    QueueEntry.objects.filter(pk=entry.pk, assigned_to__isnull=True).update(assigned_to=user)
    entry.refresh_from_db()
    return entry


def previous_entry(queue: ReviewQueue, entry: QueueEntry | None) -> QueueEntry | None:
    """The entry added just before ``entry`` (``k`` in the review panel steps back through it)."""
    if entry is None:
        return None
    return QueueEntry.objects.filter(queue=queue, pk__lt=entry.pk).select_related("rollout").order_by("-id").first()


@dataclass
class Progress:
    """A queue's progress: ``reviewed`` of ``total``, and per assignee (``rows``: ``{"user": name
    or None for unassigned, "reviewed", "total"}``, members by name then the unassigned)."""

    reviewed: int = 0
    total: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.reviewed / self.total if self.total else 0.0

    @property
    def left(self) -> int:
        return self.total - self.reviewed


def progress(queue: ReviewQueue) -> Progress:
    """Reviewed/total of the whole queue and per assignee, in one grouped query."""
    grouped = (
        QueueEntry.objects.filter(queue=queue)
        .values("assigned_to")
        .annotate(total=Count("id"), reviewed=Count("id", filter=Q(reviewed_at__isnull=False)))
        .order_by()
    )
    names = dict(
        get_user_model()
        .objects.filter(pk__in=[g["assigned_to"] for g in grouped if g["assigned_to"]])
        .values_list("pk", "username")
    )
    rows = [
        {
            "user": names.get(g["assigned_to"]) if g["assigned_to"] else None,
            "reviewed": g["reviewed"],
            "total": g["total"],
        }
        for g in grouped
    ]
    rows.sort(key=lambda r: (r["user"] is None, r["user"] or ""))
    return Progress(reviewed=sum(r["reviewed"] for r in rows), total=sum(r["total"] for r in rows), rows=rows)


def with_counts(queues: QuerySet) -> QuerySet:
    """``queues`` with ``n_total`` and ``n_reviewed`` (the queues list)."""
    return queues.annotate(
        n_total=Count("entries"), n_reviewed=Count("entries", filter=Q(entries__reviewed_at__isnull=False))
    )


# Columns a queue's page never shows: a run's health summary alone can be megabytes, decoded per row.
_BIG_ROLLOUT_FIELDS = ("verify_json", "profile_json", "partial_response_json", "warnings", "source_text", "input_text")
_BIG_RUN_FIELDS = ("overrides", "aggregate_metrics", "health_summary", "url_changes")


def entries(queue: ReviewQueue, state: str = "") -> QuerySet:
    """The queue's entries for its page (oldest added first) with rollout, run and users;
    ``state``: ``todo`` (unreviewed), ``reviewed``, ``unassigned`` or all."""
    qs = (
        QueueEntry.objects.filter(queue=queue)
        .select_related("rollout__run", "assigned_to", "reviewed_by")
        .defer(*(f"rollout__{name}" for name in _BIG_ROLLOUT_FIELDS), *(f"rollout__run__{n}" for n in _BIG_RUN_FIELDS))
    )
    if state == "todo":
        qs = qs.filter(reviewed_at__isnull=True)
    elif state == "reviewed":
        qs = qs.filter(reviewed_at__isnull=False)
    elif state == UNASSIGNED:
        qs = qs.filter(assigned_to__isnull=True)
    return qs.order_by("id")
