"""The sides of ``gym eval compare``: a stored run or a ``rollouts.jsonl`` file (with its
``<stem>_aggregate_metrics.json`` when given) read as NeMo Gym's aggregate-metrics entries per agent.
A stored run's entry is the env's ``/aggregate_metrics`` reply when it answered with all four parts,
else computed here the way NeMo Gym's ``compute_aggregate_metrics`` computes it from the success rows.
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.models import Run
from rollouts.nemo.jsonl import JsonlError, iter_objects
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "CompareError",
    "Side",
    "aggregate_entry_from_rows",
    "resolve_side",
    "run_entries",
    "side_from_run",
]


class CompareError(JsonlError):
    """The sides cannot be compared (missing metrics file, no common agent or metric...); the
    message says what and where."""


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def numeric(v: Any) -> float | None:
    return float(v) if is_number(v) else None


@dataclass
class Side:
    """One run of a comparison. ``entries``: its aggregate-metrics entries by agent name;
    ``run``: the stored run, when it is one; paths as the report shows them."""

    role: str
    index: int
    rollouts_jsonl_fpath: str
    aggregate_metrics_fpath: str
    label: str
    entries: dict[str, dict[str, Any]]
    run: Run | None = None

    def run_file(self) -> dict[str, Any]:
        """NeMo Gym's ``RunFile`` as the report writes it."""
        return {
            "role": self.role,
            "index": self.index,
            "rollouts_jsonl_fpath": self.rollouts_jsonl_fpath,
            "aggregate_metrics_fpath": self.aggregate_metrics_fpath,
            "label": self.label,
            "agent_names": sorted(self.entries),
        }


