"""``python manage.py export_atif RUN --output-dir DIR``: a stored run's trajectories in the Agent
Trajectory Interchange Format v1.7 that NeMo Gym's ``gym eval export --format atif`` writes, built
from gymweb's stored steps (``rollouts.evaluation.atif``). Never replaces a non-empty folder without
``--overwrite``."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.evaluation import atif
from rollouts.models import Run


class Command(BaseCommand):
    help = "Export a run's trajectories as ATIF v1.7 (<task>-<rollout>.json files and manifest.jsonl), like `gym eval export`."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", type=int, help="id of a stored run")
        parser.add_argument("--output-dir", required=True, help="folder to create (must not exist or be empty)")
        parser.add_argument("--overwrite", action="store_true", help="replace the folder when it holds files")
        parser.add_argument("--session-id", default="", help="ATIF session_id (default gymweb-run-<RUN>)")
        parser.add_argument("--agent-version", default="unspecified", help="ATIF agent.version (NeMo Gym requires one)")
        parser.add_argument("--include-failures", action="store_true",
                            help="also export each failed key's latest attempt (NeMo Gym exports successes only)")

    def handle(self, *args, **opts) -> None:
        run = Run.objects.filter(pk=opts["run"]).first()
        if run is None:
            raise CommandError(f"no run #{opts['run']}")
        if not opts["agent_version"].strip():
            raise CommandError("--agent-version must not be blank")
        try:
            out, count = atif.export_run(run, opts["output_dir"], overwrite=opts["overwrite"], session_id=opts["session_id"],
                                         agent_version=opts["agent_version"], include_failures=opts["include_failures"])
        except atif.AtifError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write {opts['output_dir']}: {exc}") from None
        self.stdout.write(f"wrote {count} ATIF trajectory file(s) and {atif.MANIFEST} to {out}")
