"""Reverify and the health check from the run page run as background tasks: the POST returns at
once with the task page, whose result is the new (or checked) run."""

from __future__ import annotations

import pytest
from aiohttp import web
from django.urls import reverse

from gymweb.examples._serve import BackgroundServer
from rollouts import background
from rollouts.models import BackgroundTask, Rollout, RolloutHealth, Run
from tests.run_factories import finish, key, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _queued_tasks(settings, tmp_path, queued):
    settings.GYMWEB_TASKS_INLINE = False
    settings.DATA_DIR = tmp_path


def _stateless_env():
    async def mode(request):
        return web.json_response("stateless")

    async def verify(request):
        body = await request.json()
        return web.json_response({**body, "reward": 0.0})

    app = web.Application()
    app.router.add_get("/reverify_mode", mode)
    app.router.add_post("/verify", verify)
    return app


def _finished_run(n: int = 2) -> Run:
    run = make_run(n)
    for t in range(n):
        finish(key(run, t), Rollout.Status.SUCCEEDED, 1.0)
    return run


def test_reverify_returns_the_task_page_then_links_the_new_run(signed_in):
    run = _finished_run()
    with BackgroundServer(_stateless_env()) as env:
        response = signed_in.post(reverse("run_reverify", args=[run.pk]), {"env_url": env.url})
        task = BackgroundTask.objects.get(kind="reverify")
        assert response["Location"] == reverse("task", args=[task.pk])
        assert not Run.objects.filter(reverified_from=run).exists()
        assert background.run(task.pk) == "done"
    new = Run.objects.get(reverified_from=run)
    html = signed_in.get(reverse("task", args=[task.pk])).content.decode()
    assert "Reverified 2 rollout(s)" in html and "2 reward(s) changed" in html
    assert f'href="{reverse("run", args=[new.pk])}#evaluation"' in html


def test_the_health_check_returns_the_task_page_then_links_the_run(signed_in):
    run = _finished_run()
    response = signed_in.post(reverse("run_health_check", args=[run.pk]))
    task = BackgroundTask.objects.get(kind="health_check")
    assert response["Location"] == reverse("task", args=[task.pk])
    assert RolloutHealth.objects.count() == 0
    assert background.run(task.pk) == "done"
    assert RolloutHealth.objects.filter(run=run).count() == 2
    html = signed_in.get(reverse("task", args=[task.pk])).content.decode()
    assert "Health checked: " in html and " unhealthy, " in html
    assert f'href="{reverse("run", args=[run.pk])}#evaluation"' in html
