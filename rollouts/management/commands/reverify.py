"""``python manage.py reverify RUN --env-url URL [--force]`` or ``python manage.py reverify --inputs
FILE --rollouts FILE --output FILE --env-url URL [--force]``: recompute a stored run's rewards (or
those of a NeMo Gym ``rollouts.jsonl`` and its ``rollouts_materialized_inputs.jsonl``, as ``gym eval
reverify`` takes them) against an env without calling the agent (``rollouts.evaluation.reverify``).

The result is a new run linked to its source. On files, the source is first imported (an
``imported`` run) and the reverified run's files are written next to ``--output`` (its failures
sidecar and materialised inputs beside it), prefixed with ``unsafe_`` when forced past the env's
``reverify_mode``, as NeMo Gym names them.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection.datasets import DatasetError
from rollouts.collection.export import write_run_files
from rollouts.collection.importer import import_rollouts
from rollouts.evaluation import reverify
from rollouts.management.nemo_gym_flags import NemoGymFlags
from rollouts.models import Run


class Command(NemoGymFlags, BaseCommand):
    help = (
        "Reverify a stored run's successes (RUN), or a rollouts.jsonl with its materialised inputs "
        "(--inputs/--rollouts/--output), against --env-url (no agent calls); stores a new run linked to it."
    )

    nemo_gym_flags = {
        "materialized_inputs_jsonl_fpath": "--inputs",
        "rollouts_jsonl_fpath": "--rollouts",
        "output_jsonl_fpath": "--output",
        "force": "--force",
        "num_samples_in_parallel": "--concurrency",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "run", type=int, nargs="?", help="id of the stored run to reverify (or give --inputs/--rollouts/--output)"
        )
        parser.add_argument(
            "--inputs", metavar="FILE", help="the run's rollouts_materialized_inputs.jsonl (NeMo Gym's --inputs)"
        )
        parser.add_argument("--rollouts", metavar="FILE", help="the rollouts.jsonl to reverify (NeMo Gym's --rollouts)")
        parser.add_argument(
            "--output", "-o", metavar="FILE", help="where the reverified rollouts.jsonl goes (NeMo Gym's --output)"
        )
        parser.add_argument(
            "--env-url", required=True, help="resources server base URL (GET /reverify_mode, POST /verify)"
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="reverify even when the env does not report reverify_mode=stateless (the new run is marked unsafe_)",
        )
        parser.add_argument(
            "--concurrency", type=int, default=reverify.DEFAULT_CONCURRENCY, help="verify calls in flight (default 16)"
        )
        parser.add_argument(
            "--timeout-s",
            type=float,
            default=reverify.DEFAULT_TIMEOUT_S,
            help="per /verify call, seconds (default 300)",
        )
        parser.add_argument("--name", default="", help="the new run's name")

    def _source(self, opts) -> Run:
        files = [opts.get(k) for k in ("inputs", "rollouts", "output")]
        if opts["run"] is not None:
            if any(files):
                raise CommandError("give either RUN or --inputs/--rollouts/--output, not both")
            source = Run.objects.filter(pk=opts["run"]).first()
            if source is None:
                raise CommandError(f"no run #{opts['run']}")
            return source
        if not all(files):
            raise CommandError("give RUN, or all of --inputs FILE --rollouts FILE --output FILE")
        for flag, path in (("--inputs", opts["inputs"]), ("--rollouts", opts["rollouts"])):
            if not Path(path).is_file():
                raise CommandError(f"{flag} {path}: no such file")
        try:
            with open(opts["rollouts"], "rb") as rollouts, open(opts["inputs"], "rb") as inputs:
                return import_rollouts(
                    rollouts, source=opts["rollouts"], materialized=inputs, materialized_source=opts["inputs"]
                ).run
        except DatasetError as exc:
            raise CommandError(str(exc)) from None

    def handle(self, *args, **opts) -> None:
        if opts["concurrency"] < 1 or not opts["timeout_s"] > 0:
            raise CommandError("--concurrency must be >= 1 and --timeout-s > 0")
        source = self._source(opts)
        try:
            result = reverify.reverify_run(
                source,
                opts["env_url"],
                force=opts["force"],
                concurrency=opts["concurrency"],
                timeout_s=opts["timeout_s"],
                name=opts["name"],
            )
        except reverify.ReverifyError as exc:
            if opts["run"] is None:
                source.delete()  # the import was only the way in
            raise CommandError(str(exc)) from None
        if result.warning:
            self.stderr.write(f"WARNING: {result.warning}")
        self.stdout.write(
            f"reverified run #{source.pk} into run #{result.run.pk}: {result.reverified} reverified, "
            f"{result.failed} /verify failure(s), {len(result.flips)} reward(s) changed"
        )
        for task, rollout, before, after in result.flips[:50]:
            self.stdout.write(f"  {task}:{rollout}  {before:g} -> {'verify failed' if after is None else f'{after:g}'}")
        if len(result.flips) > 50:
            self.stdout.write(f"  … and {len(result.flips) - 50} more (see the run page)")
        if opts["output"]:
            output = Path(opts["output"])
            if result.warning:
                output = output.with_name("unsafe_" + output.name)
            written = write_run_files(result.run, output)
            self.stdout.write(
                f"wrote {output} ({written['rollouts']} row(s)) and its failures sidecar ({written['failures']})"
            )
