"""``gymweb team add NAME | list | member add|remove TEAM USER``: teams without the admin.

- ``add NAME`` makes a team (a user sees their teams' runs only: ``rollouts.teams``);
- ``list`` shows each team: id, name, members, runs, datasets;
- ``member add TEAM USER`` / ``member remove TEAM USER`` changes who is in a team.

The Django admin (Teams) does the same.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from rollouts.models import Team
from rollouts.teams import create_team


class Command(BaseCommand):
    help = "Add and list teams, and add or remove their members."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="add|list|member")
        add = sub.add_parser("add", help="make a team")
        add.add_argument("name")
        sub.add_parser("list", help="every team with its members")
        member = sub.add_parser("member", help="add a user to a team or remove them")
        member.add_argument("change", choices=["add", "remove"])
        member.add_argument("team", help="the team's name (or id)")
        member.add_argument("user", help="the user name")

    def handle(self, *args, **options):
        action = options["action"]
        if action == "add":
            try:
                team = create_team(options["name"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"team {team.pk} {team.name!r} made; add members with `gymweb team member add`")
        elif action == "list":
            teams = Team.objects.annotate(
                n_runs=Count("runs", distinct=True), n_datasets=Count("datasets", distinct=True)
            ).order_by("id")
            for team in teams:
                names = ", ".join(team.members.order_by("username").values_list("username", flat=True)) or "(none)"
                self.stdout.write(
                    f"{team.pk}\t{team.name}\t{team.n_runs} runs\t{team.n_datasets} datasets\tmembers: {names}"
                )
        else:
            team = _team(options["team"])
            user = _user(options["user"])
            if options["change"] == "add":
                team.members.add(user)
                self.stdout.write(f"{user.get_username()} is in team {team.name!r}")
            else:
                team.members.remove(user)
                self.stdout.write(f"{user.get_username()} is no longer in team {team.name!r}")


def _team(name: str) -> Team:
    team = Team.objects.filter(name=name).first()
    if team is None and name.isdigit():
        team = Team.objects.filter(pk=int(name)).first()
    if team is None:
        raise CommandError(f"no team {name!r} (see `gymweb team list`)")
    return team


def _user(name: str):
    User = get_user_model()
    try:
        return User.objects.get(**{User.USERNAME_FIELD: name})
    except User.DoesNotExist:
        raise CommandError(f"no user named {name!r}") from None
