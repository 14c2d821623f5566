"""The verdict panel in a real browser on NeMo Gym's longest real mini_swe_agent_2 trace: what the
env said (SWE-bench's ``resolved`` and the patch) is on the first screen, above a page many screens
long; a link from a field lands on its item; opening every tree keeps the page as wide as the
window; nothing breaks the Content-Security-Policy (violations are console errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout

from .conftest import CHROMIUM
from .test_browser_trajectory import _page, _screenshot

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


def test_the_verdict_is_on_the_first_screen_of_a_long_trace(
    browser, live_server, transactional_db, django_user_model, shared_data
):  # noqa: F811
    from playwright.sync_api import expect

    with (shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").open("rb") as fh:
        run = import_rollouts(fh, source="example_rollouts.jsonl").run
    rollout = max(Rollout.objects.filter(run=run), key=lambda r: r.num_items)
    data = json.loads(rollout.verify_json)
    instance = next(iter(data["metadata"]["eval_report"]))
    height = 900
    page = _page(browser, live_server, django_user_model, height=height)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")

    assert page.evaluate("document.documentElement.scrollHeight") > 5 * height  # a long page
    _screenshot(page, "verdict")
    panel = page.locator("#traj-verdict")
    expect(panel).to_be_visible()
    resolved = panel.locator("dt", has_text=f"metadata.eval_report.{instance}.resolved")
    expect(resolved).to_be_visible()
    box = resolved.bounding_box()
    assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= height  # on the first screen, unscrolled
    value = "true" if data["metadata"]["eval_report"][instance]["resolved"] else "false"
    assert resolved.locator("xpath=following-sibling::dd").inner_text().startswith(value)
    patch = panel.locator('[data-field="metadata.model_patch"]')
    if data["metadata"]["model_patch"]:
        expect(patch.locator("pre.diff")).to_be_visible()
        assert patch.bounding_box()["y"] < height  # the patch starts on the first screen too

    # Opening every tree keeps the page as wide as the window (long values scroll inside the panel).
    for tree in panel.locator("details.verdict-tree").all():
        tree.evaluate("d => d.open = true")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    # A field that names an item links to it: the item comes into view.
    refs = panel.locator("a.verdict-ref")
    if refs.count():
        target = refs.first.get_attribute("href")
        refs.first.click()
        expect(page.locator(target)).to_be_in_viewport()
    assert page.errors == [], page.errors
