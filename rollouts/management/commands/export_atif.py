"""``python manage.py export_atif RUN --output-dir DIR`` or ``python manage.py export_atif --rollouts
FILE --output-dir DIR``: a stored run's trajectories (or those of a NeMo Gym ``rollouts.jsonl``, as
``gym eval export --format atif --rollouts FILE`` takes it) in the Agent Trajectory Interchange
Format v1.7, built from gymweb's stored steps (``rollouts.evaluation.atif``). A file is read as an
import would read it (with the ``<stem>_materialized_inputs.jsonl`` beside it, when there is one)
and nothing of it is stored. Never replaces a non-empty folder without ``--overwrite``."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from rollouts.collection.archive_files import RunArchived
from rollouts.collection.datasets import DatasetError
from rollouts.collection.export import output_stems
from rollouts.collection.importer import import_rollouts
from rollouts.evaluation import atif
from rollouts.management.nemo_gym_flags import NemoGymFlags
from rollouts.models import Run


class _NothingStored(Exception):
    """Rolls back the import a file export needs."""


class Command(NemoGymFlags, BaseCommand):
    help = (
        "Export a run's trajectories (RUN, or --rollouts FILE) as ATIF v1.7 (<task>-<rollout>.json files and "
        "manifest.jsonl), like `gym eval export`."
    )
    nemo_gym_flags = {
        "rollouts_jsonl_fpath": "--rollouts",
        "output_dirpath": "--output-dir",
        "session_id": "--session-id",
        "agent_version": "--agent-version",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", type=int, nargs="?", help="id of a stored run (or give --rollouts FILE)")
        parser.add_argument(
            "--rollouts",
            metavar="FILE",
            help="a rollouts.jsonl to export instead of a stored run (NeMo Gym's --rollouts)",
        )
        parser.add_argument("--format", choices=("atif",), default="atif", help="atif (the one format, as NeMo Gym's)")
        parser.add_argument("--output-dir", required=True, help="folder to create (must not exist or be empty)")
        parser.add_argument("--overwrite", action="store_true", help="replace the folder when it holds files")
        parser.add_argument("--session-id", default="", help="ATIF session_id (default gymweb-run-<RUN>)")
        parser.add_argument("--agent-version", default="unspecified", help="ATIF agent.version (NeMo Gym requires one)")
        parser.add_argument(
            "--include-failures",
            action="store_true",
            help="also export each failed rollout's latest attempt (NeMo Gym exports successes only)",
        )

    def _export(self, run: Run, opts) -> tuple[Path, int]:
        try:
            return atif.export_run(
                run,
                opts["output_dir"],
                overwrite=opts["overwrite"],
                session_id=opts["session_id"],
                agent_version=opts["agent_version"],
                include_failures=opts["include_failures"],
            )
        except atif.AtifError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write {opts['output_dir']}: {exc}") from None

    def _export_file(self, opts) -> tuple[Path, int]:
        path = Path(opts["rollouts"]).expanduser()
        if not path.is_file():
            raise CommandError(f"--rollouts {path}: no such file")
        inputs = output_stems(path)["materialized"]
        done: list[tuple[Path, int]] = []
        try:
            with transaction.atomic(), ExitStack() as stack:
                materialized = stack.enter_context(inputs.open("rb")) if inputs.is_file() else None
                run = import_rollouts(
                    stack.enter_context(path.open("rb")),
                    source=str(path),
                    materialized=materialized,
                    materialized_source=str(inputs),
                ).run
                if not opts["session_id"]:
                    opts["session_id"] = path.parent.name or path.stem
                done.append(self._export(run, opts))
                raise _NothingStored
        except _NothingStored:
            return done[0]
        except DatasetError as exc:
            raise CommandError(str(exc)) from None

    def handle(self, *args, **opts) -> None:
        if not opts["agent_version"].strip():
            raise CommandError("--agent-version must not be blank")
        if (opts["run"] is None) == (opts["rollouts"] is None):
            raise CommandError("give either a run id or --rollouts FILE")
        if opts["rollouts"] is not None:
            out, count = self._export_file(opts)
        else:
            run = Run.objects.filter(pk=opts["run"]).first()
            if run is None:
                raise CommandError(f"no run #{opts['run']}")
            if run.is_archived:  # its responses and trajectories are in the archive files
                raise CommandError(str(RunArchived(run, "the ATIF export")))
            out, count = self._export(run, opts)
        self.stdout.write(f"wrote {count} ATIF trajectory file(s) and {atif.MANIFEST} to {out}")
