"""``python manage.py compare --baseline RUN --candidates RUN[,RUN…]``: NeMo Gym's ``gym eval compare``
with up to four candidates and gymweb's paired interval (``rollouts.evaluation.compare_report``). A side is
a stored run id or a path to a ``rollouts.jsonl`` (its ``*_aggregate_metrics.json`` sibling is read,
or the file given with ``--baseline-agg-metrics``/``--candidates-agg-metrics``). ``--agent-name``
(``--agent``) compares one agent on every side, ``--baseline-agent``/``--candidate-agents`` a named
agent per side. Writes ``compare_report.md`` and/or ``compare_report.json`` (``--report-format``);
never replaces them without ``--overwrite``. NeMo Gym's ``+key=value`` spellings are accepted."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.evaluation import compare_files, compare_report, compare_sides
from rollouts.management.nemo_gym_flags import NemoGymFlags


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


class Command(NemoGymFlags, BaseCommand):
    help = (
        "Compare a baseline run against 1-4 candidate runs (run ids or NeMo Gym rollouts.jsonl paths) "
        "like `gym eval compare`."
    )

    nemo_gym_flags = {
        "baseline_rollouts_jsonl_fpath": "--baseline",
        "candidate_rollouts_jsonl_fpaths": "--candidates",
        "baseline_aggregate_metrics_fpath": "--baseline-agg-metrics",
        "candidate_aggregate_metrics_fpaths": "--candidates-agg-metrics",
        "agent_name": "--agent-name",
        "baseline_agent_name": "--baseline-agent",
        "candidate_agent_names": "--candidate-agents",
        "output_dirpath": "--output-dir",
        "report_format": "--report-format",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--baseline", required=True, help="run id or rollouts.jsonl path")
        parser.add_argument(
            "--candidates", required=True, help="comma-separated run ids or rollouts.jsonl paths (1 to 4)"
        )
        parser.add_argument(
            "--baseline-agg-metrics",
            metavar="PATH",
            help="the baseline's aggregate-metrics JSON, when it is not the sibling of --baseline",
        )
        parser.add_argument(
            "--candidates-agg-metrics",
            metavar="PATH[,PATH...]",
            help="the candidates' aggregate-metrics JSON, in --candidates order, when not their siblings",
        )
        parser.add_argument(
            "--output-dir",
            "-o",
            help="where to write the reports (default: the last candidate file's folder, "
            "or the current folder when it is a run)",
        )
        parser.add_argument(
            "--agent-name", "--agent", help="the agent to compare on every side when the metrics hold several"
        )
        parser.add_argument("--baseline-agent", metavar="NAME", help="the agent to read from the baseline's metrics")
        parser.add_argument(
            "--candidate-agents",
            metavar="NAME[,NAME...]",
            help="the agent to read from each candidate's metrics, in --candidates order",
        )
        parser.add_argument(
            "--report-format",
            choices=compare_files.REPORT_FORMATS,
            default="both",
            help="report files to write: md, json or both (default)",
        )
        parser.add_argument("--overwrite", action="store_true", help="replace existing report files")

    def handle(self, *args, **opts) -> None:
        specs = [s.strip() for s in opts["candidates"].split(",") if s.strip()]
        if not specs:
            raise CommandError("--candidates: give at least one run id or rollouts.jsonl path")
        if len(specs) > compare_report.MAX_CANDIDATES:
            raise CommandError(f"--candidates: at most {compare_report.MAX_CANDIDATES} (got {len(specs)})")
        metrics = _names(opts["candidates_agg_metrics"])
        if metrics is not None and len(metrics) != len(specs):
            raise CommandError(f"--candidates-agg-metrics names {len(metrics)} file(s) for {len(specs)} candidate(s)")
        try:
            baseline = compare_sides.resolve_side(opts["baseline"], "baseline", metrics=opts["baseline_agg_metrics"])
            candidates = [
                compare_sides.resolve_side(s, "candidate", i, metrics[i] if metrics else None)
                for i, s in enumerate(specs)
            ]
            command = shlex.join(["manage.py", "compare", *sys.argv[2:]]) if len(sys.argv) > 2 else "manage.py compare"
            report = compare_report.compare_sides(
                baseline,
                candidates,
                command=command,
                agent=opts["agent_name"],
                baseline_agent=opts["baseline_agent"],
                candidate_agents=_names(opts["candidate_agents"]),
            )
            if opts["output_dir"]:
                out = Path(opts["output_dir"]).expanduser()
            elif candidates[-1].run is None:
                out = Path(candidates[-1].rollouts_jsonl_fpath).parent
            else:
                out = Path.cwd()
            paths = compare_files.write_compare_report(
                report, out, overwrite=opts["overwrite"], report_format=opts["report_format"]
            )
        except (compare_sides.CompareError, FileExistsError) as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write the report: {exc}") from None
        for comp in report["comparisons"]:
            reward = next((r for r in comp["metrics"] if r["metric"] == "mean/reward"), None)
            for i, s in enumerate(comp["flips"]):
                head = f"candidate {i + 1} ({report['candidates'][i]['label']})"
                if reward and reward["candidates"][i] and reward["candidates"][i]["delta"] is not None:
                    c = reward["candidates"][i]
                    ci = (
                        f" [{c['delta_ci_low']:+.4f}, {c['delta_ci_high']:+.4f}]"
                        if c["delta_ci_low"] is not None
                        else ""
                    )
                    head += f": Δ mean/reward {c['delta']:+.4f}{ci}"
                if s["mode"] == "binary":
                    head += (
                        f"; {s['fail_to_pass_count']} fail→pass, {s['pass_to_fail_count']} pass→fail "
                        f"over {s['common_task_count']} common tasks"
                    )
                elif s["mode"] == "continuous":
                    head += f"; {len(s['flips'])} of {s['common_task_count']} common tasks moved"
                else:
                    head += f"; flips unavailable: {s['reason']}"
                self.stdout.write(head)
        for p in paths:
            self.stdout.write(f"Wrote: {p}")
