"""At most GYMWEB_MAX_TASKS_PER_USER background tasks per user are queued or running: past it the
page says so and nothing is queued; a task is run once however often it is delivered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts import background
from rollouts.models import BackgroundTask

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.GYMWEB_MAX_TASKS_PER_USER = 2
    settings.DATA_DIR = tmp_path


def _check(client, n: int):
    return client.post(reverse("check_agent"), {"agent_url": f"http://127.0.0.1:{9000 + n}", "timeout_s": "1"})


def test_a_third_task_is_refused_on_the_page_and_nothing_is_queued(
    signed_in, django_capture_on_commit_callbacks, django_user_model, client, queued
):
    with django_capture_on_commit_callbacks(execute=True):
        assert _check(signed_in, 1).status_code == 302
        assert _check(signed_in, 2).status_code == 302
        refused = _check(signed_in, 3)
    assert refused.status_code == 400
    assert "You already have 2 background task(s) queued or running" in refused.content.decode()
    assert BackgroundTask.objects.count() == 2 and len(queued) == 2

    bob = django_user_model.objects.create_user(username="bob", password="x" * 20)
    client.force_login(bob)
    assert _check(client, 4).status_code == 302  # the limit is per user

    BackgroundTask.objects.filter(pk=BackgroundTask.objects.filter(user__username="alice").first().pk).update(
        status=BackgroundTask.Status.DONE
    )
    assert _check(signed_in, 5).status_code == 302  # one ended: room again


def test_a_task_is_claimed_once(user):
    params = {"agent_url": "http://127.0.0.1:1", "timeout_s": 0.5}
    task, created = background.start(BackgroundTask.Kind.CHECK_AGENT, user, params)
    assert created
    assert background.run(task.pk) in ("done", "failed")
    assert background.run(task.pk) == "not claimed"


def test_a_task_lost_with_its_worker_is_failed_and_frees_its_place(user):
    from datetime import timedelta

    from django.utils import timezone

    params = {"agent_url": "http://127.0.0.1:1", "timeout_s": 0.5}
    lost, _ = background.start(BackgroundTask.Kind.CHECK_AGENT, user, params)
    background.start(BackgroundTask.Kind.CHECK_AGENT, user, params)
    long_ago = timezone.now() - timedelta(seconds=background.STALE_AFTER_S + 60)
    # Claimed without a lease (run inline: ``alive_until`` none), long ago.
    BackgroundTask.objects.filter(pk=lost.pk).update(
        status=BackgroundTask.Status.RUNNING, started=long_ago, alive_until=None
    )
    third, created = background.start(BackgroundTask.Kind.CHECK_AGENT, user, params)
    assert created
    lost.refresh_from_db()
    assert lost.status == BackgroundTask.Status.FAILED and "worker running this task stopped" in lost.message
