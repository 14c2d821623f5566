"""Which of NeMo Gym's files a JSONL row comes from, told by its keys, so an import that gets a file
in the wrong slot can say which slot it belongs in (or that it is no import file at all).

The shapes are those of NeMo Gym 0.7.0's ``gym eval`` outputs (real files in
``../shared/data/nemo_gym/eval_0.7.0/`` beside the checkout): ``rollouts.jsonl`` (success rows: ``response`` and
``reward``), ``rollouts_failures.jsonl`` (``_ng_failure_class``), ``rollouts_materialized_inputs.jsonl``
(task rows with ``_ng_task_index`` and ``_ng_rollout_index``, no result), a task file (a dataset:
``responses_create_params`` without the indices), the health check's ``rollout_verdicts.jsonl``
(``verdict``, ``findings``) and the profile's ``*_reward_profiling.jsonl`` (``mean/reward``,
``rollout_infos``). No Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLLOUTS, FAILURES, MATERIALIZED = "rollouts", "failures", "materialized"


@dataclass(frozen=True)
class FileShape:
    """A kind of NeMo Gym file: ``name`` (whose file, and its usual name), ``what`` (its rows, in words) and
    ``slot`` (the import slot it belongs in: ``rollouts``, ``failures``, ``materialized``; None when
    it is no import file, then ``instead`` says what to do with it)."""

    name: str
    what: str
    slot: str | None
    instead: str = ""


SUCCESS_ROWS = FileShape("NeMo Gym's rollouts.jsonl", "result rows ('response' and 'reward')", ROLLOUTS)
FAILURE_ROWS = FileShape("NeMo Gym's rollouts_failures.jsonl", "failure rows ('_ng_failure_class')", FAILURES)
MATERIALIZED_ROWS = FileShape(
    "NeMo Gym's rollouts_materialized_inputs.jsonl",
    "task rows numbered with '_ng_task_index' and '_ng_rollout_index', without a result",
    MATERIALIZED,
)
TASK_ROWS = FileShape(
    "a task file (a dataset)",
    "task rows ('responses_create_params') without a result",
    None,
    "start a new run from it (New run, or gymweb collect --input FILE)",
)
VERDICT_ROWS = FileShape(
    "the health check's rollout_verdicts.jsonl",
    "health check verdicts ('verdict', 'findings')",
    None,
    "leave it out: gymweb checks an imported run's health itself; import the rollouts.jsonl beside it",
)
PROFILE_ROWS = FileShape(
    "gym eval profile's rollouts_reward_profiling.jsonl",
    "per-task reward statistics ('mean/reward', 'rollout_infos') from gym eval profile",
    None,
    "leave it out: the run's Profile page computes these; import the rollouts.jsonl it was made from",
)

# Where a slot is, on the import page and in ``gymweb import_rollouts``.
SLOT_PLACES = {
    ROLLOUTS: "the rollouts.jsonl field (the FILE argument of gymweb import_rollouts)",
    FAILURES: "the failures sidecars field (--failures)",
    MATERIALIZED: "the materialised inputs field (--materialized-inputs)",
}


def shape_of_row(row: dict[str, Any]) -> FileShape | None:
    """The kind of NeMo Gym file ``row`` comes from, by its keys; None for a row of no known kind.
    The order matters: a failure row also carries 'response' and 'reward' (NeMo Gym's placeholders),
    a result row also carries the task's 'responses_create_params' and indices."""
    if "_ng_failure_class" in row:
        return FAILURE_ROWS
    if "verdict" in row and "findings" in row:
        return VERDICT_ROWS
    if "mean/reward" in row or "rollout_infos" in row:
        return PROFILE_ROWS
    if "response" in row or "reward" in row:
        return SUCCESS_ROWS
    if "responses_create_params" in row:
        return MATERIALIZED_ROWS if "_ng_rollout_index" in row and "_ng_task_index" in row else TASK_ROWS
    return None


def slot_advice(shape: FileShape) -> str:
    """What to do with a file of ``shape`` given in a slot it does not belong in: the slot to put it
    in, or what to do instead."""
    if shape.slot is None:
        return shape.instead
    return f"give it in {SLOT_PLACES[shape.slot]}"


def wrong_slot_message(row: dict[str, Any], slot: str) -> tuple[str, str] | None:
    """``(what was found, what to do)`` for a row that does not belong in ``slot``, by the row's shape;
    None when the row's kind is unknown (the caller keeps its own words)."""
    shape = shape_of_row(row)
    if shape is None or shape.slot == slot:
        return None
    found = f"this row looks like one of {shape.name}: {shape.what}, which do not go in {SLOT_PLACES[slot]}"
    return found, slot_advice(shape)
