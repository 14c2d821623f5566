"""In a real browser, without a reload: the demo's run (its tasks, its agent's latency, the three that
fail on purpose) is seen happening: rollouts finish one after another on the run page while it reads
"running", a rollout's steps appear on its page while it runs, and the run ends "completed with
failures"; a run whose every rollout failed terminally ends "all failed" and offers no retry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.management.commands.demo import DEFAULT_AGENT_LATENCY_MS, DEMO_TASKS
from rollouts.models import Rollout

from .bad_agents import serve
from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.slow,
    pytest.mark.timeout(480),
]


@pytest.fixture
def demo_agent_url():
    """The example counter agent at the demo's latency (500-1500 ms per call)."""
    from gymweb.examples._serve import BackgroundServer
    from gymweb.examples.counter_agent import make_app, parse_latency_ms

    server = BackgroundServer(make_app(latency_ms=parse_latency_ms(DEFAULT_AGENT_LATENCY_MS))).start()
    yield server.url
    server.stop()


def _run(name, agent_url, env_url, path, **options):
    with path.open("rb") as fh:
        parsed = read_jsonl(fh, source=str(path))
    run = runs.create_run(parsed, name=name, agent_url=agent_url, env_url=env_url, **options)
    runs.launch(run)
    return run


def test_the_demo_run_is_seen_happening_and_ends_with_its_failures_named(
    browser, live_server, workers, django_user_model, counter_env_url, demo_agent_url
):
    from playwright.sync_api import expect

    # The demo's tasks and agent; two at a time so the run lasts several rounds of calls.
    run = _run("demo", demo_agent_url, counter_env_url, DEMO_TASKS, max_steps=8, concurrency=2)
    total = Rollout.objects.filter(run=run).count()
    # Task 4 succeeds in several calls and starts in the third round of two: there is time to open it.
    last = Rollout.objects.get(run=run, task_index=4)
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    rollout_page = page.context.new_page()
    rollout_page.set_default_timeout(20_000)
    rollout_page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{last.pk}/")
    for p in (page, rollout_page):
        p.evaluate("window.__gymwebMark = 'still here'")
    workers.start(workers=1)

    # Rollouts finish while the run still reads "running": the page follows it.
    expect(page.locator("tr.status-succeeded").first).to_be_visible(timeout=90_000)
    assert page.inner_text("#run-status").strip() == "running"
    assert f"/ {total} done" in page.inner_text("#run-live")

    # The last task's page: its steps appear while it runs, then it ends with its verdict.
    expect(rollout_page.locator(".traj-summary .badge.running")).to_be_visible(timeout=180_000)
    expect(rollout_page.locator("#count-calls")).not_to_have_text("0", timeout=60_000)
    status = rollout_page.locator(".traj-summary .traj-status .badge").first
    expect(status).to_have_class(re.compile(r"\bsucceeded\b"), timeout=120_000)
    expect(rollout_page.locator("#traj-reward")).to_be_visible()

    # The end: named for what happened, still the same document.
    expect(page.locator("#run-status")).to_have_text("completed with failures", timeout=120_000)
    expect(page.locator("tr.status-failed").first).to_be_visible()
    expect(page.locator("tr.status-failed").first).to_contain_text("not verified")
    for p in (page, rollout_page):
        assert p.evaluate("window.__gymwebMark") == "still here"  # no reload
    assert page.errors == []


def test_a_run_whose_every_rollout_failed_terminally_ends_all_failed_with_nothing_to_retry(
    browser, live_server, workers, django_user_model, counter_env_url, counter_tasks_path
):
    from playwright.sync_api import expect

    with serve("missing_fields") as agent:  # an invalid Responses object: a terminal failure
        run = _run("broken agent", agent.url, counter_env_url, counter_tasks_path, limit=3)
        page = _page(browser, live_server, django_user_model)
        page.goto(f"{live_server.url}/runs/{run.pk}/")
        page.evaluate("window.__gymwebMark = 'still here'")
        workers.start(workers=1)
        expect(page.locator("#run-status")).to_have_text("all failed", timeout=90_000)

    assert set(Rollout.objects.filter(run=run).values_list("terminal", flat=True)) == {True}
    assert page.evaluate("window.__gymwebMark") == "still here"
    expect(page.locator("#run-status")).to_have_attribute("title", re.compile("every finished rollout failed"))
    # Nothing can be retried, so nothing offers it, live or after a reload.
    expect(page.locator("#retry-run")).to_have_count(0)
    page.reload()
    expect(page.locator("#run-status")).to_have_text("all failed")
    expect(page.locator("#retry-run")).to_have_count(0)
    expect(page.locator("tr.status-failed")).to_have_count(3)
    assert page.errors == []
