"""A refused target in every path that sends a request (docs/production.md, "Which hosts a run may reach"):
the new-run form, the agent check page, Retry (page and API), the API's new run, a qcluster
worker, ``collect`` and ``check_agent``. Forms say so on the URL field, a queued run gets failure
rows of kind ``target_refused`` naming the rule and the setting, the CLI exits 2; nothing is
skipped silently and nothing crashes. The services run on 127.0.0.1, so turning
``GYMWEB_ALLOW_LOCAL_TARGETS`` off makes them refused targets."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Dataset, Rollout, Run
from rollouts.tokens import create_token

from .conftest import wait_for
from .run_factories import dataset_lines, finish, make_run
from .test_view_run_new import _data, _errors, _nothing_stored

LOCAL_HINT = "GYMWEB_ALLOW_LOCAL_TARGETS=1"


@pytest.fixture
def strict(settings):
    """This instance's policy without local targets (a shared server's default)."""
    settings.GYMWEB_ALLOW_LOCAL_TARGETS = False
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = []
    return settings


def _messages(response) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]


# -- forms -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "host", ["127.0.0.1", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]", "0.0.0.0", "localhost"]
)
def test_the_new_run_form_refuses_a_local_agent_in_every_spelling(signed_in, strict, host):
    response = signed_in.post(reverse("run_new"), _data(agent_url=f"http://{host}:6379"))
    assert response.status_code == 400
    (error,) = _errors(response, "agent_url")
    assert "is not allowed here" in error and LOCAL_HINT in error
    assert _nothing_stored()


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://169.254.169.254", "cloud-metadata address"),
        ("http://metadata.google.internal", "cloud-metadata host"),
        ("http://[fe80::1]:80", "link-local address"),
    ],
)
def test_the_new_run_form_refuses_metadata_and_link_local_env_urls_even_with_local_targets_on(signed_in, url, words):
    response = signed_in.post(reverse("run_new"), _data(env_url=url))
    assert response.status_code == 400
    (error,) = _errors(response, "env_url")
    assert words in error and "GYMWEB_ALLOWED_TARGET_HOSTS" in error
    assert _nothing_stored()


def test_the_new_run_form_takes_a_listed_host_port(signed_in, strict):
    strict.GYMWEB_ALLOWED_TARGET_HOSTS = ["127.0.0.1:9102", "127.0.0.1:9101"]
    response = signed_in.post(reverse("run_new"), _data())
    assert response.status_code == 302 and Run.objects.count() == 1
    response = signed_in.post(reverse("run_new"), _data(agent_url="http://127.0.0.1:6379"))
    assert "127.0.0.1:6379 is not in GYMWEB_ALLOWED_TARGET_HOSTS" in _errors(response, "agent_url")[0]


def test_the_check_page_refuses_a_local_agent_and_sends_nothing(signed_in, strict, counter_agent_url):
    response = signed_in.post(reverse("check_agent"), {"agent_url": counter_agent_url, "timeout_s": "5"})
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_agent_url_errors"' in body and "is a loopback address" in body and LOCAL_HINT in body
    assert "counter_task" not in body  # no probe report: nothing was sent


def test_the_check_page_refuses_at_connection_time_too(signed_in, strict, monkeypatch, counter_agent_url):
    from rollouts.engine import targets as engine_targets

    # the form's look-up is skipped (as if the name's address changed after it), the connection still refuses
    monkeypatch.setattr(engine_targets.TargetPolicy, "check_url", lambda self, url, **kw: None)
    response = signed_in.post(reverse("check_agent"), {"agent_url": counter_agent_url, "timeout_s": "5"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "gymweb&#x27;s target policy refused 127.0.0.1" in body or "gymweb's target policy refused 127.0.0.1" in body


def test_the_api_refuses_a_run_on_a_local_host(client, user, strict):
    token = create_token(user, "tests")[1]
    dataset = runs.store_dataset(read_jsonl(dataset_lines(1), source="t.jsonl"), "t", user=user)
    response = client.post(
        "/api/v1/runs",
        json.dumps({"dataset": dataset.pk, "agent_url": "http://2130706433:9102", "env_url": "http://127.0.0.1:9101"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert "agent_url" in errors and "env_url" in errors and LOCAL_HINT in json.dumps(errors)
    assert not Run.objects.exists()


# -- retry -----------------------------------------------------------------------------------------
def _failed_run() -> Run:
    run = make_run(2, status=Run.Status.COMPLETED)
    for r in Rollout.objects.filter(run=run):
        finish(r, Rollout.Status.FAILED, kind="agent_unreachable", error="down")
    return run


def test_retry_of_an_old_run_on_a_now_refused_host_says_why_and_queues_nothing(signed_in, strict):
    run = _failed_run()
    response = signed_in.post(reverse("run_retry", args=[run.pk]))
    assert response.status_code == 302
    (text,) = [m for m in _messages(response) if m.startswith("Not retried.")][:1]
    assert "agent URL http://127.0.0.1:9102 is refused by this instance's target policy" in text and LOCAL_HINT in text
    assert not Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).exists()
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED


def test_retry_through_the_api_is_refused_the_same_way(client, user, strict):
    token = create_token(user, "tests")[1]
    run = _failed_run()
    response = client.post(f"/api/v1/runs/{run.pk}/retry", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400
    assert "not retried" in response.json()["detail"] and LOCAL_HINT in response.json()["detail"]
    assert not Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).exists()


def test_retry_goes_ahead_once_the_host_is_allowed(signed_in, strict):
    run = _failed_run()
    strict.GYMWEB_ALLOWED_TARGET_HOSTS = ["127.0.0.1:9102", "127.0.0.1:9101"]
    response = signed_in.post(reverse("run_retry", args=[run.pk]))
    assert any(m.startswith("Retrying 2 rollouts") for m in _messages(response))


# -- workers and collect ---------------------------------------------------------------------------
def test_a_worker_fails_each_rollout_of_a_refused_run_as_target_refused(
    workers, counter_env_url, counter_agent_url, counter_tasks_path
):
    with open(counter_tasks_path, "rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(parsed, name="refused", agent_url=counter_agent_url, env_url=counter_env_url, max_attempts=1)
    runs.launch(run)
    workers.start(workers=1, GYMWEB_ALLOW_LOCAL_TARGETS="0")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED, 60, what="the run to end")
    rows = list(Rollout.objects.filter(run=run))
    assert len(rows) == 5 and all(r.status == Rollout.Status.FAILED for r in rows)
    assert {r.failure_kind for r in rows} == {"target_refused"}
    assert all("target policy refused 127.0.0.1" in r.error and LOCAL_HINT in r.error for r in rows)


@pytest.mark.django_db(transaction=True)
def test_collect_writes_target_refused_failure_rows_naming_the_setting(
    tmp_path, strict, counter_env_url, counter_agent_url, counter_tasks_path, capsys
):
    out = tmp_path / "rollouts.jsonl"
    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--no-progress",
        "--no-health-check",
        "--limit",
        "2",
        "--max-attempts",
        "1",
    )
    failures = [json.loads(line) for line in (tmp_path / "rollouts_failures.jsonl").read_text().splitlines()]
    assert len(failures) == 2
    for row in failures:
        assert "_gymweb_failure_kind" not in row  # NeMo Gym's row; the kind is in the database (below)
        assert row["_ng_failure_class"] == "remote_agent_error" and row["reward"] == 0.0
        assert (
            "seed_session failed: gymweb did not connect to the environment" in row["error"]
            and LOCAL_HINT in row["error"]
        )
    assert out.read_text() == ""
    assert set(Rollout.objects.values_list("failure_kind", flat=True)) == {"target_refused"}


# -- check_agent -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "host", ["127.0.0.1", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]", "localhost", "0.0.0.0"]
)
def test_check_agent_exits_2_naming_the_policy_for_a_local_host(strict, host):
    with pytest.raises(CommandError) as info:
        call_command("check_agent", f"http://{host}:6379")
    assert info.value.returncode == 2
    assert "target policy refused" in str(info.value) and "Nothing was sent" in str(info.value)
    assert LOCAL_HINT in str(info.value)


def test_check_agent_refuses_the_metadata_host_even_with_local_targets_on():
    with pytest.raises(CommandError) as info:
        call_command("check_agent", "http://metadata.google.internal")
    assert info.value.returncode == 2 and "cloud-metadata host" in str(info.value)


def test_check_agent_refuses_at_connection_time_too(strict, monkeypatch, counter_agent_url):
    from rollouts.engine import targets as engine_targets

    monkeypatch.setattr(engine_targets.TargetPolicy, "check_url", lambda self, url, **kw: None)
    with pytest.raises(CommandError) as info:
        call_command("check_agent", counter_agent_url)
    assert info.value.returncode == 2 and "target policy refused 127.0.0.1" in str(info.value)


def test_the_dataset_store_is_untouched_by_refused_forms(signed_in, strict):
    signed_in.post(reverse("run_new"), _data(agent_url="http://127.1:9102"))
    assert Dataset.objects.count() == 0


def test_check_agent_names_a_bad_allowlist_entry(settings):
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["http://agent:8000"]
    with pytest.raises(CommandError) as info:
        call_command("check_agent", "http://agent.example:8000")
    assert info.value.returncode == 2 and "'http://agent:8000'" in str(info.value) and "not a URL" in str(info.value)
