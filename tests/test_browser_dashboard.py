"""The dashboard in a real browser: sign in, start a run from the form, watch it complete live
(HTMX, no reload), open a rollout, download rollouts.jsonl. A real qcluster worker does the work."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from rollouts.models import Run

from .conftest import CHROMIUM

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(240),
]


def test_a_run_started_in_the_browser_completes_live_and_downloads(
    browser, live_server, workers, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path, tmp_path
):
    from playwright.sync_api import expect

    django_user_model.objects.create_user(username="erin", password="correct horse battery")
    context = browser.new_context(accept_downloads=True, viewport={"width": 1360, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(20_000)

    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "erin")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    page.click("text=New run")
    page.wait_for_url("**/runs/new/")
    page.set_input_files("input[name=dataset_file]", str(counter_tasks_path))
    page.fill("input[name=agent_url]", counter_agent_url)
    page.fill("input[name=env_url]", counter_env_url)
    page.click("button:has-text('Start run')")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run = Run.objects.get()
    assert page.url.endswith(f"/runs/{run.pk}/")

    # No worker yet: the page shows the run waiting. Mark this document (a reload would drop the
    # mark), then start a worker and watch the page follow without reloading.
    assert page.inner_text("#run-status").strip() == "running"
    assert "0 / 5 done" in page.inner_text("#run-live")
    assert page.get_attribute("#run-live", "hx-trigger") == "every 2s"
    page.evaluate("window.__gymwebMark = 'still here'")
    workers.start(workers=1)
    # (Locator waits, not wait_for_function: its polling evaluates a string, which the CSP forbids.)
    expect(page.locator("#run-status")).to_have_text("completed", timeout=90_000)
    assert page.evaluate("window.__gymwebMark") == "still here"
    assert "5 / 5 done" in page.inner_text("#run-live")
    assert page.inner_text("#reward-mean") == "1.0000"
    # The table refreshed itself when the rollouts finished.
    expect(page.locator("#rollout-table .badge.succeeded")).to_have_count(5)
    assert page.evaluate("window.__gymwebMark") == "still here"
    # Polling stopped: the final markup carries no trigger.
    assert page.get_attribute("#run-live", "hx-trigger") is None

    if os.environ.get("GYMWEB_SCREENSHOTS"):
        page.screenshot(path=str(Path(os.environ["GYMWEB_SCREENSHOTS"]) / "run_detail.png"), full_page=True)

    link = page.locator("a.rollout-link").first
    href = link.get_attribute("href")
    link.click()
    page.wait_for_url(re.compile(rf".*/runs/{run.pk}/rollouts/\d+/.*"))
    assert page.url.startswith(f"{live_server.url}{href.split('?')[0]}")
    page.go_back()
    page.wait_for_url(re.compile(rf".*/runs/{run.pk}/$"))

    page.click("summary:has-text('Download')")
    with page.expect_download() as info:
        page.click(f"a:has-text('run-{run.pk}_rollouts.jsonl') >> nth=0")
    download = info.value
    assert download.suggested_filename == f"run-{run.pk}_rollouts.jsonl"  # named after its run
    target = tmp_path / "rollouts.jsonl"
    download.save_as(str(target))
    rows = [json.loads(line) for line in target.read_text().splitlines() if line.strip()]
    assert len(rows) == 5 and all(r["reward"] == 1.0 for r in rows)
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2, 3, 4]
    context.close()
