"""Teams: who owns a run, a dataset, a label, a review queue or an API token, and which teams a user is in.

A user sees their teams' runs and datasets only; a superuser sees every team's. The rule itself is
applied in one place each for the pages (``rollouts.web.access``) and the API
(``rollouts.api.lookups``); this module answers the questions they ask. With one team (``default``,
which every user joins while it is the only one) an instance behaves as if there were no teams.
"""

from __future__ import annotations

from django.db import transaction

from rollouts.models import DEFAULT_TEAM, Dataset, Label, ReviewQueue, Run, Team, default_team_pk

TOKEN_TEAM_ATTR = "gymweb_token_team_id"  # set on the user by the API's auth for a token of one team


def team_ids(user):
    """The ids of the teams whose runs ``user`` may see, as a subquery (no query of its own), or
    None for every team (a superuser). An anonymous or inactive user: none."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return Team.objects.none().values("pk")
    token_team = getattr(user, TOKEN_TEAM_ATTR, None)
    if token_team is not None:  # an API token of one team: that team only, while the user is in it
        return Team.objects.filter(members=user, pk=token_team).values("pk")
    if user.is_superuser:
        return None
    return Team.objects.filter(members=user).values("pk")


def visible_runs(user):
    """The runs ``user`` may see and act on (a queryset): their teams' runs; every run for a
    superuser; none for anyone else. A run still being written (``rollouts.collection.writing``)
    is nobody's yet."""
    ids = team_ids(user)
    ready = Run.objects.filter(writing_until__isnull=True)
    return ready if ids is None else ready.filter(team_id__in=ids)


def visible_datasets(user):
    """The datasets ``user`` may see and launch runs from (a queryset), by the runs' rule (one
    still being written is nobody's yet)."""
    ids = team_ids(user)
    ready = Dataset.objects.filter(writing_until__isnull=True)
    return ready if ids is None else ready.filter(team_id__in=ids)


def visible_queues(user):
    """The review queues ``user`` may see and work in (a queryset), by the runs' rule."""
    ids = team_ids(user)
    return ReviewQueue.objects.all() if ids is None else ReviewQueue.objects.filter(team_id__in=ids)


def visible_labels(user):
    """The review labels ``user`` may see and use (a queryset): their teams' label sets; every
    team's for a superuser. A rollout takes only its run's team's labels
    (``rollouts.review.actions.set_label``)."""
    ids = team_ids(user)
    return Label.objects.all() if ids is None else Label.objects.filter(team_id__in=ids)


def choosable_teams(user):
    """The teams ``user`` may put a new run or dataset in (a queryset, oldest first): their own;
    every team for a superuser."""
    ids = team_ids(user)
    qs = Team.objects.all() if ids is None else Team.objects.filter(pk__in=ids)
    return qs.order_by("id")


def not_yours(user, value) -> str:
    """The refusal of team ``value`` (an id as sent) for ``user``, listing the teams they may
    choose (``choosable_teams``: id and name, the first 20), so the right id is at hand."""
    shown = str(value)[:40]
    mine = list(choosable_teams(user).values_list("pk", "name")[:21])
    if not mine:
        return f"team {shown}: not one of your teams ({NO_TEAM})"
    listed = ", ".join(f"{pk} ({name})" for pk, name in mine[:20]) + (", ..." if len(mine) > 20 else "")
    return f"team {shown}: not one of your teams; yours: {listed}"


def may_see(user, team_id: int) -> bool:
    """Whether ``user`` may see (and act on) a row of the team ``team_id``."""
    ids = team_ids(user)
    return ids is None or ids.filter(pk=team_id).exists()


def teams_of(user) -> list[Team]:
    """The teams ``user`` is a member of, oldest first (the first is their default team); for an
    API token of one team, that team."""
    if user is None or not getattr(user, "is_authenticated", False):
        return []
    mine = Team.objects.filter(members=user)
    if getattr(user, TOKEN_TEAM_ATTR, None) is not None:
        mine = mine.filter(pk=getattr(user, TOKEN_TEAM_ATTR))
    return list(mine.order_by("id"))


NO_TEAM = "you are in no team: an admin adds you to one first"


class NoTeam(ValueError):
    """A signed-in user (or a token of a team they left) who is in no team wanted to make a run,
    dataset or queue: it would land in a team they cannot see (``NO_TEAM`` says so)."""

    def __init__(self) -> None:
        super().__init__(NO_TEAM)


def team_for_new(user, team: Team | None = None) -> int:
    """The team id a new run or dataset of ``user`` goes to: ``team`` if given, else the user's
    first team; with no user (the commands) or for a superuser in no team, the ``default`` team.
    Raises ``NoTeam`` for any other signed-in user in no team (the row would be theirs to lose)."""
    if team is not None:
        return team.pk
    if user is not None and getattr(user, "is_authenticated", False):
        mine = Team.objects.filter(members=user)
        scoped = getattr(user, TOKEN_TEAM_ATTR, None)
        if scoped is not None:
            mine = mine.filter(pk=scoped)
        first = mine.order_by("id").values_list("pk", flat=True).first()
        if first is not None:
            return first
        if scoped is not None or not user.is_superuser:
            raise NoTeam()
    return default_team_pk()


def join_default_team(user) -> bool:
    """A new user joins the ``default`` team while it is the instance's only team (so a one-team
    instance behaves as before teams); with several teams a new user is in none until an admin
    adds them. Returns whether the user joined."""
    with transaction.atomic():
        if Team.objects.exclude(name=DEFAULT_TEAM).exists():
            return False
        team, _ = Team.objects.get_or_create(name=DEFAULT_TEAM)
        team.members.add(user)
    return True


def on_user_saved(sender, instance, created, raw=False, **kwargs) -> None:
    """``post_save`` of the user model: a new user joins the default team (``join_default_team``)."""
    if created and not raw:
        join_default_team(instance)


def create_team(name: str) -> Team:
    """A new team named ``name`` (ValueError: empty, over 100 characters, or taken)."""
    clean = (name or "").strip()
    if not clean or len(clean) > 100:
        raise ValueError("a team name has 1 to 100 characters")
    if Team.objects.filter(name=clean).exists():
        raise ValueError(f"a team named {clean!r} exists")
    return Team.objects.create(name=clean)
