"""``python manage.py profile``: NeMo Gym's ``gym eval profile`` for a stored run or for files.

    manage.py profile RUN --output-dir DIR [--overwrite]
    manage.py profile --inputs MATERIALIZED.jsonl --rollouts ROLLOUTS.jsonl [--output-dir DIR]
                      [--failures FAILURES.jsonl] [--allow-partial-rollouts] [--overwrite]

The files it writes and when it refuses: docs/evaluate.md; their names: ``rollouts.evaluation.profile_report``.
Prints a short summary and the written paths on stdout, NeMo Gym's warnings on stderr. Errors
(unknown run, missing file, bad JSONL with file and line, rows the profiler rejects) exit non-zero
with a ``CommandError``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from rollouts.evaluation.outputs import OutputExists, check_outputs
from rollouts.evaluation.profile_report import (
    RUN_STEM,
    default_failures_path,
    output_stem_for,
    profile_paths,
    profile_run,
    summary_lines,
    write_files_profile,
    write_profile,
)
from rollouts.evaluation.reward_profile import COLLAPSED_INTERVAL_NOTE, plain_notes
from rollouts.management.nemo_gym_flags import NemoGymFlags
from rollouts.models import Run


class Command(NemoGymFlags, BaseCommand):
    help = (
        "Profile rewards like NeMo Gym's `gym eval profile`: RUN --output-dir DIR for a stored run, or "
        "--inputs MATERIALIZED.jsonl --rollouts ROLLOUTS.jsonl for files (written beside the rollouts file "
        "unless --output-dir). Writes NeMo Gym's three profile files plus gymweb's pass@k file."
    )

    # NeMo Gym's `gym eval profile` keys (++allow_partial_rollouts=True, ...) as aliases.
    nemo_gym_flags = {
        "allow_partial_rollouts": "--allow-partial-rollouts",
        "materialized_inputs_jsonl_fpath": "--inputs",
        "rollouts_jsonl_fpath": "--rollouts",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run", nargs="?", help="a run id (as shown in the dashboard)")
        parser.add_argument("--output-dir", help="directory for the files (required with RUN)")
        parser.add_argument("--inputs", help="materialised inputs JSONL (<stem>_materialized_inputs.jsonl)")
        parser.add_argument("--rollouts", help="rollouts JSONL (successes, NeMo Gym's rollouts.jsonl)")
        parser.add_argument(
            "--failures",
            help="failures sidecar for gymweb's pass@k (failures as 0); default: <stem>_failures.jsonl beside "
            "--rollouts when it exists",
        )
        parser.add_argument(
            "--allow-partial-rollouts",
            action="store_true",
            help=(
                "profile even when some materialised rows have no rollout row "
                "(NeMo Gym's ++allow_partial_rollouts=True)"
            ),
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="replace output files that already exist (without it the command refuses and writes nothing)",
        )

    def handle(self, *args, **opts) -> None:
        if opts["run"] is not None:
            if opts["inputs"] or opts["rollouts"] or opts["failures"] or opts["allow_partial_rollouts"]:
                raise CommandError("give either RUN or --inputs/--rollouts, not both")
            paths, lines = self._profile_run(opts["run"], opts["output_dir"], opts["overwrite"])
        elif opts["inputs"] or opts["rollouts"]:
            if not (opts["inputs"] and opts["rollouts"]):
                raise CommandError("--inputs and --rollouts go together (the materialised inputs and the rollouts)")
            paths, lines = self._profile_files(opts)
        else:
            raise CommandError(
                "give a run id (profile RUN --output-dir DIR) or files (profile --inputs M --rollouts R)"
            )
        for line in lines:
            self.stdout.write(line)
        for path in paths:
            self.stdout.write(f"wrote {path}")

    def _warn(self, caught: list) -> None:
        for text in plain_notes(str(w.message) for w in caught):
            self.stderr.write(f"note: {text}" if text == COLLAPSED_INTERVAL_NOTE else f"warning: {text}")

    def _check_outputs(self, stem: Path, overwrite: bool) -> None:
        try:
            check_outputs(profile_paths(stem), overwrite)
        except (OutputExists, OSError) as exc:
            raise CommandError(str(exc)) from None

    def _profile_run(self, raw_id: str, output_dir: str | None, overwrite: bool):
        try:
            run_id = int(raw_id)
        except ValueError:
            raise CommandError(f"RUN must be a run id (a whole number), got {raw_id!r}") from None
        try:
            run = Run.objects.filter(pk=run_id).first()
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read runs from the database ({exc}); is it set up? (manage.py migrate)"
            ) from None
        if run is None:
            raise CommandError(f"no run #{run_id}")
        if not output_dir:
            raise CommandError("--output-dir DIR is required with RUN (where the four files go)")
        out = Path(output_dir).expanduser()
        if out.exists() and not out.is_dir():
            raise CommandError(f"--output-dir {out} exists and is not a directory")
        self._check_outputs(out / RUN_STEM, overwrite)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result, extras = profile_run(run)
        self._warn(caught)
        paths = write_profile(result, extras, out / RUN_STEM, overwrite=overwrite)
        return paths, [f"run #{run.pk} {run.name!r} ({run.status})", *summary_lines(result, extras)]

    def _profile_files(self, opts):
        inputs, rollouts = Path(opts["inputs"]).expanduser(), Path(opts["rollouts"]).expanduser()
        for flag, p in (("--inputs", inputs), ("--rollouts", rollouts)):
            if not p.is_file():
                raise CommandError(f"{flag} {p}: no such file" if not p.exists() else f"{flag} {p} is not a file")
        failures = None
        notes = []
        if opts["failures"]:
            failures = Path(opts["failures"]).expanduser()
            if not failures.is_file():
                raise CommandError(f"--failures {failures}: no such file")
        elif default_failures_path(rollouts).is_file():
            failures = default_failures_path(rollouts)
            notes.append(f"pass@k counts the failures in {failures} as reward 0")
        output_dir = Path(opts["output_dir"]).expanduser() if opts["output_dir"] else None
        if output_dir is not None and output_dir.exists() and not output_dir.is_dir():
            raise CommandError(f"--output-dir {output_dir} exists and is not a directory")
        self._check_outputs(output_stem_for(rollouts, output_dir), opts["overwrite"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result, extras, paths = write_files_profile(
                    inputs,
                    rollouts,
                    output_dir=output_dir,
                    failures_path=failures,
                    allow_partial_rollouts=opts["allow_partial_rollouts"],
                    overwrite=opts["overwrite"],
                )
            except ValueError as exc:  # ProfileInputError (file + line) or the profiler's alignment errors
                message = str(exc)
                if "allow_partial_rollouts" in message:
                    message += "\nWith this command: --allow-partial-rollouts."
                raise CommandError(message) from None
        self._warn(caught)
        return paths, [*notes, *summary_lines(result, extras)]
