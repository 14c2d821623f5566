"""A watched rollout's page, in a real browser, stays current to the end without a reload: while
it runs the header counts the tokens its stored calls reported; when it ends the review panel
shows the env's reward and offers "correct the reward…", and a correction saves in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout

from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


@pytest.fixture
def slow_agent_url():
    """The example counter agent, 1.2 s per call: the rollout runs long enough to watch."""
    from gymweb.examples._serve import BackgroundServer
    from gymweb.examples.counter_agent import make_app

    server = BackgroundServer(make_app(latency_ms=1200)).start()
    yield server.url
    server.stop()


def test_a_watched_rollout_ends_with_its_reward_and_the_correction_form_without_a_reload(
    browser, live_server, workers, django_user_model, counter_env_url, slow_agent_url, counter_tasks_path
):
    from playwright.sync_api import expect

    with counter_tasks_path.open("rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(parsed, name="watched", agent_url=slow_agent_url, env_url=counter_env_url, limit=1)
    runs.launch(run)
    rollout = Rollout.objects.get(run=run, task_index=0)
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    expect(page.locator("#review-panel")).to_contain_text("no env reward")
    page.evaluate("window.__gymwebMark = 'still here'")
    workers.start(workers=1)

    # Step 1 stored, the attempt still running: the header counts its tokens.
    expect(page.locator("#count-tokens")).to_be_visible(timeout=60_000)
    assert Rollout.objects.get(pk=rollout.pk).status in ("running", "succeeded")

    # The end: the reward and the correction form arrive without a reload.
    expect(page.locator(".traj-summary .badge.succeeded")).to_have_count(1, timeout=60_000)
    expect(page.locator("#env-reward")).to_have_text("1.0")
    expect(page.locator("#review-panel")).not_to_contain_text("no env reward")
    page.click("#review-panel .correct-box > summary")
    page.fill("#review-panel .correction-form input[name=reward]", "0.5")
    page.fill("#review-panel .correction-form input[name=reason]", "counted twice")
    page.click("#review-panel .correction-form button[type=submit]")
    expect(page.locator("#corrected-reward")).to_have_text("0.5")
    assert page.evaluate("window.__gymwebMark") == "still here"  # no reload
    assert page.errors == []
