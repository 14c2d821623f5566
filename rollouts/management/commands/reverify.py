"""``python manage.py reverify RUN --env-url URL [--force]``: recompute a stored run's rewards
against an env without calling the agent (NeMo Gym's ``gym eval reverify``;
``rollouts.evaluation.reverify``). The result is a new run linked to its source."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.evaluation import reverify
from rollouts.models import Run


class Command(BaseCommand):
    help = "Reverify a stored run's successes against --env-url (no agent calls); stores a new run linked to it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", type=int, help="id of the stored run to reverify")
        parser.add_argument("--env-url", required=True, help="resources server base URL (GET /reverify_mode, POST /verify)")
        parser.add_argument("--force", action="store_true",
                            help="reverify even when the env does not report reverify_mode=stateless (the new run is marked unsafe_)")
        parser.add_argument("--concurrency", type=int, default=reverify.DEFAULT_CONCURRENCY, help="verify calls in flight (default 16)")
        parser.add_argument("--timeout-s", type=float, default=reverify.DEFAULT_TIMEOUT_S, help="per /verify call, seconds (default 300)")
        parser.add_argument("--name", default="", help="the new run's name")

    def handle(self, *args, **opts) -> None:
        source = Run.objects.filter(pk=opts["run"]).first()
        if source is None:
            raise CommandError(f"no run #{opts['run']}")
        if opts["concurrency"] < 1 or not opts["timeout_s"] > 0:
            raise CommandError("--concurrency must be >= 1 and --timeout-s > 0")
        try:
            result = reverify.reverify_run(source, opts["env_url"], force=opts["force"], concurrency=opts["concurrency"],
                                           timeout_s=opts["timeout_s"], name=opts["name"])
        except reverify.ReverifyError as exc:
            raise CommandError(str(exc)) from None
        if result.warning:
            self.stderr.write(f"WARNING: {result.warning}")
        self.stdout.write(f"reverified run #{source.pk} into run #{result.run.pk}: {result.reverified} reverified, "
                          f"{result.failed} /verify failure(s), {len(result.flips)} reward(s) changed")
        for task, rollout, before, after in result.flips[:50]:
            self.stdout.write(f"  {task}:{rollout}  {before:g} -> {'verify failed' if after is None else f'{after:g}'}")
        if len(result.flips) > 50:
            self.stdout.write(f"  … and {len(result.flips) - 50} more (see the run page)")
