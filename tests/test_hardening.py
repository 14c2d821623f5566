"""Bad input found by a hostile test: each becomes a clear error or a failure row, never a crash,
a half-stored run or a dead worker."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from rollouts.collection import runs
from rollouts.collection.datasets import DatasetError, read_jsonl
from rollouts.engine.failures import FailureKind
from rollouts.engine.loop import RolloutOutcome
from rollouts.models import Rollout, Run
from rollouts.workers.writer import Batch, write_batch

from .run_factories import collect_unreached
from .servers import AgentService, EnvService, Reply, async_test, drive, message, reply

GOOD = '{"responses_create_params": {"input": "hi"}}'


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"responses_create_params": {"input": "hi"}, "x": NaN}', "NaN is not a JSON value"),
        ('{"responses_create_params": {"input": "hi"}, "x": Infinity}', "Infinity is not a JSON value"),
        (
            '{"responses_create_params": {"input": "hi"}, "x": -1e400}',
            "the number -1e400 is too large for a 64-bit float",
        ),
        ('{"responses_create_params": {"input": "\\ud800"}}', "unpaired UTF-16 surrogate"),
        ("[" * 50000 + "]" * 50000, "nested too deeply"),
        (
            '{"responses_create_params": {"input": "hi"}, "_ng_task_index": 99999999999999999999}',
            "must be between 0 and",
        ),
        ('{"responses_create_params": {"input": "hi"}, "_ng_task_index": -1}', "must be between 0 and"),
    ],
)
def test_it_rejects_rows_that_are_not_storable_json_with_their_line(line, reason):
    with pytest.raises(DatasetError, match=reason) as exc:
        read_jsonl([GOOD, line], source="tasks.jsonl")
    assert "tasks.jsonl, line 2" in str(exc.value)


@async_test
async def test_an_agent_reply_with_nan_is_bad_json_not_a_row_with_nan():
    body = json.dumps({**reply(message()), "created_at": float("nan")})  # Python writes NaN
    assert "NaN" in body
    async with EnvService() as env, AgentService(Reply(raw=body.encode())) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_BAD_JSON
    assert "NaN is not a JSON value" in outcome.error


@async_test
async def test_an_agent_reply_with_a_number_past_float_range_is_bad_json_not_infinity():
    body = json.dumps(reply(message())).replace('"created_at": 1700000000.0', '"created_at": 1e400')
    async with EnvService() as env, AgentService(Reply(raw=body.encode())) as agent:
        outcome = await drive(agent, env)
    assert outcome.failure_kind == FailureKind.AGENT_BAD_JSON
    assert "the number 1e400 is too large for a 64-bit float" in outcome.error


@async_test
async def test_absurd_token_counts_are_accepted_as_nemo_gym_accepts_them():
    # NeMo Gym 0.7.0's NeMoGymResponse takes any integer counts (tests/data/reply_corpus.jsonl records
    # its verdict); the token columns then stay empty (tests/test_collect_token_counts.py).
    bad_usage = {
        "input_tokens": 10**30,
        "output_tokens": -1,
        "total_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    async with EnvService() as env, AgentService(reply(message(), use=bad_usage)) as agent:
        outcome = await drive(agent, env)
    assert outcome.ok and outcome.failure_kind is None


@async_test
async def test_a_row_the_loop_cannot_use_fails_the_rollout_instead_of_crashing_it():
    async with EnvService() as env, AgentService(reply(message())) as agent:
        outcome = await drive(agent, env, row={"responses_create_params": {"input": 5}})
    assert not outcome.ok and outcome.failure_kind == FailureKind.INTERNAL_ERROR
    assert "could not start this rollout" in outcome.error


def _one_running_rollout():
    parsed = read_jsonl([GOOD])
    run = runs.create_run(parsed, name="t", agent_url="http://127.0.0.1:1", env_url="http://127.0.0.1:2")
    runs.launch(run)
    rollout = Rollout.objects.get(run=run)
    Rollout.objects.filter(pk=rollout.pk).update(status="running", worker="w")
    return run, rollout


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"responses_create_params": {"input": "hi"} "x": 1}', "Expecting ',' delimiter at column 45"),
        (
            '{"responses_create_params": {"input": "hi"}, }',
            "Expecting property name enclosed in double quotes at column 46",
        ),
        ('{"responses_create_params": {"input": "hi"}} trailing', "Extra data at column 46"),
        ("\t {not json", "Expecting property name enclosed in double quotes at column 4"),
    ],
)
def test_a_json_syntax_error_names_the_file_line_once_and_the_column(line, reason):
    with pytest.raises(DatasetError) as caught:
        read_jsonl([GOOD, line], source="tasks.jsonl")
    assert str(caught.value) == f"tasks.jsonl, line 2: not valid JSON ({reason})"
    assert caught.value.line == 2


def test_strict_loads_still_says_where_in_its_own_message_and_gives_the_parts():
    from rollouts.engine.contract import NotJSON, strict_loads

    with pytest.raises(NotJSON) as caught:
        strict_loads('{"a": 1 "b": 2}')
    assert str(caught.value) == "Expecting ',' delimiter: line 1 column 9 (char 8)"
    assert (caught.value.reason, caught.value.line, caught.value.column) == ("Expecting ',' delimiter", 1, 9)
    with pytest.raises(NotJSON) as caught:
        strict_loads("[NaN]")
    assert str(caught.value) == "NaN is not a JSON value" and caught.value.column is None


@pytest.mark.django_db(transaction=True)
def test_summed_token_counts_past_64_bits_keep_the_success_with_a_warning():
    run, rollout = _one_running_rollout()
    huge = {
        "input_tokens": 10**30,
        "output_tokens": 1,
        "total_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    outcome = RolloutOutcome(ok=True, reward=1.0, verify_response={"reward": 1.0}, response={"output": []}, usage=huge)
    write_batch(Batch(finished=[(rollout.pk, outcome)]), "w")
    rollout.refresh_from_db()
    assert rollout.status == Rollout.Status.SUCCEEDED and rollout.reward == 1.0
    assert not rollout.usage_reported and rollout.input_tokens is None
    assert any("do not fit in 64 bits" in w for w in rollout.warnings)


@pytest.mark.django_db(transaction=True)
def test_overrides_that_break_the_rows_are_refused_by_the_cli(tmp_path, counter_tasks_path):
    with pytest.raises(CommandError, match="'input' must be a string or a list"):
        collect_unreached(tmp_path, counter_tasks_path, "--overrides", '{"input": 5}')
    with pytest.raises(CommandError, match="NaN is not a JSON value"):
        collect_unreached(tmp_path, counter_tasks_path, "--overrides", '{"temperature": NaN}')
    assert Run.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_cli_refuses_an_output_it_could_not_write_before_doing_any_work(tmp_path, counter_tasks_path):
    blocker = tmp_path / "file.jsonl"
    blocker.write_text("x")
    base = ["--agent-url", "http://127.0.0.1:1", "--env-url", "http://127.0.0.1:2", "--input", str(counter_tasks_path)]
    with pytest.raises(CommandError, match="is a file, not a directory"):
        call_command("collect", *base, "--output", str(blocker / "rollouts.jsonl"))
    with pytest.raises(CommandError, match="would destroy the input"):
        call_command("collect", *base, "--output", str(counter_tasks_path))
    assert Run.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_run_over_the_size_cap_is_refused_and_nothing_is_stored(settings, tmp_path, counter_tasks_path):
    settings.GYMWEB_MAX_KEYS_PER_RUN = 12
    with pytest.raises(CommandError, match="would have 15 rollouts"):
        collect_unreached(tmp_path, counter_tasks_path, "--num-repeats", "3")
    assert Run.objects.count() == 0
