"""``python manage.py export_sft (--input FILE | --run ID [--filter QS]) --output OUT [--overwrite]``:
the SFT export (OpenAI chat format, ``rollouts.review.sft``) of a NeMo Gym ``rollouts.jsonl`` file
or of a stored run's (filtered) successes. An existing ``--output`` is refused unless
``--overwrite``; the ``--input`` file itself never."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qsl

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.collection.archive_files import RunArchived
from rollouts.collection.datasets import DatasetError, iter_rows
from rollouts.collection.export import write_lines
from rollouts.evaluation.outputs import check_outputs
from rollouts.models import Run
from rollouts.review import curated, sft
from rollouts.review.query import FILTER_FIELDS, filtered_rollouts, unknown_filter_names


class Command(BaseCommand):
    help = 'Write the SFT export ({"messages", "tools"} per line) of a rollouts.jsonl file or of a stored run.'

    def add_arguments(self, parser: CommandParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--input", help="a rollouts.jsonl written by NeMo Gym (or gymweb)")
        source.add_argument("--run", type=int, help="a stored run's id")
        parser.add_argument(
            "--filter",
            default="",
            help="with --run: the run table's filter as a querystring, e.g. 'label=good&reward_min=1'",
        )
        parser.add_argument(
            "--reward-source",
            choices=["original", "corrected"],
            default="original",
            help="with --run and --metadata: which reward the metadata carries (and reward bounds read)",
        )
        parser.add_argument(
            "--reasoning",
            choices=sft.REASONING_MODES,
            default="keep",
            help="keep: reasoning_content; think: <think>…</think> in the content; drop",
        )
        parser.add_argument(
            "--metadata",
            action="store_true",
            help="with --run: add {run, task_index, rollout_index, reward, reward_source, labels}",
        )
        parser.add_argument("--output", required=True, help="the JSONL file to write")
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="replace an existing --output (without it, an existing file is refused)",
        )

    def handle(self, *args, **options) -> None:
        skipped: list[str] = []
        left_out: Counter = Counter()
        output = Path(options["output"])
        if options["input"]:
            path = Path(options["input"])
            if not path.is_file():
                raise CommandError(f"{path}: no such file")
            if output.exists() and output.samefile(path):  # even with --overwrite: the input would be lost
                raise CommandError("--output is the --input file; writing it would destroy the input")
        if options["input"]:
            lines = self._file_lines(path, options["reasoning"], skipped, left_out)
        else:
            run = Run.objects.filter(pk=options["run"]).first()
            if run is None:
                raise CommandError(f"no run #{options['run']}")
            if run.is_archived:  # its responses and trajectories are in the archive files
                raise CommandError(str(RunArchived(run, "the SFT export")))
            params = dict(parse_qsl(options["filter"], keep_blank_values=True))
            unknown = unknown_filter_names(params)
            if unknown:  # a typo would export the whole run without a word
                raise CommandError(
                    f"--filter: unknown filter {', '.join(map(repr, unknown))} (filters: {', '.join(FILTER_FIELDS)})"
                )
            params["reward_source"] = options["reward_source"]
            qs, form = filtered_rollouts(run, params)
            if form.errors:
                raise CommandError("--filter: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
            lines = curated.sft_lines(
                run,
                qs if form.active else None,
                curated.ExportOptions.from_params(params),
                reasoning=options["reasoning"],
                metadata=options["metadata"],
                skipped=skipped,
                left_out=left_out,
            )
        try:  # before any row is read (the lines are lazy): never replace a file silently
            check_outputs([output], overwrite=options["overwrite"])
        except OSError as exc:
            raise CommandError(str(exc)) from None
        try:
            n = write_lines(output, lines)  # streamed; the file appears only when whole
        except DatasetError as exc:
            output.with_name(output.name + ".tmp").unlink(missing_ok=True)
            raise CommandError(str(exc)) from None
        for why in skipped:
            self.stderr.write(f"skipped {why}")
        self.stdout.write(
            f"wrote {n} conversation(s) to {options['output']}"
            + (f"; skipped {len(skipped)} (see above)" if skipped else "")
        )
        if left_out:
            self.stdout.write(sft.left_out_text(left_out))

    @staticmethod
    def _file_lines(path: Path, reasoning: str, skipped: list[str], left_out: Counter):
        with path.open("rb") as fh:
            for n, _text, row in iter_rows(fh, source=str(path)):
                try:
                    yield json.dumps(sft.conversation(row, reasoning=reasoning), ensure_ascii=False)
                except sft.NotConvertible as exc:
                    skipped.append(f"{path}, line {n}: {exc}")
                    left_out[exc.reason] += 1
