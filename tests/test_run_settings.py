"""A run's settings have one set of limits (``rollouts.collection.run_settings``): the new-run
form, the API and ``collect`` refuse the same values, naming the field (or the flag)."""

from __future__ import annotations

import json

import pytest
from django.core.management.base import CommandError

from rollouts.collection import run_settings
from rollouts.collection.run_settings import SettingError
from rollouts.models import Run
from rollouts.tokens import create_token

from .run_factories import collect_unreached
from .test_view_run_new import URL, _data, _errors

API = "/api/v1"

# (field, a value over or under its limit, words of the message)
REFUSED = [
    ("concurrency", 0, "at least 1"),
    ("concurrency", 5000, "at most 4096"),
    ("num_repeats", 100_001, "at most 100000"),
    ("max_attempts", 101, "at most 100"),
    ("max_attempts", 0, "at least 1"),
    ("remote_responses_timeout_s", 0.0001, "at least 0.001 s"),
    ("limit", 0, "at least 1"),
    # past a 32-bit integer (PostgreSQL's column), past a float's range: refused, not a 500
    ("limit", 2**31, "at most 2147483647, got 2147483648"),
    ("max_steps", 10**400, "at most 2147483647, got 1.000e+400"),
    ("concurrency", 2**70, "got 1180591620717411303424"),
    ("remote_responses_timeout_s", 2e9, "at most 1000000000 s"),
]


@pytest.mark.parametrize("field, value, words", REFUSED)
def test_the_rule_refuses_values_outside_the_limits(field, value, words):
    with pytest.raises(SettingError) as info:
        run_settings.check_number(field, value)
    assert info.value.field == field and words in info.value.message


def test_the_rule_takes_the_limits_themselves_and_empty_optional_ones():
    assert run_settings.check_number("concurrency", 4096) == 4096
    assert run_settings.check_number("max_steps", None) is None
    assert run_settings.check_number("max_steps", 0) == 0
    assert run_settings.check_number("run_timeout_s", 2100) == 2100.0


def test_run_timeout_is_capped_by_the_server_and_its_default_follows(settings):
    settings.GYMWEB_MAX_RUN_TIMEOUT_S = 600
    assert run_settings.default("run_timeout_s") == 600
    with pytest.raises(SettingError, match="GYMWEB_MAX_RUN_TIMEOUT_S"):
        run_settings.check_number("run_timeout_s", 601, "--run-timeout-s")


def test_a_fleet_may_raise_the_concurrency_cap_and_the_refusal_names_the_setting(settings):
    settings.GYMWEB_MAX_RUN_CONCURRENCY = 20_000
    assert run_settings.check_number("concurrency", 10_000) == 10_000
    with pytest.raises(SettingError, match="at most 20000 on this server \\(GYMWEB_MAX_RUN_CONCURRENCY\\)"):
        run_settings.check_number("concurrency", 20_001, "--concurrency")


@pytest.mark.parametrize("field, value, words", REFUSED)
def test_the_form_refuses_them_on_the_field(signed_in, field, value, words):
    response = signed_in.post(URL, _data(**{field: str(value)}))
    assert any(words in e for e in _errors(response, field)), _errors(response, field)


@pytest.mark.parametrize("field, value, words", REFUSED)
def test_the_api_refuses_them_on_the_field(client, user, field, value, words):
    _row, token = create_token(user, "t")
    body = {
        "rows": [{"responses_create_params": {"input": "hi"}}],
        "agent_url": "http://127.0.0.1:9102",
        "env_url": "http://127.0.0.1:9101",
        field: value,
    }
    response = client.post(
        f"{API}/runs", data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 400, response.content
    assert any(words in e for e in response.json()["errors"][field])


@pytest.mark.django_db
@pytest.mark.parametrize("field, value, words", REFUSED)
def test_collect_refuses_them_naming_the_flag(tmp_path, counter_tasks_path, field, value, words):
    flag = "--" + field.replace("_", "-")
    with pytest.raises(CommandError) as info:
        collect_unreached(tmp_path, counter_tasks_path, flag, str(value))
    assert str(info.value).startswith(f"{flag} must be") and words in str(info.value)
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_collect_refuses_an_agent_url_ending_in_the_responses_path_like_the_form(tmp_path, counter_tasks_path):
    with pytest.raises(CommandError, match="Did you mean http://127.0.0.1:1\\?"):
        collect_unreached(tmp_path, counter_tasks_path, agent_url="http://127.0.0.1:1/v1/responses")


@pytest.mark.django_db
def test_collect_checks_nemo_gym_max_rollout_attempts_like_the_flag(tmp_path, counter_tasks_path, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "1000")
    with pytest.raises(CommandError, match="NEMO_GYM_MAX_ROLLOUT_ATTEMPTS must be at most 100"):
        collect_unreached(tmp_path, counter_tasks_path)


def test_whole_numbers_are_written_in_full_in_a_refusal():
    with pytest.raises(SettingError, match=r"at most 4096 .*got 100000000$"):
        run_settings.check_number("concurrency", 100_000_000)
    with pytest.raises(SettingError, match=r"at least 0\.001 s, got -0\.5$"):
        run_settings.check_number("remote_responses_timeout_s", -0.5)
