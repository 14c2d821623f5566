"""Runs retry their non-terminal failures by themselves (``Run.auto_retry``: runs made in the web and
the API, ``collect --auto-retry``): failed keys with attempts left get a new attempt after a backoff
counted from the run's last failure, before the run completes; terminal failures and kill-shaped keys
never; ``collect`` without the flag keeps NeMo Gym's semantics (failures wait for ``--resume``)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from aiohttp import web
from django.core.management import call_command
from django.utils import timezone

from gymweb.examples import counter_agent
from gymweb.examples._serve import BackgroundServer, add_fallback_routes
from rollouts.collection import runs
from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run

S = Rollout.Status


def _auto(run: Run) -> Run:
    Run.objects.filter(pk=run.pk).update(auto_retry=True, status=Run.Status.RUNNING, finished=None)
    run.refresh_from_db()
    return run


def _fail(rollout: Rollout, seconds_ago: float, **kwargs) -> None:
    finish(rollout, S.FAILED, kind=kwargs.pop("kind", "agent_http_error"), **kwargs)
    Rollout.objects.filter(pk=rollout.pk).update(finished=timezone.now() - timedelta(seconds=seconds_ago))


def test_auto_retry_is_on_for_new_runs_by_default():
    from gymweb import settings as defaults

    assert defaults.GYMWEB_AUTO_RETRY is True  # unless GYMWEB_AUTO_RETRY=0


def test_a_failed_key_with_attempts_left_gets_a_new_attempt_once_its_backoff_passed(db, settings):
    settings.GYMWEB_AUTO_RETRY_DELAY_S = 5
    run = _auto(make_run(2))
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    _fail(key(run, 1), seconds_ago=1)
    assert runs.auto_retry_wait(run) == pytest.approx(4, abs=0.5)
    assert runs.finish_if_done(run.pk) is False  # not due yet: the run stays running, nothing queued
    assert not Rollout.objects.filter(run=run, status=S.PENDING).exists()

    Rollout.objects.filter(run=run, status=S.FAILED).update(finished=timezone.now() - timedelta(seconds=6))
    assert runs.finish_if_done(run.pk) is False
    pending = Rollout.objects.get(run=run, status=S.PENDING)
    assert (pending.task_index, pending.attempt) == (1, 2)
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING


def test_each_later_wave_waits_twice_as_long(db, settings):
    settings.GYMWEB_AUTO_RETRY_DELAY_S = 5
    run = _auto(make_run(1, max_attempts=4))
    _fail(key(run, 0), seconds_ago=0)
    from .run_factories import new_attempt

    _fail(new_attempt(run, 0), seconds_ago=0)  # attempt 2 failed: attempt 3 waits 10 s
    assert runs.auto_retry_wait(run) == pytest.approx(10, abs=0.5)


def test_a_run_completes_when_its_failures_are_terminal_or_out_of_attempts(db):
    run = _auto(make_run(2, max_attempts=1))
    _fail(key(run, 0), seconds_ago=60)  # its one attempt is spent
    _fail(key(run, 1), seconds_ago=60, kind="agent_invalid_response", terminal=True)
    assert runs.auto_retry_wait(run) is None
    assert runs.finish_if_done(run.pk) is True
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED


def test_a_run_without_auto_retry_completes_with_its_failures(db):
    run = make_run(1, status=Run.Status.RUNNING)
    _fail(key(run, 0), seconds_ago=60)
    assert runs.finish_if_done(run.pk) is True
    assert Rollout.objects.filter(run=run).count() == 1


def test_runs_made_in_the_web_retry_by_themselves_unless_the_setting_is_off(signed_in, settings, counter_tasks_path):
    from django.urls import reverse

    for value in (True, False):
        settings.GYMWEB_AUTO_RETRY = value
        with counter_tasks_path.open("rb") as fh:
            response = signed_in.post(
                reverse("run_new"),
                {
                    "name": f"auto {value}",
                    "agent_url": "http://127.0.0.1:9102",
                    "env_url": "http://127.0.0.1:9101",
                    "agent_name": "remote_agent",
                    "concurrency": 4,
                    "num_repeats": 1,
                    "max_attempts": 3,
                    "remote_responses_timeout_s": 1800,
                    "run_timeout_s": 2100,
                    "dataset_file": fh,
                },
            )
        assert response.status_code == 302, response.content.decode()[:2000]
        assert Run.objects.get(name=f"auto {value}").auto_retry is value


def _first_call_fails_agent():
    """The counter agent, except that the first call of each task answers HTTP 500."""
    seen: set[str] = set()

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = json.dumps(body["input"][0])
        if text not in seen:
            seen.add(text)
            return web.Response(status=500, text="injected failure")
        return await counter_agent.responses(request)

    app = web.Application()
    app[counter_agent.CALLS_KEY] = {}
    app[counter_agent.LATENCY_KEY] = (0.0, 0.0)
    app.router.add_post("/v1/responses", responses)
    add_fallback_routes(app)
    return BackgroundServer(app).start()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("auto", [True, False], ids=["--auto-retry", "NeMo Gym's way"])
def test_collect_with_auto_retry_recovers_the_failed_keys_before_it_ends(
    tmp_path, settings, counter_env_url, counter_tasks_path, auto
):
    settings.GYMWEB_AUTO_RETRY_DELAY_S = 0.2
    agent = _first_call_fails_agent()
    try:
        out = tmp_path / "rollouts.jsonl"
        args = [
            "--agent-url",
            agent.url,
            "--env-url",
            counter_env_url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(out),
            "--no-progress",
            "--no-health-check",
        ]
        call_command("collect", *args, *(["--auto-retry"] if auto else []))
    finally:
        agent.stop()
    successes = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    failures = [
        json.loads(line) for line in (tmp_path / "rollouts_failures.jsonl").read_text().splitlines() if line.strip()
    ]
    assert len(failures) == 5  # every first attempt failed, and each is a row of the sidecar
    assert len(successes) == (5 if auto else 0)
    run = Run.objects.get()
    assert run.status == Run.Status.COMPLETED and run.auto_retry is auto
