"""The agent check page as a background task: the POST returns at once with the task page; once
the worker has probed the agent, the task's result is the check page with the whole report."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts import background
from rollouts.models import BackgroundTask

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.DATA_DIR = tmp_path


def test_a_check_returns_the_task_page_at_once_then_links_the_report(signed_in, counter_agent_url):
    response = signed_in.post(reverse("check_agent"), {"agent_url": counter_agent_url, "timeout_s": "10"})
    task = BackgroundTask.objects.get(kind="check_agent")
    assert response.status_code == 302 and response["Location"] == reverse("task", args=[task.pk])
    assert 'data-status="queued"' in signed_in.get(response["Location"]).content.decode()

    assert background.run(task.pk) == "done"
    html = signed_in.get(reverse("task", args=[task.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "0 error(s), 0 warning(s)" in html and "hx-get" not in html
    result_url = reverse("check_agent") + f"?task={task.pk}"
    assert f'href="{result_url}"' in html
    report = signed_in.get(result_url).content.decode()
    assert 'id="check-verdict">PASS<' in report and f"<code>{counter_agent_url}/v1/responses</code>" in report
    assert report.count('<span class="ok">HTTP 200</span>') == 4


def test_another_users_check_is_not_shown(signed_in, counter_agent_url, django_user_model, client):
    signed_in.post(reverse("check_agent"), {"agent_url": counter_agent_url, "timeout_s": "10"})
    task = BackgroundTask.objects.get()
    background.run(task.pk)
    bob = django_user_model.objects.create_user(username="bob", password="x" * 20)
    client.force_login(bob)
    assert client.get(reverse("task", args=[task.pk])).status_code == 404
    page = client.get(reverse("check_agent") + f"?task={task.pk}").content.decode()
    assert "check-verdict" not in page
