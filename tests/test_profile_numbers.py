"""Stored profile numbers (``Rollout.profile_json``, ``collection.profile_numbers``): profiling a run
from them gives NeMo Gym's profile of its full ``rollouts.jsonl`` rows, byte for byte.

The reference is always the long way round: ``profile.profile_rows`` over the full rows
(``export.iter_materialized`` + ``export.iter_successes``), which the other tests check against NeMo
Gym's own output. Equality here is exact: same bytes in NeMo Gym's layout, and recursively the same
keys in the same order, the same types and bit-identical floats.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Count, Max, Q

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.collection.export import iter_materialized, iter_successes
from rollouts.collection.importer import import_rollouts
from rollouts.collection.profile_numbers import (
    PROFILE_NUMBERS_PREFIX,
    PROFILE_NUMBERS_VERSION,
    dumps_profile_numbers,
    loads_profile_numbers,
    profile_json_for_verify,
    profile_numbers,
)
from rollouts.engine.nemo_request import agent_result
from rollouts.evaluation.outputs import dumps
from rollouts.evaluation.pass_at_k import gymweb_extras
from rollouts.evaluation.profile_report import (
    EXTRAS_FAILURES_NOTE,
    failures_as_zero_rows,
    profile_run,
    run_materialized_rows,
    run_success_rows,
)
from rollouts.evaluation.reward_profile import ReducedRollout, iter_jsonl, profile_rows
from rollouts.models import Rollout

from .run_factories import finish, key, make_run, new_attempt

FIXTURE = Path(__file__).resolve().parent / "data" / "profile_fixture"
S = Rollout.Status
T, R = "_ng_task_index", "_ng_rollout_index"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # NeMo Gym's notes on repeats


# --- helpers ------------------------------------------------------------------------------------


def identical(expected, actual, path="$"):
    """Same keys in the same order, same types, floats equal bit for bit (NaN equal to NaN)."""
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            identical(expected[k], actual[k], f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: {len(actual)} items != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            identical(e, a, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert (math.isnan(expected) and math.isnan(actual)) or (
            expected == actual and math.copysign(1.0, expected) == math.copysign(1.0, actual)
        ), f"{path}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def same_profile(expected, actual):
    """Two ProfileResults: NeMo Gym's three files byte for byte, and everything else exactly."""
    for part in ("reward_profiling", "agent_metrics", "repeat_level_metrics", "completion_summary"):
        assert dumps(getattr(actual, part)) == dumps(getattr(expected, part)), part
        identical(getattr(expected, part), getattr(actual, part), part)
    assert actual.masked_rollouts == expected.masked_rollouts


def reduced(rows):
    """Each row as its key and its numbers, through the stored text (as profile_run reads them)."""
    return [ReducedRollout(r[T], r[R], loads_profile_numbers(dumps_profile_numbers(profile_numbers(r)))) for r in rows]


