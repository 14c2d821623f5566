"""``python manage.py health_check RUN | RUN_DIR | --rollouts FILE``: NeMo Gym's ``gym eval
health-check`` (``rollouts.evaluation.health``). RUN is a stored run's id; RUN_DIR a folder as NeMo
Gym takes it (its ``rollouts.jsonl``, or ``--rollouts-file`` relative to it; the reports go into it).
Writes ``quality_summary.json`` and ``rollout_verdicts.jsonl``; never replaces existing ones without
``--overwrite``."""

from __future__ import annotations

from pathlib import Path

import orjson
from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.evaluation import health, health_checks, health_report
from rollouts.management.nemo_gym_flags import NemoGymFlags
from rollouts.models import Run


class Command(NemoGymFlags, BaseCommand):
    help = (
        "Check rollout health like NeMo Gym's `gym eval health-check`: a stored run (its verdicts are "
        "stored and shown on the run page) or rollouts.jsonl files."
    )

    nemo_gym_flags = {"rollout_file": "--rollouts-file"}

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "run",
            nargs="?",
            metavar="RUN | RUN_DIR",
            help="id of a stored run, or a run folder as `gym eval health-check RUN_DIR` takes it",
        )
        parser.add_argument(
            "--rollouts",
            action="append",
            default=[],
            metavar="FILE",
            help="a rollouts.jsonl to check instead of a run (repeatable)",
        )
        parser.add_argument(
            "--rollouts-file",
            metavar="PATH",
            help="with RUN_DIR: the rollouts JSONL, relative paths under RUN_DIR (default rollouts.jsonl)",
        )
        parser.add_argument(
            "--output-dir",
            help="where to write the two files (default: beside --rollouts; for a run, none unless given)",
        )
        parser.add_argument("--overwrite", action="store_true", help="replace existing report files")
        parser.add_argument("--ignore-checks", default="", help="comma-separated check ids to skip")
        parser.add_argument(
            "--successes-only",
            action="store_true",
            help="a run: check its successes only (NeMo Gym's record set) instead of every finished rollout",
        )
        parser.add_argument("--json", action="store_true", help="print the summary as JSON (NeMo Gym's --json)")

    def handle(self, *args, **opts) -> None:
        if (opts["run"] is None) == (not opts["rollouts"]):
            raise CommandError("give either a run id, a run folder or --rollouts FILE")
        run_dir = None
        if opts["run"] is not None and not opts["run"].strip().isdigit():
            run_dir = Path(opts["run"]).expanduser()
            if not run_dir.is_dir():
                raise CommandError(f"{run_dir}: not a run id and no such folder")
            rollouts = Path(opts["rollouts_file"] or "rollouts.jsonl").expanduser()
            rollouts = rollouts if rollouts.is_absolute() else run_dir / rollouts
            if not rollouts.is_file():
                raise CommandError(f"{rollouts}: no such file (RUN_DIR needs its rollouts.jsonl, or --rollouts-file)")
            opts["rollouts"], opts["run"] = [str(rollouts)], None
        elif opts["rollouts_file"]:
            raise CommandError("--rollouts-file goes with a RUN_DIR")
        try:
            ignored = health_checks.normalize_ignored(opts["ignore_checks"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        output_dir = Path(opts["output_dir"]).expanduser() if opts["output_dir"] else None
        if output_dir is not None and output_dir.exists() and not output_dir.is_dir():
            raise CommandError(f"--output-dir {output_dir} is a file, not a directory")
        try:
            if opts["run"] is not None:
                run = Run.objects.filter(pk=int(opts["run"])).first()
                if run is None:
                    raise CommandError(f"no run #{opts['run']}")
                result, paths = health.run_health_check(
                    run, output_dir, overwrite=opts["overwrite"], ignored=ignored, successes_only=opts["successes_only"]
                )
            else:
                files = [Path(p).expanduser() for p in opts["rollouts"]]
                result = health_report.check_files(files, ignored)
                paths = health_report.write_reports(
                    result, output_dir or run_dir or files[0].parent, overwrite=opts["overwrite"]
                )
        except FileNotFoundError as exc:
            raise CommandError(str(exc)) from None
        except health_report.OutputExists as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write the reports: {exc}") from None
        if opts["json"]:
            self.stdout.write(orjson.dumps(result.summary).decode())
        else:
            self.stdout.write(health_report.format_report(result, paths[0] if paths else None))
