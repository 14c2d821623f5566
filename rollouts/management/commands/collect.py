"""``python manage.py collect``: headless rollout collection, NeMo Gym's ``gym eval run`` equivalent.

Same code path as the web (``rollouts.collection.runs`` + ``rollouts.workers``); the work runs in this
process, so no separate worker needs to be running. Workers (``qcluster``) sharing the database help
with the run; the command waits until every attempt of the run has ended, wherever it ran, before
it writes its files.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from rollouts.collection import environments, run_rows, run_settings, runs
from rollouts.collection.datasets import DatasetError, ParsedDataset, read_jsonl
from rollouts.collection.export import output_stems, write_run_files
from rollouts.collection.run_settings import SettingError
from rollouts.evaluation import health, health_report
from rollouts.evaluation.aggregate_metrics import aggregate_metrics_path
from rollouts.evaluation.run_aggregate_metrics import fetch_aggregate_metrics, write_run_aggregate_metrics
from rollouts.management.nemo_gym_flags import NemoGymFlags
from rollouts.models import Rollout, Run
from rollouts.nemo import miswiring
from rollouts.nemo.config import NemoConfigError, load_files
from rollouts.workers.process import run_in_process


def _whole_number(value: str) -> int:
    """A flag's whole number as typed; its range is ``run_settings``'."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def _seconds(value: str) -> float:
    """A flag's number of seconds as typed; its range is ``run_settings``'."""
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None


