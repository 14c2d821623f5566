"""Find past the display cut in a real browser: a hit the cut hides (typed in the box, or arriving
as ``?q=`` from the run's search) loads that item's full body in place and is marked; a permalink
to an item lands below the sticky search bar."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_view_trajectory_find import NEEDLE, long_rollout

from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


def _current_hit(page) -> str:
    """The text of the current hit (the Highlight API's range, or the <mark>)."""
    return page.evaluate(
        """() => {
          if (CSS.highlights && CSS.highlights.get("traj-hit-current")) {
            for (const r of CSS.highlights.get("traj-hit-current")) return r.toString();
          }
          const m = document.querySelector("mark.traj-hit.current");
          return m ? m.textContent : "";
        }"""
    )


def test_a_search_hit_past_the_display_cut_opens_the_body_and_is_marked(
    browser, live_server, transactional_db, django_user_model, settings
):
    from playwright.sync_api import expect

    settings.GYMWEB_DISPLAY_MAX_CHARS = 20_000
    run, rollout = long_rollout()
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    expect(page.locator("#body-2 a.show-all")).to_have_count(1)  # cut
    page.fill("#traj-q", NEEDLE.lower())
    expect(page.locator("#traj-hits")).to_have_text("1 of 1")
    expect(page.locator("#body-2 a.show-all")).to_have_count(0)  # the full body is in place
    assert _current_hit(page).lower() == NEEDLE.lower()
    box = page.locator("#body-2").bounding_box()
    assert box is not None
    assert page.errors == [], page.errors

    # a run-wide search's link (?q=) lands on the match too
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/?q={NEEDLE}")
    expect(page.locator("#traj-hits")).to_have_text("1 of 1")
    assert _current_hit(page) == NEEDLE
    in_view = page.evaluate(
        """() => {
          const r = CSS.highlights.get("traj-hit-current").values().next().value.getBoundingClientRect();
          return r.top >= 0 && r.bottom <= window.innerHeight;
        }"""
    )
    assert in_view
    assert page.errors == [], page.errors


def test_a_permalink_to_an_item_lands_below_the_sticky_search_bar(
    browser, live_server, transactional_db, django_user_model
):
    run, rollout = long_rollout()
    page = _page(browser, live_server, django_user_model, height=500)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/#item-1")
    page.wait_for_timeout(300)
    bar = page.locator("#traj-tools").bounding_box()
    item = page.locator("#item-1").bounding_box()
    assert bar is not None and item is not None
    assert item["y"] >= bar["y"] + bar["height"] - 1  # not hidden under the bar
    assert item["y"] < 500


def test_a_hit_at_the_end_of_a_long_verify_patch_opens_the_verify_panel(
    browser, live_server, transactional_db, django_user_model, settings
):
    from playwright.sync_api import expect

    from tests.test_view_rollout_detail import make_rollout, make_run, make_task

    settings.GYMWEB_DISPLAY_MAX_CHARS = 1_000
    run = make_run()
    patch = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1,2001 @@\n" + "+line\n" * 2_000 + "+PatchTailWord\n"
    rollout = make_rollout(run, make_task(run), verify={"reward": 0.0, "metadata": {"model_patch": patch}})
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/?q=PatchTailWord")
    expect(page.locator("#traj-hits")).to_have_text(re.compile(r"^1 of \d+$"))
    assert _current_hit(page) == "PatchTailWord"
    assert page.errors == [], page.errors
