"""Images the agent saw, in a real browser: an inline PNG is drawn (decoded, sized to fit) and grows
on click; a remote image URL is never requested unless the user opens the link; nothing breaks the
Content-Security-Policy (violations are console errors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts.models import TrajectoryItem
from tests.test_view_images import png, user_with_images
from tests.test_view_rollout_detail import make_rollout, make_run, make_task, msg

from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


def test_an_inline_image_is_drawn_and_a_remote_one_is_never_requested(
    browser, live_server, transactional_db, django_user_model
):  # noqa: F811
    from playwright.sync_api import expect

    remote = f"{live_server.url}/static/tracking.png?who=alice"  # this test's own server: any request to it would show
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), calls=[{}], items=[(0, user_with_images(png(600, 400), remote), {}), (0, msg("Red."), {})]
    )
    assert TrajectoryItem.objects.filter(rollout=rollout).count() == 2
    page = _page(browser, live_server, django_user_model, width=1200, height=900)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")

    img = page.locator("img.part-img")
    expect(img).to_have_count(1)
    expect(img).to_be_visible()
    assert img.evaluate("i => i.complete && i.naturalWidth") == 600  # decoded: the policy let it load
    small = img.bounding_box()
    assert small["height"] <= 320 and small["width"] < 600  # sized to fit
    img.click()
    expect(img).to_have_class("part-img enlarged")
    assert img.bounding_box()["width"] >= 600 > small["width"]  # full size on click (plus its border)
    img.click()
    expect(img).to_have_class("part-img")

    link = page.locator(".part-image-remote a")
    expect(link).to_have_attribute("href", remote)
    page.wait_for_load_state("networkidle")
    assert not any("tracking.png" in url for url in requested), requested
    assert page.errors == [], page.errors
