"""Cancel and retry: POST only, CSRF-checked, through ``runs.cancel`` and ``runs.resume``."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run

S = Rollout.Status


def _messages(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def running_run(db):
    run = make_run(3, status=Run.Status.RUNNING)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    return run


def test_actions_require_login(client, running_run):
    for name in ("run_cancel", "run_retry"):
        response = client.post(reverse(name, args=[running_run.pk]))
        assert response.status_code == 302 and reverse("login") in response["Location"]
    assert Run.objects.get(pk=running_run.pk).status == Run.Status.RUNNING


def test_actions_refuse_get(signed_in, running_run):
    for name in ("run_cancel", "run_retry"):
        assert signed_in.get(reverse(name, args=[running_run.pk])).status_code == 405
    assert Run.objects.get(pk=running_run.pk).status == Run.Status.RUNNING


def test_actions_need_the_csrf_token(user, running_run):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(reverse("run_cancel", args=[running_run.pk])).status_code == 403
    assert Run.objects.get(pk=running_run.pk).status == Run.Status.RUNNING
    page = client.get(reverse("run", args=[running_run.pk]))
    token = str(page.context["csrf_token"])
    response = client.post(reverse("run_cancel", args=[running_run.pk]), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Run.objects.get(pk=running_run.pk).status == Run.Status.CANCELLED


def test_cancel_asks_for_confirmation_before_it_is_sent(signed_in, running_run):
    html = signed_in.get(reverse("run", args=[running_run.pk])).content.decode()
    form = html[html.rindex("<form", 0, html.index('id="cancel-run"')) : html.index('id="cancel-run"')]
    assert f'action="{reverse("run_cancel", args=[running_run.pk])}"' in form
    assert 'data-confirm="Cancel this run?' in form  # gymweb/static/gymweb/confirm.js asks (see the browser test)
    assert "gymweb/confirm." in html


def test_an_unknown_run_is_404(signed_in):
    assert signed_in.post(reverse("run_cancel", args=[404])).status_code == 404
    assert signed_in.post(reverse("run_retry", args=[404])).status_code == 404


def test_cancel_stops_the_run_and_its_pending_rollouts(signed_in, running_run):
    response = signed_in.post(reverse("run_cancel", args=[running_run.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[running_run.pk])
    assert Run.objects.get(pk=running_run.pk).status == Run.Status.CANCELLED
    assert sorted(Rollout.objects.filter(run=running_run).values_list("status", flat=True)) == [
        "cancelled",
        "cancelled",
        "succeeded",
    ]
    assert any("cancelled" in m for m in _messages(response))
    body = signed_in.get(reverse("run", args=[running_run.pk])).content.decode()
    assert 'id="cancel-run"' not in body and 'id="retry-run"' in body  # cancelled keys can run again


def test_cancelling_a_finished_run_changes_nothing(signed_in, db):
    run = make_run(1)
    response = signed_in.post(reverse("run_cancel", args=[run.pk]))
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    assert any("already completed" in m for m in _messages(response))


def test_retry_queues_failed_and_cancelled_keys_but_not_terminal_ones(signed_in, db):
    run = make_run(4)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.FAILED, kind="agent_timeout")
    finish(key(run, 2), S.FAILED, kind="agent_invalid_response", terminal=True)
    finish(key(run, 3), S.CANCELLED)
    assert 'id="retry-run"' in signed_in.get(reverse("run", args=[run.pk])).content.decode()
    response = signed_in.post(reverse("run_retry", args=[run.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[run.pk])
    assert any("Retrying 2 rollouts" in m for m in _messages(response))
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    pending = Rollout.objects.filter(run=run, status=S.PENDING).order_by("task_index")
    assert [(r.task_index, r.attempt) for r in pending] == [(1, 2), (3, 1)]


def test_retry_with_nothing_to_retry_says_so(signed_in, db):
    run = make_run(1)
    finish(key(run, 0), S.FAILED, kind="agent_invalid_response", terminal=True)
    response = signed_in.post(reverse("run_retry", args=[run.pk]))
    assert any("Nothing to retry" in m for m in _messages(response))
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED


def test_an_imported_run_cannot_be_retried(signed_in, db):
    run = make_run(1, status=Run.Status.IMPORTED)
    finish(key(run, 0), S.FAILED)
    response = signed_in.post(reverse("run_retry", args=[run.pk]))
    assert any("imported" in m for m in _messages(response))
    assert not Rollout.objects.filter(run=run, status=S.PENDING).exists()
    assert 'id="retry-run"' not in signed_in.get(reverse("run", args=[run.pk])).content.decode()


@pytest.mark.django_db(transaction=True)
def test_retry_runs_the_failed_keys_again_and_they_succeed_once_the_agent_is_up(
    client, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path
):
    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl
    from rollouts.workers.process import run_in_process

    client.force_login(django_user_model.objects.create_user("carol", password="x" * 12))
    with open(counter_tasks_path, "rb") as fh:
        run = runs.create_run(
            read_jsonl(fh), name="down", agent_url="http://127.0.0.1:9", env_url=counter_env_url, limit=2
        )
    runs.launch(run)
    run_in_process(run.pk)
    assert set(Rollout.objects.filter(run=run).values_list("status", "failure_kind")) == {
        ("failed", "agent_unreachable")
    }
    Run.objects.filter(pk=run.pk).update(agent_url=counter_agent_url)  # the service came up at its address
    response = client.post(reverse("run_retry", args=[run.pk]))
    assert response.status_code == 302
    run_in_process(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    latest = Rollout.objects.filter(run=run, attempt=2)
    assert sorted(latest.values_list("task_index", "status", "reward")) == [
        (0, "succeeded", 1.0),
        (1, "succeeded", 1.0),
    ]
    body = client.get(reverse("run", args=[run.pk])).content.decode()
    assert "<strong>2</strong> / 2 done" in body