def profile_both_ways(materialized, rows, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile_rows(materialized, rows, **kwargs), profile_rows(materialized, reduced(rows), **kwargs)


def profile_from_full_rows(run):
    """The long way round: the run's files (as the export writes them), parsed and profiled."""
    result = profile_rows(
        [json.loads(line) for line in iter_materialized(run)],
        [json.loads(line) for line in iter_successes(run)],
        allow_partial_rollouts=True,
    )
    return result


def failures_as_zero_oracle(run):
    """The failures-as-0 rows by one SQL aggregate over the run's attempts (gymweb's first
    implementation of ``failures_as_zero_rows``), to check the faster one against."""
    keys = (
        Rollout.objects.filter(run=run)
        .values("task_index", "rollout_index")
        .annotate(
            success_reward=Max("reward", filter=Q(status=S.SUCCEEDED)),
            succeeded=Count("id", filter=Q(status=S.SUCCEEDED)),
            failed=Count("id", filter=Q(status=S.FAILED)),
        )
        .filter(Q(succeeded__gt=0) | Q(failed__gt=0))
        .order_by("task_index", "rollout_index")
    )
    names = {}
    for task in run.tasks.all():
        ref = json.loads(task.row_json).get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        names[task.task_index] = name if isinstance(name, str) else run.agent_name
    rows = []
    for k in keys:
        reward = k["success_reward"] if k["succeeded"] else 0.0
        rows.append(
            {
                T: k["task_index"],
                R: k["rollout_index"],
                "reward": float(reward) if reward is not None else 0.0,
                "agent_ref": {"name": names.get(k["task_index"], run.agent_name)},
            }
        )
    return rows


def assert_profile_run_is_the_long_way_round(run):
    result, extras = profile_run(run)
    same_profile(profile_from_full_rows(run), result)
    expected_extras = gymweb_extras(failures_as_zero_oracle(run))
    expected_extras["estimator"]["failures"] = EXTRAS_FAILURES_NOTE
    identical(expected_extras, extras)
    identical([json.loads(line) for line in iter_materialized(run)], list(run_materialized_rows(run)))
    identical(failures_as_zero_oracle(run), list(failures_as_zero_rows(run)))
    return result, extras


# --- profile.profile_numbers and ReducedRollout ---------------------------------------------------


def test_the_fixture_profiled_from_its_numbers_is_the_fixture_profiled_from_its_rows():
    materialized = list(iter_jsonl(FIXTURE / "rollouts_materialized_inputs.jsonl"))
    rows = list(iter_jsonl(FIXTURE / "rollouts.jsonl"))
    full, from_numbers = profile_both_ways(materialized, rows)
    same_profile(full, from_numbers)
    assert full.reward_profiling and full.repeat_level_metrics  # the comparison covers every file
    # rows and reduced rows mix freely, in any order
    mixed = [r if i % 2 else red for i, (r, red) in enumerate(zip(rows, reduced(rows)))][::-1]
    same_profile(full, profile_rows(materialized, mixed))
    identical(gymweb_extras(full), gymweb_extras(from_numbers))


def test_the_stored_text_is_small_and_leaves_out_info_when_it_is_the_numbers():
    row = next(iter_jsonl(FIXTURE / "rollouts.jsonl"))
    text = dumps_profile_numbers(profile_numbers(row))
    assert (
        text
        == '{"v":1,"masked":false,"numbers":{"reward":1.0,"input_tokens":141,"output_tokens":27,"total_tokens":168}}'
    )
    assert text.startswith(PROFILE_NUMBERS_PREFIX) and len(text) < len(json.dumps(row)) / 20
    numbers = loads_profile_numbers(text)
    assert (
        numbers["info"]
        == numbers["numbers"]
        == {"reward": 1.0, "input_tokens": 141, "output_tokens": 27, "total_tokens": 168}
    )
    # a field after the reward is listed in another order in rollout_infos: info is then stored
    row = {"reward": True, "turns": 3, "response": {"usage": {"input_tokens": 5}}}
    numbers = profile_numbers(row)
    assert list(numbers["numbers"].items()) == [("reward", 1), ("turns", 3), ("input_tokens", 5)]
    assert list(numbers["info"].items()) == [("reward", True), ("input_tokens", 5), ("turns", 3)]
    identical(numbers, loads_profile_numbers(dumps_profile_numbers(numbers)))


def test_the_numbers_do_not_depend_on_the_rows_key():
    row = next(iter_jsonl(FIXTURE / "rollouts.jsonl"))
    moved = {**row, T: 99, R: 7}
    assert profile_numbers(moved) == profile_numbers(row)
    assert dumps_profile_numbers(profile_numbers(moved)) == dumps_profile_numbers(profile_numbers(row))


ODD_ROWS = [
    # usage overrides a same-named top-level field in place; a non-numeric usage value hides it
    {"input_tokens": "n/a", "reward": 0.5, "response": {"usage": {"input_tokens": 10, "output_tokens": 2}}},
    {"reward": 1.0, "output_tokens": 7, "response": {"usage": {"input_tokens": 3, "output_tokens": {"x": 1}}}},
    # bools, big ints, -0.0, fields that are never profiled, a usage "reward" and "rollout_id"
    {
        "reward": True,
        "flag": False,
        "big": 2**70,
        "neg": -0.0,
        "_private": 1,
        "agent_name": 3,
        "response": {"usage": {"reward": 0.25, "rollout_id": 9, T: 42}},
    },
    # no reward, a non-numeric reward, a response that is not an object, usage null
    {"score": 0.75, "response": "text"},
    {"reward": "high", "response": {"usage": None}},
    # masked rows: mask_sample's truth, even from a string; a usage mask_sample is just a number
    {"reward": 0.0, "mask_sample": "yes"},
    {"reward": 1.0, "mask_sample": 0, "response": {"usage": {"mask_sample": 1}}},
    # a top-level agent_ref that is not an object is a profiled number
    {"reward": 1.0, "agent_ref": 4},
]


def test_rows_with_every_odd_field_profile_the_same_from_their_numbers():
    materialized, rows = [], []
    for task in range(4):
        for repeat in range(3):
            materialized.append({"p": task, T: task, R: repeat, "agent_ref": {"name": "a"}})
            base = ODD_ROWS[(task * 3 + repeat) % len(ODD_ROWS)]
            rows.append({**base, T: task, R: repeat})
    full, from_numbers = profile_both_ways(materialized, rows)
    same_profile(full, from_numbers)
    assert full.masked_rollouts == 1 and full.agent_metrics[0]["coverage/masked_rollouts"] == 1
    assert "mean/big" in full.agent_metrics[0] and "mean/agent_name" not in full.agent_metrics[0]


def _random_case(rng):
    fields = rng.sample(
        ["reward", "turns", "input_tokens", "score", "mask_sample", "agent_name", "_x", "rollout_id"], 5
    )
    usage_fields = rng.sample(["input_tokens", "output_tokens", "total_tokens", "reward", "score", "mask_sample"], 3)
    values = [0, 1, 2.5, -0.0, 1e300, True, False, None, "s", [1], {"a": 1}, 0.1, 17]
    materialized, rows = [], []
    for task in range(rng.randint(1, 5)):
        agents = rng.choice([["a"], ["a", "b"], [None]])
        for n, agent in enumerate(agents):
            for repeat in range(rng.choice([1, 2, 4, 9])):
                key = {T: task, R: repeat + 100 * n}
                materialized.append({"i": task, **key, **({"agent_ref": {"name": agent}} if agent else {})})
                if rng.random() < 0.2:
                    continue
                row = {f: rng.choice(values) for f in fields if rng.random() < 0.8}
                if rng.random() < 0.8:
                    row["response"] = {"usage": {f: rng.choice(values) for f in usage_fields if rng.random() < 0.8}}
                items = list(row.items())
                rng.shuffle(items)
                rows.append({**dict(items), **key, **({"agent_ref": {"name": agent}} if agent else {})})
    rng.shuffle(rows)
    return materialized, rows


@pytest.mark.parametrize("seed", range(60))
def test_random_rows_profile_the_same_from_their_numbers(seed):
    materialized, rows = _random_case(random.Random(seed))
    full, from_numbers = profile_both_ways(materialized, rows, allow_partial_rollouts=True)
    same_profile(full, from_numbers)
    for continuous in ("expected_max", "first_k"):
        identical(gymweb_extras(full, continuous=continuous), gymweb_extras(from_numbers, continuous=continuous))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        '{"v":0,"masked":false,"numbers":{}}',
        '{"v":2,"masked":false,"numbers":{}}',
        PROFILE_NUMBERS_PREFIX + '"masked":false,"numbers":{"reward":1.0}',
        PROFILE_NUMBERS_PREFIX + '"masked":false,"numbers":{}}x',
        PROFILE_NUMBERS_PREFIX + '"masked":0,"numbers":{}}',
        PROFILE_NUMBERS_PREFIX + '"masked":false,"numbers":[]}',
        PROFILE_NUMBERS_PREFIX + '"masked":false,"numbers":{},"info":[]}',
        '{"V":1,"masked":false,"numbers":{}}',
    ],
)
def test_texts_that_are_not_numbers_of_this_version_read_as_unknown(text):
    assert loads_profile_numbers(text) is None
    assert PROFILE_NUMBERS_VERSION == 1


