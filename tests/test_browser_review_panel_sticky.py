"""The review panel stays in view while a long trajectory scrolls (a sticky third column on a wide
screen, with its own scroll), and on a narrow screen it sits above the trajectory, never over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import CHROMIUM
from .test_browser_trajectory import _page
from .test_view_rollout_detail import make_rollout, make_run, make_task, msg

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    pytest.mark.timeout(240),
]


def _long_rollout():
    run = make_run()
    items = [(i, msg(f"reply {i}: " + "a long line of text " * 30), {}) for i in range(80)]
    return make_rollout(run, make_task(run), calls=[{} for _ in range(80)], items=items)


def _box(page, selector):
    return page.eval_on_selector(
        selector, "e => { const r = e.getBoundingClientRect(); return [r.top, r.bottom, r.left, r.right]; }"
    )


def test_the_review_panel_stays_in_view_after_scrolling_a_long_trajectory(
    browser, live_server, transactional_db, django_user_model
):  # noqa: F811
    rollout = _long_rollout()
    page = _page(browser, live_server, django_user_model, width=1600, height=900)
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/")
    assert page.evaluate("document.documentElement.scrollHeight") > 5 * 900  # a long page
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight * 0.8)")
    page.wait_for_function("window.scrollY > 3000")
    top, bottom, left, _right = _box(page, "#review-panel")
    assert 0 <= top < 900 and 0 < bottom <= 900  # wholly in view, its own scroll if taller
    assert page.is_visible("#review-panel")
    # beside the trajectory, not over it
    _t, _b, _l, timeline_right = _box(page, "#timeline")
    assert left >= timeline_right
    assert not page.errors, page.errors


def test_on_a_narrow_screen_the_panel_sits_above_the_trajectory(
    browser, live_server, transactional_db, django_user_model
):  # noqa: F811
    rollout = _long_rollout()
    page = _page(browser, live_server, django_user_model, width=760, height=900)
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/")
    _top, panel_bottom, _l, _r = _box(page, "#review-panel")
    timeline_top = _box(page, "#timeline")[0]
    assert panel_bottom <= timeline_top
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight * 0.8)")
    page.wait_for_function("window.scrollY > 3000")
    assert _box(page, "#review-panel")[1] < 0  # scrolled away with the page: it never covers the items


def test_a_note_added_from_an_item_shows_on_that_item(browser, live_server, transactional_db, django_user_model):  # noqa: F811
    rollout = _long_rollout()
    page = _page(browser, live_server, django_user_model, width=1600, height=900)
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/")
    page.click(".item-note-add[data-item='40']")
    page.fill(".item-note-form textarea", "the agent <b>repeats</b> itself here")
    page.click(".item-note-form button[type=submit]")
    page.wait_for_selector(".item-notes[data-item='40']")
    assert "the agent <b>repeats</b> itself here" in page.inner_text(".item-notes[data-item='40']")
    assert page.locator(".item-notes").count() == 1
    assert not page.errors, page.errors