def aggregate_entry_from_rows(rows: Iterable[Any], agent_name: str) -> dict[str, Any]:
    """An aggregate-metrics entry computed from success rows (dicts with the indices, ``reward`` and
    ``response``, or ``reward_profile.ReducedRollout``), as NeMo Gym's ``compute_aggregate_metrics`` does it
    for an env without its own metrics: every row grouped under one synthetic agent, key metrics =
    the ``mean/`` metrics. Raises ``CompareError`` when there are no rows."""
    from rollouts.evaluation.reward_profile import ReducedRollout, profile_rows

    rows = list(rows)
    if not rows:
        raise CompareError(f"agent {agent_name!r} has no successful rollouts: nothing to compare")
    synthetic: list[dict[str, Any]] = []
    filled: list[Any] = []  # ReducedRollout or row mappings, as profile_rows takes them
    for r in rows:
        if isinstance(r, ReducedRollout):
            synthetic.append(
                {
                    TASK_INDEX_KEY_NAME: r.task_index,
                    ROLLOUT_INDEX_KEY_NAME: r.rollout_index,
                    "agent_ref": {"name": "agent"},
                }
            )
            filled.append(r)
        else:
            synthetic.append(
                {
                    TASK_INDEX_KEY_NAME: r.get(TASK_INDEX_KEY_NAME, 0),
                    ROLLOUT_INDEX_KEY_NAME: r.get(ROLLOUT_INDEX_KEY_NAME, 0),
                    "agent_ref": {"name": "agent"},
                }
            )
            filled.append(r if "response" in r else {**r, "response": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NeMo Gym's collapsed-interval notes are not news here
        result = profile_rows(synthetic, filled)
    agent = {k: v for e in result.agent_metrics for k, v in e.items() if k != "agent_ref"}
    agent["num_repeats"] = len({s[ROLLOUT_INDEX_KEY_NAME] for s in synthetic})
    return {
        "agent_ref": {"name": agent_name},
        "agent_metrics": agent,
        "key_metrics": {k: v for k, v in agent.items() if k.startswith("mean/")},
        "group_level_metrics": result.reward_profiling,
        "repeat_level_metrics": [{k: v for k, v in e.items() if k != "agent_ref"} for e in result.repeat_level_metrics],
    }


def _env_entry(run: Run) -> dict[str, Any] | None:
    data = run.aggregate_metrics
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and all(
        isinstance(data.get(k), (dict, list)) for k in ("agent_metrics", "group_level_metrics", "repeat_level_metrics")
    ):
        return data
    return None


def run_entries(run: Run) -> dict[str, dict[str, Any]]:
    """A stored run's aggregate-metrics entries by agent name (one: the run's agent), from its env's
    reply or computed (see the section comment). Raises ``CompareError`` when it has no successes."""
    from rollouts.evaluation.profile_report import run_success_rows

    entry = _env_entry(run)
    if entry is None:
        entry = {**aggregate_entry_from_rows(run_success_rows(run), run.agent_name), "_gymweb_source": "computed"}
    else:
        entry = {"agent_ref": {"name": run.agent_name}, **{k: v for k, v in entry.items() if k != "agent_ref"}}
    return {run.agent_name: entry}


def side_from_run(run: Run, role: str, index: int = 0, entries: dict[str, dict[str, Any]] | None = None) -> Side:
    """A stored run as one side (``entries``: ``run_entries(run)`` when already at hand)."""
    entries = entries if entries is not None else run_entries(run)
    computed = any(e.get("_gymweb_source") == "computed" for e in entries.values())
    how = "computed by gymweb from the success rows" if computed else "the env's /aggregate_metrics reply"
    return Side(
        role=role,
        index=index,
        rollouts_jsonl_fpath=run.source_file or f"gymweb run #{run.pk}",
        aggregate_metrics_fpath=f"gymweb run #{run.pk} ({how})",
        label=f"run #{run.pk} {run.name}"[:200],
        entries={name: {k: v for k, v in e.items() if k != "_gymweb_source"} for name, e in entries.items()},
        run=run,
    )


def aggregate_metrics_path_for(rollouts_path: Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_aggregate_metrics.json`` (NeMo Gym's rule)."""
    return rollouts_path.with_stem(rollouts_path.stem + "_aggregate_metrics").with_suffix(".json")


def side_from_file(path: str | Path, role: str, index: int = 0, metrics: str | Path | None = None) -> Side:
    """A NeMo Gym run as one side, from its ``rollouts.jsonl`` path: its aggregate-metrics file
    (``metrics``, NeMo Gym's ``--baseline-agg-metrics``/``--candidates-agg-metrics``, else the
    ``*_aggregate_metrics.json`` sibling), or, when there is none, the entry computed from the
    rollouts file (NeMo Gym stops there; gymweb computes what ``gym eval aggregate`` would). Raises
    ``CompareError``."""
    p = Path(path).expanduser()
    metrics_path = Path(metrics).expanduser() if metrics else aggregate_metrics_path_for(p)
    if metrics and not metrics_path.is_file():
        raise CompareError(f"{metrics_path}: no such aggregate-metrics file")
    if metrics_path.is_file():
        try:
            payload = json.loads(metrics_path.read_bytes())
        except ValueError as exc:
            raise CompareError(f"'{metrics_path}' is not valid JSON: {exc}") from None
        if not isinstance(payload, list) or not payload:
            raise CompareError(
                f"'{metrics_path}' is not an aggregate-metrics file "
                "(expected a non-empty JSON list of per-agent entries)"
            )
        entries: dict[str, dict[str, Any]] = {}
        for position, entry in enumerate(payload):
            name = (entry.get("agent_ref") or {}).get("name") if isinstance(entry, dict) else None
            if not name:
                raise CompareError(f"'{metrics_path}' entry {position} has no `agent_ref.name`")
            if name in entries:
                raise CompareError(f"'{metrics_path}' contains two entries for agent '{name}'")
            if "repeat_level_metrics" not in entry:
                rows = [i for g in entry.get("group_level_metrics", []) for i in g.get("rollout_infos", [])]
                computed = aggregate_entry_from_rows(rows, name)
                entry = {
                    **entry,
                    "agent_metrics": {**computed["agent_metrics"], **(entry.get("agent_metrics") or {})},
                    "repeat_level_metrics": computed["repeat_level_metrics"],
                }
            entries[name] = entry
        shown = str(metrics_path)
    elif p.is_file():
        by_agent: dict[str, list[dict]] = defaultdict(list)
        for row in _rows_of(p):
            ref = row.get("agent_ref")
            by_agent[ref.get("name") if isinstance(ref, dict) and isinstance(ref.get("name"), str) else "agent"].append(
                row
            )
        entries = {name: aggregate_entry_from_rows(rows, name) for name, rows in by_agent.items()}
        if not entries:
            raise CompareError(f"{p}: no rows")
        shown = f"{metrics_path} (absent: computed by gymweb from {p.name})"
    else:
        raise CompareError(f"{p}: no such file (and no {metrics_path.name} beside it)")
    return Side(
        role=role,
        index=index,
        rollouts_jsonl_fpath=str(p),
        aggregate_metrics_fpath=shown,
        label=p.parent.name or p.stem,
        entries=entries,
    )


def _rows_of(path: Path) -> Iterator[dict]:
    """The JSON objects of a ``rollouts.jsonl`` side, one per non-blank line. Raises
    ``CompareError`` naming the file and line for text that is not UTF-8, a line that is not JSON
    or not an object (a ``*_aggregate_metrics.json`` or a stray file given as a side). A UTF-8 byte
    order mark before the first line is skipped, as ``import_rollouts`` skips it."""
    for _number, _line, row in iter_objects(
        path,
        error=CompareError,
        not_object="a rollout row must be a JSON object",
        hint="; give a rollouts.jsonl or a run id",
    ):
        yield row


def resolve_side(spec: str | int | Run, role: str, index: int = 0, metrics: str | Path | None = None) -> Side:
    """A side from a run id (digits), a ``Run``, or a path to a ``rollouts.jsonl`` (with
    ``metrics``: its aggregate-metrics file when it is not the sibling; not for a run)."""
    if isinstance(spec, Run):
        run: Run | None = spec
    else:
        text = str(spec).strip()
        run = None
        if text.isdigit() and not Path(text).exists():
            run = Run.objects.filter(pk=int(text)).first()
            if run is None:
                raise CompareError(f"no run #{text}")
    if run is not None:
        if metrics:
            raise CompareError(
                f"an aggregate-metrics file goes with a rollouts.jsonl, not with run #{run.pk} (it has its own)"
            )
        return side_from_run(run, role, index)
    return side_from_file(text, role, index, metrics)
