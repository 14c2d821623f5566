"""A success row of ``rollouts.jsonl`` is the env's ``/verify`` reply as NeMo Gym 0.7.0's remote_agent
returns it from ``/run`` (its verify-response model's fields first, then the reply's others), for
envs that answer in another order too; the stored profile numbers are those of that row."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from rollouts.collection import export, runs
from rollouts.collection.datasets import read_jsonl
from rollouts.collection.stamps import stamp
from rollouts.engine.nemo_request import agent_result
from rollouts.evaluation.profile_report import profile_run
from rollouts.models import Rollout

from .test_profile_numbers import profile_from_full_rows, same_profile

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # NeMo Gym's notes on repeats
NEMO_FIELDS = ["responses_create_params", "response", "reward", "mask_sample", "failure_kind", "failure_reason"]


def _cases() -> list[dict]:
    return json.loads((DATA / "agent_results.json").read_text())["cases"]


def test_the_reply_is_what_nemo_gyms_agent_returns_for_it():
    """Each reply of the recorded cases (runA's rows in the example counter env's echo order, and
    made-up ones: reward first, an int reward, extras around the fields, an excluded alias) gives
    the bytes NeMo Gym's agent model gave; a reply it refuses comes back unchanged."""
    cases = _cases()
    accepted = [c for c in cases if c["result"] is not None]
    assert len(accepted) >= 15 and len(cases) > len(accepted)
    for case in accepted:
        assert orjson.dumps(agent_result(case["reply"])) == orjson.dumps(case["result"]), case["case"]
    for case in cases:
        if case["result"] is None:
            assert agent_result(case["reply"]) == case["reply"], case["case"]


@pytest.mark.django_db
def test_a_reply_in_the_counter_envs_order_exports_as_nemo_gym_writes_it():
    """Stored as a collected run's ``verify_json`` (the env's order: the task's fields, then
    ``response``, ``reward`` last), the exported line is NeMo Gym's row for that reply: the agent's
    dump plus the collector's keys (set in place) and the stamps."""
    from .run_factories import finish, key, make_run

    echo = [c for c in _cases() if c["case"].startswith("runA row")]
    assert echo
    run = make_run(1, num_repeats=len(echo))
    for rollout_index, case in enumerate(echo):
        r = finish(key(run, 0, rollout_index), Rollout.Status.SUCCEEDED, case["reply"]["reward"])
        Rollout.objects.filter(pk=r.pk).update(verify_json=json.dumps(case["reply"]))
    task_row = json.loads(run.tasks.get(task_index=0).row_json)
    ref = export.agent_ref_of(task_row, run)
    lines = list(export.iter_successes(run))
    assert len(lines) == len(echo)
    for rollout_index, (line, case) in enumerate(zip(lines, echo)):
        env_keys = list(case["reply"])
        assert env_keys.index("reward") > env_keys.index("expected_count")  # the env's order
        expected = dict(case["result"])
        expected["_ng_task_index"], expected["_ng_rollout_index"], expected["agent_ref"] = 0, rollout_index, ref
        expected = stamp(expected, ref, True)
        assert line.encode() == orjson.dumps(expected), case["case"]
        assert list(json.loads(line))[:6] == NEMO_FIELDS


@pytest.mark.django_db(transaction=True)
def test_a_counter_env_run_writes_nemo_gyms_order_and_its_profile_is_that_of_its_file(
    counter_env_url, counter_agent_url, counter_tasks_path
):
    """A run against the example counter env (its ``/verify`` echoes the task's fields, then
    ``response`` and ``reward``): each ``rollouts.jsonl`` row starts with NeMo Gym's fields and keeps
    the env's others after them in the env's order, and the profile read from the stored numbers is
    the profile of the downloaded file, byte for byte."""
    from rollouts.workers.process import run_in_process

    with counter_tasks_path.open("rb") as fh:
        run = runs.create_run(
            read_jsonl(fh), name="counter", agent_url=counter_agent_url, env_url=counter_env_url, num_repeats=2
        )
    runs.launch(run)
    run_in_process(run.pk)
    successes = Rollout.objects.filter(run=run, status=Rollout.Status.SUCCEEDED).order_by("task_index", "rollout_index")
    assert successes.count() == 10
    lines = list(export.iter_successes(run))
    for r, line in zip(successes, lines):
        reply = json.loads(r.verify_json)  # stored as the env sent it
        assert list(reply)[-1] == "reward" and list(reply)[:6] != NEMO_FIELDS
        row = json.loads(line)
        extras = [k for k in reply if k not in NEMO_FIELDS]
        assert list(row)[:6] == NEMO_FIELDS
        assert [k for k in row if k in extras] == extras
        assert (row["mask_sample"], row["failure_kind"], row["failure_reason"]) == (False, None, None)
        assert row["responses_create_params"]["input"][0]["phase"] is None  # materialised
    result, _ = profile_run(run)
    same_profile(profile_from_full_rows(run), result)
    # the profile's numbers come in the file's column order: reward before the task's numbers
    first = result.reward_profiling[0]
    names = [k for k in first if k in ("mean/reward", "mean/expected_count")]
    assert names == ["mean/reward", "mean/expected_count"]


@pytest.mark.django_db
def test_the_data_migration_stores_the_numbers_of_collected_runs_again_and_leaves_imported_ones():
    """Numbers stored from a reply in the env's order (before rows were written in NeMo Gym's order)
    are stored again from the row as the export writes it; an imported run's are left as they are."""
    import importlib
    from types import SimpleNamespace

    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from rollouts.collection.profile_numbers import loads_profile_numbers, profile_json_for_verify

    from .run_factories import finish, key, make_run

    migration = importlib.import_module("rollouts.migrations.0022_success_rows_in_agent_order")
    echo = next(c for c in _cases() if c["case"].startswith("runA row"))
    reply = {"score": 0.5, **echo["reply"]}  # a number before reward: the column order shows it
    collected = make_run(1)
    imported = make_run(1, status="imported")
    old = profile_json_for_verify(reply)
    for run in (collected, imported):
        r = finish(key(run, 0), Rollout.Status.SUCCEEDED, reply["reward"])
        Rollout.objects.filter(pk=r.pk).update(verify_json=json.dumps(reply), profile_json=old)
    assert list(loads_profile_numbers(old)["numbers"])[:2] == ["score", "expected_count"]
    loader = MigrationExecutor(connection).loader
    migration.refill_profile_json(
        loader.project_state(("rollouts", "0021_run_archive")).apps, SimpleNamespace(connection=connection)
    )
    new = Rollout.objects.get(run=collected).profile_json
    assert new == profile_json_for_verify(agent_result(reply)) != old
    assert list(loads_profile_numbers(new)["numbers"])[:2] == ["reward", "score"]
    assert Rollout.objects.get(run=imported).profile_json == old
    # and the profile the page reads is the profile of the downloaded file
    result, _ = profile_run(collected)
    same_profile(profile_from_full_rows(collected), result)