def test_profile_json_for_verify_is_the_numbers_of_the_row_the_export_writes():
    fixture_rows = list(iter_jsonl(FIXTURE / "rollouts.jsonl"))
    assert len(fixture_rows) == 20
    for row in fixture_rows:
        verify = {k: v for k, v in row.items() if k not in (T, R, "agent_ref")}
        exported = {**verify, T: row[T], R: row[R], "agent_ref": row["agent_ref"]}
        assert profile_json_for_verify(verify) == dumps_profile_numbers(profile_numbers(exported))
        assert profile_json_for_verify(verify, row["agent_ref"]) == profile_json_for_verify(verify)
    # an agent_ref that is not an object is profiled, so its value matters
    verify = {"reward": 1.0}
    assert loads_profile_numbers(profile_json_for_verify(verify, 3))["numbers"] == {"reward": 1.0, "agent_ref": 3}
    assert loads_profile_numbers(profile_json_for_verify(verify))["numbers"] == {"reward": 1.0}


# --- stored runs ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_collected_in_process_stores_the_numbers_and_profiles_from_them(
    counter_env_url, counter_agent_url, counter_tasks_path
):
    from rollouts.workers.process import run_in_process

    with counter_tasks_path.open("rb") as fh:
        run = runs.create_run(
            read_jsonl(fh), name="counter", agent_url=counter_agent_url, env_url=counter_env_url, num_repeats=3
        )
    runs.launch(run)
    run_in_process(run.pk)
    successes = list(Rollout.objects.filter(run=run, status=S.SUCCEEDED))
    assert len(successes) == 15
    for r in successes:
        # the numbers of the row rollouts.jsonl carries: the reply as NeMo Gym's agent returns it
        assert r.profile_json == profile_json_for_verify(agent_result(json.loads(r.verify_json)))
        numbers = loads_profile_numbers(r.profile_json)
        assert numbers["numbers"]["reward"] == r.reward == 1.0
        assert {"input_tokens", "output_tokens", "total_tokens"} <= set(numbers["numbers"])
    assert all(isinstance(row, ReducedRollout) for row in run_success_rows(run))  # no verify_json parsed
    result, _ = assert_profile_run_is_the_long_way_round(run)
    assert [t["num_rollouts"] for t in result.reward_profiling] == [3] * 5


