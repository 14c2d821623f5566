"""``manage.py api_token create|list|revoke --user NAME``: API tokens without the web page.

- ``create --user NAME [--name LABEL] [--scope read|write] [--expires-in 30d]`` prints the new
  token (shown once; only its SHA-256 is kept); ``read`` tokens may only GET; ``--expires-in``
  takes minutes, hours, days or weeks (``90m``, ``12h``, ``30d``, ``2w``); ``--team NAME`` limits
  it to one of the user's teams;
- ``list --user NAME`` shows the user's tokens: id, prefix, name, scope, expiry, created, last used;
- ``revoke --user NAME (--id ID | --prefix gw_… | --all)`` deletes tokens, which refuses them at once.

The tokens are the account page's (``rollouts.tokens``).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from rollouts.durations import parse_duration
from rollouts.models import ApiToken, Team
from rollouts.tokens import create_token


class Command(BaseCommand):
    help = "Create, list or revoke a user's API tokens (Authorization: Bearer gw_…)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="create|list|revoke")
        create = sub.add_parser("create", help="make a token and print it (shown once)")
        create.add_argument("--user", required=True, help="the username the token acts as")
        create.add_argument("--name", default="", help="what the token is for (shown on the account page)")
        create.add_argument(
            "--scope", choices=["read", "write"], default="write", help="read: GET routes only (default: write)"
        )
        create.add_argument("--expires-in", default=None, help="e.g. 30d, 12h, 90m, 2w (default: never expires)")
        create.add_argument("--team", default="", help="the one team (of the user's) it sees (default: all theirs)")
        listing = sub.add_parser("list", help="the user's tokens (never the token text)")
        listing.add_argument("--user", required=True)
        revoke = sub.add_parser("revoke", help="delete tokens: they are refused at once")
        revoke.add_argument("--user", required=True)
        which = revoke.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=int, help="the token's id (from list)")
        which.add_argument("--prefix", help="the token's first characters (from list), e.g. gw_AbCdEfG")
        which.add_argument("--all", action="store_true", help="every token of the user")

    def handle(self, *args, **options):
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: options["user"]})
        except User.DoesNotExist:
            raise CommandError(
                f"no user named {options['user']!r} (create one with `gymweb createsuperuser` or the admin)"
            ) from None
        action = options["action"]
        if action == "create":
            if not user.is_active:
                raise CommandError(f"user {options['user']!r} is inactive: its tokens would be refused")
            expires, team = _expiry_and_team(user, options)
            row, token = create_token(user, options["name"], scope=options["scope"], expires=expires, team=team)
            self.stderr.write(f"token {row.pk} ({row.name}) for {options['user']}; it is shown once, keep it now:")
            self.stdout.write(token)
        elif action == "list":
            rows = list(ApiToken.objects.filter(user=user).order_by("-created", "-id"))
            if not rows:
                self.stdout.write(f"{options['user']} has no API tokens")
            for row in rows:
                used = row.last_used.isoformat(timespec="seconds") if row.last_used else "never"
                expires = row.expires.isoformat(timespec="seconds") if row.expires else "never"
                self.stdout.write(
                    f"{row.pk}\t{row.prefix}…\t{row.name}\t{row.scope}\texpires {expires}"
                    f"\tteam {row.team.name if row.team else '(all)'}"
                    f"\tcreated {row.created.isoformat(timespec='seconds')}\tlast used {used}"
                )
        else:
            qs = ApiToken.objects.filter(user=user)
            if options["id"] is not None:
                qs = qs.filter(pk=options["id"])
            elif options["prefix"]:
                prefix = options["prefix"].rstrip("…")
                if len(prefix) < 6:
                    raise CommandError("--prefix: give at least 6 characters (list shows 10)")
                qs = qs.filter(prefix__startswith=prefix[:10])
            n = qs.count()
            if n == 0:
                raise CommandError(
                    f"no such token of {options['user']} (see `gymweb api_token list --user {options['user']}`)"
                )
            if options["prefix"] and n > 1:
                raise CommandError(f"--prefix {options['prefix']} matches {n} tokens: use --id")
            qs.delete()
            self.stdout.write(f"revoked {n} token{'s' if n != 1 else ''} of {options['user']}")


def _expiry_and_team(user, options):
    """``create``'s ``--expires-in`` as a time and ``--team`` as one of the user's teams."""
    expires = None
    if options["expires_in"] is not None:  # given empty (an unset variable) is refused, not "never"
        try:
            expires = timezone.now() + parse_duration(options["expires_in"], positive=True)
        except ValueError as exc:
            raise CommandError(f"--expires-in {exc}") from None
    team = None
    if options["team"]:
        team = Team.objects.filter(name=options["team"], members=user).first()
        if team is None:
            raise CommandError(f"--team {options['team']!r}: not a team of {options['user']!r}")
    return expires, team