def default_max_attempts() -> int:
    """``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`` when set (NeMo Gym's knob, the command line's only), else
    the run default (3); checked as ``--max-attempts`` is."""
    raw = os.environ.get("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "").strip()
    if not raw:
        return run_settings.default("max_attempts")
    try:
        value = int(raw)
    except ValueError:
        raise CommandError(f"NEMO_GYM_MAX_ROLLOUT_ATTEMPTS must be a whole number, got {raw!r}") from None
    try:
        return run_settings.check_number("max_attempts", value, "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS")
    except SettingError as exc:
        raise CommandError(exc.message) from None


def miswired_rollouts(run: Run) -> int:
    """Finished attempts of ``run`` whose agent reported results of the env's tools that the env
    never executed (the warning ``rollouts.workers.dispatcher`` stores)."""
    rows = (
        Rollout.objects.filter(run=run, status__in=[Rollout.Status.SUCCEEDED, Rollout.Status.FAILED])
        .exclude(warnings=[])
        .values_list("warnings", flat=True)
    )
    return sum(1 for ws in rows.iterator() if any(str(w).startswith(miswiring.ROLLOUT_WARNING) for w in ws or []))


class Command(NemoGymFlags, BaseCommand):
    help = (
        "Collect rollouts: drive the agent service at --agent-url through the tasks of --input against "
        "the resources server at --env-url; write OUT.jsonl (successes), OUT_failures.jsonl and "
        "OUT_materialized_inputs.jsonl and, once the run completes, OUT_aggregate_metrics.json in NeMo Gym's format."
    )
    # Only the checks that concern a headless run: the models and gymweb's own settings (a bad
    # GYMWEB_ALLOWED_TARGET_HOSTS entry). The full set imports every page's views through the URL
    # checks (django-ninja's API schemas, the renderers), a large part of a short run's CPU
    # (benchmarks/README.md).
    requires_system_checks = ["models", "gymweb"]
    # NeMo Gym's `gym eval run` keys (+resume_from_cache=true, +num_repeats=4, ...) as aliases.
    nemo_gym_flags = {
        "resume_from_cache": "--resume",
        "input_jsonl_fpath": "--input",
        "output_jsonl_fpath": "--output",
        "limit": "--limit",
        "num_repeats": "--num-repeats",
        "num_samples_in_parallel": "--concurrency",
        "agent_name": "--agent-name",
        "disable_health_check": "--no-health-check",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--agent-url",
            default=None,
            help="agent service base URL (POST {URL}/v1/responses); default: the agent's agent_base_url in --config",
        )
        parser.add_argument(
            "--env-url",
            default=None,
            help="resources server base URL (/seed_session, tools, /verify); "
            "default: found through --config/--head-url",
        )
        parser.add_argument(
            "--config",
            action="append",
            default=[],
            metavar="FILE",
            help="a NeMo Gym config file (repeatable: merged in order, later wins, as +config_paths=[...])",
        )
        parser.add_argument(
            "--head-url",
            default=None,
            help="a NeMo Gym head server (gym env start; NeMo Gym's default http://127.0.0.1:11000): "
            "finds the environment by name",
        )
        parser.add_argument(
            "--input", required=True, help="input JSONL (one task per line, with responses_create_params)"
        )
        parser.add_argument(
            "--output", required=True, help="output JSONL for successes; sidecars are written beside it"
        )
        parser.add_argument(
            "--concurrency",
            type=_whole_number,
            default=None,
            help="rollouts in flight at once (default: the config's, else 32)",
        )
        parser.add_argument(
            "--max-steps", type=_whole_number, default=None, help="agent calls per rollout (default: unbounded)"
        )
        parser.add_argument("--num-repeats", type=_whole_number, default=1, help="rollouts per task (default 1)")
        parser.add_argument("--limit", type=_whole_number, default=None, help="only the first N rows of the input")
        parser.add_argument(
            "--max-attempts",
            type=_whole_number,
            default=None,
            help="attempts per rollout incl. retries (default 3, or $NEMO_GYM_MAX_ROLLOUT_ATTEMPTS)",
        )
        parser.add_argument(
            "--remote-responses-timeout-s",
            type=_seconds,
            default=None,
            help="per agent call timeout, seconds (default: the config's, else 1800)",
        )
        parser.add_argument(
            "--run-timeout-s",
            type=_seconds,
            default=None,
            help="whole-rollout timeout, seconds (default: the config's, else 2100)",
        )
        parser.add_argument(
            "--env-max-in-flight",
            type=_whole_number,
            default=0,
            help="most env calls (seed, tool calls, verify) of this run out at once; the rest wait, the oldest "
            "rollout's first (default 0: the server's GYMWEB_ENV_MAX_IN_FLIGHT per worker process, 0 = none)",
        )
        parser.add_argument(
            "--agent-name",
            default=None,
            help="the agent in --config/the head server's config (default: the single one with an agent_base_url); "
            "agent_ref name written into rows (default remote_agent)",
        )
        files = parser.add_mutually_exclusive_group()
        files.add_argument(
            "--resume",
            action="store_true",
            help="retry failed rollouts of the earlier run with the same --output; keep successes",
        )
        files.add_argument(
            "--overwrite",
            action="store_true",
            help="replace existing output files with a new run (without it, existing files are refused)",
        )
        parser.add_argument(
            "--auto-retry",
            action="store_true",
            help="retry failed rollouts automatically (up to --max-attempts, with backoff) before the command ends, "
            "instead of leaving them to --resume (NeMo Gym's way)",
        )
        parser.add_argument(
            "--allow-url-change",
            action="store_true",
            help="with --resume: allow --agent-url/--env-url to differ from the run's (recorded on the run)",
        )
        parser.add_argument(
            "--overrides",
            default=None,
            help="JSON object merged into every row's responses_create_params, e.g. '{\"temperature\": 0.2}'",
        )
        parser.add_argument(
            "--name", default=None, help="run name shown in the dashboard (default: the input file name)"
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument(
            "--no-health-check",
            action="store_true",
            help="skip the health check that writes quality_summary.json and rollout_verdicts.jsonl",
        )

    def handle(self, *args, **opts) -> None:
        nemo = self._nemo_gym(opts)
        if not opts["agent_url"] or not opts["env_url"]:
            missing = " and ".join(f for f in ("--agent-url", "--env-url") if not opts[f[2:].replace("-", "_")])
            raise CommandError(
                f"pass {missing}, or a NeMo Gym config (--config FILE) and/or head server (--head-url URL)"
            )
        checked = self._check_settings(opts)
        agent_url, env_url = checked["agent_url"], checked["env_url"]
        if opts["allow_url_change"] and not opts["resume"]:
            raise CommandError("--allow-url-change applies only with --resume (a new run takes any URLs)")
        problem = environments.miswiring_problem(agent_url, nemo.head_url if nemo else opts["head_url"])
        if problem:
            raise CommandError(f"{problem}\nNothing was run.")
        head_url = nemo.head_url if nemo and env_url == nemo.env_url and nemo.head_url else ""
        env_name = nemo.env_name if head_url else ""
        max_attempts, overrides = checked["max_attempts"], checked["overrides"]
        output = Path(opts["output"]).expanduser().resolve()
        input_path = Path(opts["input"]).expanduser()
        # Nothing is created on disk until the input and the options are known to be good: a
        # refused command leaves no empty output folder behind.
        self._check_output(output, input_path)
        parsed = self._read_input(input_path)

        # the three files, and NeMo Gym's aggregate metrics file beside them (written once the run completes)
        ours_here = [*output_stems(output).values(), aggregate_metrics_path(output)]
        written_here = list(ours_here)
        if not opts["no_health_check"]:  # the check writes its two files beside the output
            written_here += [
                output.parent / health_report.QUALITY_SUMMARY_FILENAME,
                output.parent / health_report.ROLLOUT_VERDICTS_FILENAME,
            ]
        existing = [p for p in written_here if p.exists()]
        if existing and not (opts["resume"] or opts["overwrite"]):
            raise CommandError(
                f"Output file already exists: '{existing[0]}'. Pass --overwrite to replace it with a new run, "
                "or --resume to continue the run that wrote it."
            )

        self._migrate()
        run = self._run_to_resume(output, existing, ours_here) if opts["resume"] else None
        if run is not None:
            self._change_urls(run, opts, agent_url, env_url, head_url, env_name)
            added = runs.resume(run, max_attempts=max_attempts)
            self.stdout.write(
                f"resuming run #{run.pk}: {added} rollout(s) get a new attempt (max attempts {run.max_attempts})"
            )
        else:
            try:
                run_rows.check_size(len(parsed.rows), checked["num_repeats"], checked["limit"])
            except run_rows.RunTooLarge as exc:
                raise CommandError(str(exc)) from None
            for path in existing:  # --overwrite (NeMo Gym's flag): the old files go before the new run
                path.unlink()
                self.stderr.write(f"note: deleted the existing output file {path} (--overwrite)")
            run = runs.create_run(
                parsed,
                name=opts["name"] or input_path.name,
                agent_url=agent_url,
                env_url=env_url,
                head_url=head_url,
                env_name=env_name,
                agent_name=checked["agent_name"],
                concurrency=checked["concurrency"],
                max_steps=checked["max_steps"] or None,
                num_repeats=checked["num_repeats"],
                limit=checked["limit"],
                max_attempts=max_attempts,
                auto_retry=opts["auto_retry"],
                remote_responses_timeout_s=checked["remote_responses_timeout_s"],
                run_timeout_s=checked["run_timeout_s"],
                env_max_in_flight=checked["env_max_in_flight"],
                overrides=overrides,
                source_file=str(output),
            )
            runs.launch(run)
            self.stdout.write(
                f"run #{run.pk}: {run.num_tasks} task(s), {run.num_keys} rollout(s), concurrency {run.concurrency}"
            )

        # Attempts still to end: pending ones, and on --resume any that workers sharing the database
        # are running. The files are written only once all of them have ended, wherever they ran.
        active = Rollout.objects.filter(run=run, status__in=Rollout.ACTIVE).count()
        interrupted = False
        if active:
            interrupted = self._run(run, active, show=not opts["no_progress"])
        runs.finish_if_done(run.pk)
        run.refresh_from_db()
        if run.status == Run.Status.COMPLETED and not interrupted:
            fetch_aggregate_metrics(run.pk)  # its outcome is reported with the file, below
            run.refresh_from_db()
        written = write_run_files(run, output)
        self._summary(run, written, output, interrupted)
        if run.status == Run.Status.COMPLETED and not interrupted:
            self._aggregate_metrics_file(run, output)
        if not opts["no_health_check"]:
            self.stdout.write(health.auto_check(run, output.parent))

    def _run_to_resume(self, output: Path, existing: list[Path], ours_here: list[Path]) -> Run | None:
        """``--resume``: the latest run of this database that wrote ``output`` (None: a new run is
        started); refused when files exist there that no run of this database wrote."""
        run = Run.objects.filter(source_file=str(output)).exclude(status=Run.Status.IMPORTED).order_by("-id").first()
        if run is None and existing:
            ours = [p for p in existing if p in ours_here]
            if not ours:  # only the health files of another output in this folder
                raise CommandError(
                    f"Output file already exists: '{existing[0]}'. Pass --overwrite to replace it with a new run."
                )
            raise CommandError(
                f"--resume: no run in this database wrote '{ours[0]}', so there is nothing to continue "
                "(gymweb resumes from its database, not from the file). Pass --overwrite instead of --resume "
                "to replace the file with a new run."
            )
        if run is None:
            self.stderr.write(f"note: no earlier run wrote {output}; starting a new run")
        return run

    def _read_input(self, input_path: Path) -> ParsedDataset:
        """The ``--input`` file, parsed and validated as a dataset; a refusal names the file."""
        try:
            with input_path.open("rb") as fh:
                parsed = read_jsonl(fh, source=str(input_path), max_line_bytes=int(settings.GYMWEB_MAX_LINE_BYTES))
        except FileNotFoundError:
            raise CommandError(f"--input {input_path}: no such file") from None
        except IsADirectoryError:
            raise CommandError(f"--input {input_path} is a directory") from None
        except PermissionError:
            raise CommandError(f"--input {input_path}: permission denied") from None
        except DatasetError as exc:
            raise CommandError(str(exc)) from None
        if parsed.stripped_fields:
            self.stderr.write(
                f"note: stripped stale result fields from the input: {', '.join(sorted(parsed.stripped_fields))}"
            )
        return parsed

    def _change_urls(self, run: Run, opts: dict, agent_url: str, env_url: str, head_url: str, env_name: str) -> None:
        """``--resume``: the run's agent and env URLs (and head server, env name) become these ones,
        when allowed (``--allow-url-change``, or an env found again through the same head server)."""
        if run.is_archived:
            raise CommandError(f"--resume: run #{run.pk} is archived; restore it first: gymweb restore_run {run.pk}")
        # An env found again through the same head server by the same name moves with each
        # `gym env start` (a new port): that change is expected, and recorded like any other.
        env_moved = (
            bool(head_url) and run.head_url == head_url and run.env_name == env_name and run.agent_url == agent_url
        )
        try:
            changed = runs.change_urls(run, agent_url, env_url, allow=opts["allow_url_change"] or env_moved)
        except runs.URLChangeRefused as exc:
            raise CommandError(f"--resume: {exc}") from None
        for name, (old, new) in changed.items():
            why = (
                "found again through the head server"
                if env_moved and not opts["allow_url_change"]
                else "--allow-url-change"
            )
            self.stderr.write(f"note: {why}: the run's {name} changes from {old} to {new}")
        run.head_url, run.env_name = head_url, env_name
        run.save(update_fields=["head_url", "env_name"])

    def _nemo_gym(self, opts: dict) -> environments.Resolved | None:
        """Fill the agent, the env and the knobs the command line leaves out from ``--config`` /
        ``--head-url`` (flags win), and say where each came from. None without either."""
        self.sources: dict[str, str] = {}
        if not opts["config"] and not opts["head_url"]:
            for name in ("concurrency", "remote_responses_timeout_s", "run_timeout_s"):
                if opts[name] is None:
                    opts[name] = run_settings.default(name)
            return None
        try:
            config = load_files(opts["config"]) if opts["config"] else None
            if opts["env_url"] and config is not None and not opts["head_url"]:
                agent = config.agent(opts["agent_name"])
                resolved = environments.Resolved(
                    agent_name=agent.name,
                    agent_url=agent.agent_base_url,
                    env_name="",
                    env_url=opts["env_url"],
                    head_url=None,
                    options={
                        k: getattr(agent, k)
                        for k in ("concurrency", "max_steps", "remote_responses_timeout_s", "run_timeout_s")
                        if getattr(agent, k) is not None
                    },
                    sources=dict(agent.sources),
                )
            else:
                resolved = environments.resolve(config, head_url=opts["head_url"], agent_name=opts["agent_name"])
        except (NemoConfigError, environments.HeadServerError) as exc:
            raise CommandError(str(exc)) from None
        lines = []
        for flag, key, value in (
            ("--agent-url", "agent_url", resolved.agent_url),
            ("--env-url", "env_url", resolved.env_url),
        ):
            if opts[key]:
                lines.append(f"{flag} {opts[key]} (command line)")
            elif value:
                opts[key] = value
                self.sources[key] = resolved.sources.get(key, "config")
                lines.append(f"{flag} {value} ({resolved.sources.get(key, 'config')})")
        for key in ("concurrency", "max_steps", "remote_responses_timeout_s", "run_timeout_s"):
            flag = "--" + key.replace("_", "-")
            if opts[key] is not None:
                lines.append(f"{flag} {opts[key]} (command line)")
            elif key in resolved.options:
                opts[key] = resolved.options[key]
                self.sources[key] = resolved.sources.get(key, "config")
                lines.append(f"{flag} {opts[key]} ({resolved.sources.get(key, 'config')})")
            else:
                opts[key] = run_settings.default(key)
        if not opts["agent_name"]:
            opts["agent_name"] = resolved.agent_name
        self.stdout.write(
            f"NeMo Gym agent {resolved.agent_name!r}, environment {resolved.env_name or opts['env_url']!r}:\n  "
            + "\n  ".join(lines)
        )
        return resolved

    def _check_settings(self, opts: dict) -> dict:
        """The run's settings from ``opts`` (flags, else the NeMo Gym config's, else the defaults),
        checked by ``run_settings``; a refusal names the flag and, for a config's value, where it
        came from."""

        def what(key: str, flag: str) -> str:
            source = self.sources.get(key)
            return f"{flag} ({source})" if source else flag

        try:
            checked: dict[str, Any] = {
                "agent_url": run_settings.check_url("agent_url", opts["agent_url"], what("agent_url", "--agent-url")),
                "env_url": run_settings.check_url("env_url", opts["env_url"], what("env_url", "--env-url")),
                "agent_name": run_settings.check_agent_name(
                    opts["agent_name"] or run_settings.DEFAULT_AGENT_NAME, "--agent-name"
                ),
                "overrides": run_settings.check_overrides(opts["overrides"], "--overrides:"),
            }
            numbers = {key: opts[key] for key in run_settings.LIMITS if key != "max_attempts"}
            checked.update(
                run_settings.check_numbers(numbers, {key: what(key, "--" + key.replace("_", "-")) for key in numbers})
            )
            if opts["max_attempts"] is not None:
                checked["max_attempts"] = run_settings.check_number(
                    "max_attempts", opts["max_attempts"], "--max-attempts"
                )
            else:
                checked["max_attempts"] = default_max_attempts()
        except SettingError as exc:
            raise CommandError(exc.message) from None
        return checked

    def _aggregate_metrics_file(self, run: Run, output: Path) -> None:
        """NeMo Gym's ``<stem>_aggregate_metrics.json`` beside the rollouts (``gym eval compare``
        reads it): from the env's reply, or computed locally (then a note says so)."""
        path, notes = write_run_aggregate_metrics(run, output, overwrite=True)
        for note in notes:
            self.stderr.write(f"aggregate metrics: {note}")
        if path is not None:
            self.stdout.write(f"wrote aggregate metrics to {path}")

    def _check_output(self, output: Path, input_path: Path) -> None:
        """Fail before any work when the output files cannot be written where asked. Creates
        nothing: a missing folder is made only when the files are written."""
        if output.is_dir():
            raise CommandError(f"--output {output} is a directory; give a file name like results/rollouts.jsonl")
        if input_path.exists() and output.exists() and output.samefile(input_path):
            raise CommandError("--output is the --input file; writing it would destroy the input")
        for parent in [output.parent, *output.parent.parents]:
            if parent.exists():
                if not parent.is_dir():
                    raise CommandError(f"--output {output}: {parent} is a file, not a directory")
                break
        if parent != output.parent:  # the folder will be made: its nearest existing ancestor must allow it
            # Tried, not asked (os.access says yes to root, and for /proc or a read-only mount):
            # an empty folder made and removed at once.
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".gymweb-write-test-", dir=parent))
            except OSError as exc:
                raise CommandError(
                    f"--output {output}: cannot create folders in {parent} ({exc.strerror or exc})"
                ) from None
            return
        try:
            probe = output.parent / f".{output.name}.gymweb-write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CommandError(f"--output {output}: cannot write there ({exc.strerror or exc})") from None

    def _migrate(self) -> None:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            call_command("migrate", verbosity=0, interactive=False)

    def _run(self, run: Run, total: int, show: bool) -> bool:
        """Run ``run`` here until every attempt of it has ended, here or on a worker sharing the
        database. ``total``: the attempts pending or running when it starts (the bar's length).
        Returns True when interrupted (Ctrl-C)."""
        from tqdm import tqdm

        bar = tqdm(total=total, unit="rollout", disable=not show, file=sys.stderr, dynamic_ncols=True)

        def progress(left: int) -> None:
            done = min(total, max(0, total - left))
            if done != bar.n:
                bar.update(done - bar.n)

        try:
            run_in_process(run.pk, on_progress=progress)
        except KeyboardInterrupt:
            bar.close()
            self.stderr.write("interrupted: in-flight rollouts were released; run again with --resume to finish")
            runs.cancel(run)
            return True
        bar.close()
        return False

    def _summary(self, run: Run, written: dict[str, int], output: Path, interrupted: bool) -> None:
        latest = Rollout.objects.filter(run=run, status__in=[Rollout.Status.SUCCEEDED, Rollout.Status.FAILED])
        kinds = Counter(latest.filter(status=Rollout.Status.FAILED).values_list("failure_kind", flat=True))
        rewards = list(latest.filter(status=Rollout.Status.SUCCEEDED).values_list("reward", flat=True))
        names = output_stems(output)
        mean = sum(rewards) / len(rewards) if rewards else None
        lines = [
            f"run #{run.pk} {run.status}: {run.num_keys} rollout key(s), {len(rewards)} succeeded, "
            f"{sum(kinds.values())} failed attempt(s)",
            f"mean/reward (successes): {mean:.4f}" if mean is not None else "mean/reward: n/a (no successes)",
            f"mean/reward (failures as 0): {sum(rewards) / run.num_keys:.4f}" if run.num_keys else "",
        ]
        if kinds:
            lines.append("failures by kind: " + ", ".join(f"{k}={n}" for k, n in kinds.most_common()))
        miswired = miswired_rollouts(run)
        if miswired:
            lines.append(
                f"WARNING: {miswired} rollout(s) got {miswiring.ROLLOUT_WARNING}: "
                "the agent ran the environment's tools "
                "itself (is --agent-url NeMo Gym's own remote_agent server instead of your agent service?); "
                "their rewards are not real"
            )
        lines.append(f"wrote {written['rollouts']} row(s) to {names['rollouts']}")
        lines.append(f"wrote {written['failures']} row(s) to {names['failures']}")
        lines.append(f"wrote {written['materialized']} row(s) to {names['materialized']}")
        if not interrupted:
            lines.append(self._left(run))
        self.stdout.write("\n".join(line for line in lines if line))

    @staticmethod
    def _left(run: Run) -> str:
        """What is left of the run after this command and whether ``--resume`` would retry it."""
        left = runs.keys_left(run)
        if not any(left.values()):
            return "every rollout succeeded: nothing is left to retry"
        parts = []
        if left["retryable"]:
            parts.append(
                f"{left['retryable']} rollout(s) without a success can be retried: run the same command plus --resume"
            )
        if left["terminal"]:
            parts.append(
                f"{left['terminal']} rollout(s) failed terminally (an invalid Responses object): "
                "never retried, fix the agent"
            )
        if left["exhausted"]:
            parts.append(
                f"{left['exhausted']} rollout(s) used all {run.max_attempts} attempt(s): "
                f"--resume retries them only with a higher --max-attempts"
            )
        return "left: " + "; ".join(parts)
