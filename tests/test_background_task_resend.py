"""A queued background task whose broker message was lost (a Redis restarted without persistence)
is sent to the workers again by the sweep, once per ``background.RESEND_AFTER_S``; sent twice, it
still runs once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from rollouts import background
from rollouts.models import BackgroundTask
from rollouts.workers import claims

RUNS: list[int] = []


def _job(task, progress):
    RUNS.append(task.pk)
    return background.Done("done")


@pytest.fixture
def queued_tasks(settings, tmp_path, queued, monkeypatch):
    settings.GYMWEB_TASKS_INLINE = False
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setitem(background.JOBS, "check_agent", f"{__name__}._job")
    RUNS.clear()
    return queued


def _lost(task: BackgroundTask) -> None:
    """As if the task's message had been sent long ago and lost."""
    BackgroundTask.objects.filter(pk=task.pk).update(alive_until=timezone.now() - timedelta(seconds=1))


def test_a_queued_task_no_worker_took_is_sent_again_by_the_sweep_and_runs_once(
    user, queued_tasks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        task, _ = background.start("check_agent", user, {"agent_url": "http://127.0.0.1:9"})
    assert len(queued_tasks) == 1 and queued_tasks[0][1] == task.pk
    queued_at = BackgroundTask.objects.get(pk=task.pk).alive_until
    assert queued_at > timezone.now() + timedelta(seconds=background.RESEND_AFTER_S - 60)

    assert "sent" not in claims.supervise(), "not overdue yet: nothing is sent"
    assert len(queued_tasks) == 1

    _lost(task)
    assert "sent 1 queued background task(s) again" in claims.supervise()
    assert [args[1] for args in queued_tasks] == [task.pk, task.pk]
    assert BackgroundTask.objects.get(pk=task.pk).alive_until > timezone.now(), "the next sending moved on"
    assert "sent" not in claims.supervise(), "one spare message per RESEND_AFTER_S, not one per sweep"

    # Both messages reach workers: the first claims and runs the task, the second finds it taken.
    assert background.run(task.pk) == BackgroundTask.Status.DONE
    assert background.run(task.pk) == "not claimed"
    assert RUNS == [task.pk]


def test_running_and_ended_tasks_are_never_sent_again(user, queued_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        task, _ = background.start("check_agent", user, {"agent_url": "http://127.0.0.1:9"})
    assert background.run(task.pk) == BackgroundTask.Status.DONE
    _lost(task)
    assert background.resend() == 0
    assert len(queued_tasks) == 1