def test_an_imported_file_stores_the_numbers_and_profiles_like_nemo_gym(db):
    summary = import_rollouts((FIXTURE / "rollouts.jsonl").open("rb"))
    run = summary.run
    stored = Rollout.objects.filter(run=run, status=S.SUCCEEDED)
    assert stored.count() == 20 and not stored.filter(profile_json="").exists()
    assert all(isinstance(row, ReducedRollout) for row in run_success_rows(run))
    result, extras = assert_profile_run_is_the_long_way_round(run)
    # The numbers are NeMo Gym's own (its files for this fixture; the samples differ: an imported
    # run's task rows come from the rollouts file, not from the materialised inputs).
    nemo = json.loads((FIXTURE / "rollouts_agent_metrics.json").read_text())
    assert nemo and nemo[0]
    for key_, value in nemo[0].items():
        assert (
            math.isclose(result.agent_metrics[0][key_], value, rel_tol=1e-9)
            if isinstance(value, float)
            else result.agent_metrics[0][key_] == value
        )
    assert [t["num_passed"] for t in extras["per_task"]] == [4, 3, 1, 0, 2]


def _mixed_run():
    """3 tasks × 2 repeats with failures, a retried key and a key that never finished."""
    run = make_run(3, num_repeats=2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 0, 1), S.SUCCEEDED, 0.5)
    finish(key(run, 1, 0), S.FAILED)
    finish(new_attempt(run, 1, 0), S.SUCCEEDED, 0.25)
    finish(key(run, 1, 1), S.FAILED)
    finish(key(run, 2, 0), S.SUCCEEDED, 0.0)
    finish(key(run, 2, 1), S.CANCELLED)
    return run


