"""``python manage.py check_agent URL [--timeout S] [--slow S] [--json]``: the agent conformance check.

Sends the probe conversations of ``rollouts.evaluation.conformance`` to ``URL/v1/responses`` and prints the
report: a readable text (default) or its JSON form (``--json``, ``Report.to_dict()``). Needs no
database and no environment.

Exit status: 0 when no error was found (warnings allowed), 1 when there are errors (the service
breaks the contract, or cannot be reached), 2 for an unusable URL (contract rule 13: absolute
http(s), no query, fragment or credentials; the message never echoes credentials) or one the
instance's target policy refuses (``rollouts.targets``: the error names the rule and the setting).
"""

from __future__ import annotations

import argparse
import json

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts import targets
from rollouts.collection import environments
from rollouts.engine.loop import InvalidBaseURL, validate_base_url
from rollouts.engine.targets import TargetRefused
from rollouts.evaluation.conformance import DEFAULT_SLOW_S, DEFAULT_TIMEOUT_S, check_agent_sync


def _refused(url: str, exc: TargetRefused) -> str:
    return (
        f"{url}: {exc}\nNothing was sent. To allow it, list it in GYMWEB_ALLOWED_TARGET_HOSTS, or set "
        "GYMWEB_ALLOW_LOCAL_TARGETS=1 for loopback and private addresses on a local single-user set-up."
    )


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value}")
    return number


class Command(BaseCommand):
    help = (
        "Check that the agent service at URL follows the /v1/responses contract: sends a few probe "
        "conversations and reports every breach with how to fix it. Exit status 0 = no errors, "
        "1 = errors, 2 = bad URL or a host the target policy refuses."
    )
    requires_system_checks: list = []  # no database, no models: runs anywhere

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("url", help="the agent service's base URL (gymweb POSTs to URL/v1/responses)")
        parser.add_argument(
            "--timeout",
            type=_seconds,
            default=DEFAULT_TIMEOUT_S,
            help=f"seconds per probe (default {DEFAULT_TIMEOUT_S:g})",
        )
        parser.add_argument(
            "--slow",
            type=_seconds,
            default=DEFAULT_SLOW_S,
            help=f"warn about replies slower than this, seconds (default {DEFAULT_SLOW_S:g})",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--head-url",
            default=None,
            help="a NeMo Gym head server: when URL is NeMo Gym's own agent server, the report names the agent_base_url meant",
        )

    def handle(self, *args, **opts) -> None:
        try:
            url = validate_base_url(opts["url"], "URL")
        except InvalidBaseURL as exc:
            misspelled = targets.refusal_of_misspelled(opts["url"])
            if misspelled is not None:
                raise CommandError(_refused(opts["url"].strip(), misspelled), returncode=2) from None
            raise CommandError(str(exc), returncode=2) from None
        try:
            policy = targets.policy()
        except ImproperlyConfigured as exc:  # this command skips the system checks that would say so
            raise CommandError(str(exc), returncode=2) from None
        try:
            policy.check_url(url)
        except TargetRefused as exc:
            raise CommandError(_refused(url, exc), returncode=2) from None
        report = check_agent_sync(
            url,
            timeout_s=opts["timeout"],
            slow_s=opts["slow"],
            policy=policy,
            max_reply_bytes=targets.max_reply_bytes(),
        )
        environments.name_the_meant_url(report, url, opts["head_url"])
        refused = [f for f in report.findings if f.code == "target_refused"]
        if refused:  # judged again when connecting
            raise CommandError(f"{refused[0].title}\n{refused[0].how_to_fix}", returncode=2)
        if opts["json"]:
            self.stdout.write(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
        else:
            self.stdout.write(report.to_text())
        if not report.ok:
            raise CommandError(
                f"the agent service at {url} breaks the contract: {len(report.errors)} error(s), "
                f"{len(report.warnings)} warning(s)",
                returncode=1,
            )
