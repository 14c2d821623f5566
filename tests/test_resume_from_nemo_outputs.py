"""NeMo Gym's own outputs as ground truth for resume: which keys a retry gives a new attempt."""

from __future__ import annotations

import pytest

from rollouts.collection.importer import import_rollouts
from rollouts.collection.runs import retryable_keys

pytestmark = pytest.mark.django_db


def _import(folder, with_successes: bool):
    failures = (folder / "rollouts_failures.jsonl").open("rb")
    successes = (folder / "rollouts.jsonl").open("rb") if with_successes else iter(())
    with failures:
        run = import_rollouts(successes, failures=failures, name=folder.name).run
    if with_successes:
        successes.close()
    return run


def test_a_terminal_failure_from_nemo_gym_is_never_retried_and_successes_are_kept(shared_data):
    run = _import(shared_data / "collect_outputs" / "mixed", with_successes=True)
    # 4 successes and 1 terminal failure ("add 13", an invalid Responses object): nothing to retry.
    assert retryable_keys(run) == {}


def test_every_key_of_a_run_whose_agent_was_down_gets_a_second_attempt(shared_data):
    run = _import(shared_data / "collect_outputs" / "agent_down", with_successes=False)
    keys = retryable_keys(run)
    assert sorted(keys) == [(i, 0) for i in range(5)]
    assert {attempt for _task_id, attempt, _kill in keys.values()} == {2}