@pytest.mark.django_db
def test_rows_without_numbers_are_read_from_verify_json_with_the_same_result():
    run = _mixed_run()  # stored like rows written before profile_json existed: all blank
    assert not Rollout.objects.filter(run=run).exclude(profile_json="").exists()
    assert not any(isinstance(row, ReducedRollout) for row in run_success_rows(run))
    assert_profile_run_is_the_long_way_round(run)

    successes = list(Rollout.objects.filter(run=run, status=S.SUCCEEDED).order_by("task_index", "rollout_index"))
    for r in successes:
        r.profile_json = profile_json_for_verify(agent_result(json.loads(r.verify_json)))
    successes[1].profile_json = ""  # unknown
    successes[2].profile_json = '{"v":0,"masked":false,"numbers":{"reward":9.0}}'  # another version
    successes[3].profile_json = PROFILE_NUMBERS_PREFIX + '"masked":fals'  # unreadable, yet with the prefix
    Rollout.objects.bulk_update(successes, ["profile_json"])
    kinds = [type(row).__name__ for row in run_success_rows(run)]
    assert kinds == ["ReducedRollout", "dict", "dict", "dict"]
    assert_profile_run_is_the_long_way_round(run)


@pytest.mark.django_db
def test_materialized_rows_are_the_exports_even_for_keys_whose_task_index_has_no_task():
    run = _mixed_run()
    task = run.tasks.get(task_index=1)
    Rollout.objects.create(run=run, task=task, task_index=7, rollout_index=0)  # not made by gymweb
    names = {}
    rows = list(run_materialized_rows(run, names))
    identical([json.loads(line) for line in iter_materialized(run)], rows)
    assert [(r[T], r[R]) for r in rows][-1] == (1, 0)  # the export writes its task's row
    assert names == {0: "remote_agent", 1: "remote_agent", 2: "remote_agent"}


@pytest.mark.django_db
def test_stored_numbers_are_what_the_profile_reads():
    run = _mixed_run()
    r = key(run, 0, 0)
    r.profile_json = dumps_profile_numbers(
        {"v": 1, "masked": False, "numbers": {"reward": 0.125}, "info": {"reward": 0.125}}
    )
    r.save(update_fields=["profile_json"])
    result, _ = profile_run(run)
    assert result.reward_profiling[0]["rollout_infos"][0]["reward"] == 0.125  # not verify_json's 1.0


@pytest.mark.django_db
def test_profile_run_keeps_the_garbage_collector_as_it_found_it():
    import gc

    run = _mixed_run()
    assert gc.isenabled()
    profile_run(run)
    assert gc.isenabled()
    gc.disable()
    try:
        profile_run(run)
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.django_db
def test_the_data_migration_fills_the_numbers_of_successes_stored_before_it(monkeypatch):
    name = "0005_fill_rollout_profile_json"
    migration = importlib.import_module(f"rollouts.migrations.{name}")
    loader = MigrationExecutor(connection).loader
    assert ("rollouts", name) in loader.applied_migrations  # the test database ran it
    run = _mixed_run()  # successes stored without numbers
    Rollout.objects.filter(run=run, task_index=2).update(verify_json="not json")  # unreadable: stays blank
    monkeypatch.setattr(migration, "BATCH", 2)  # several batches
    # the models as they were before the migration ran
    migration.fill_profile_json(
        loader.project_state(("rollouts", "0004_rollout_profile_json")).apps, SimpleNamespace(connection=connection)
    )
    filled = 0
    for r in Rollout.objects.filter(run=run):
        if r.status == S.SUCCEEDED and r.task_index != 2:
            assert r.profile_json == profile_json_for_verify(json.loads(r.verify_json)), r
            filled += 1
        else:
            assert r.profile_json == "", r
    assert filled == 3
    # the later migration stores them again from the rows in NeMo Gym's order, as the export writes them
    later = importlib.import_module("rollouts.migrations.0022_success_rows_in_agent_order")
    later.refill_profile_json(
        loader.project_state(("rollouts", "0021_run_archive")).apps, SimpleNamespace(connection=connection)
    )
    Rollout.objects.filter(run=run, task_index=2).delete()
    assert all(isinstance(row, ReducedRollout) for row in run_success_rows(run))
    assert_profile_run_is_the_long_way_round(run)
