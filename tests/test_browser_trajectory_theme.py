"""The trajectory page's dark theme (it follows the system's prefers-color-scheme) and its copy
buttons (the raw text of an item or an argument, not its HTML), in a real browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_view_rollout_detail import call, make_rollout, make_run, make_task, msg, out

from .conftest import CHROMIUM
from .test_browser_trajectory import PASSWORD

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]

COMMAND = "grep -n '<b>x</b>' a.py | head -3"


def _rollout():
    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, msg("Run this:\n```python\nimport os\nprint(os.getcwd())\n```"), {}),
            (0, call("c1", "bash", json.dumps({"command": COMMAND})), {}),
            (0, out("c1", "<returncode>0</returncode>\nline 1"), {}),
        ],
    )
    return run, rollout


def _login(browser, live_server, django_user_model, **context):
    django_user_model.objects.create_user(username="tess", password=PASSWORD)
    page = browser.new_context(viewport={"width": 1300, "height": 900}, **context).new_page()
    page.set_default_timeout(20_000)
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "tess")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


def _colours(page) -> dict:
    return page.evaluate(
        """() => {
          const s = (el, p) => getComputedStyle(el)[p];
          const pre = document.querySelector("pre.code.hl");
          return {
            body: s(document.body, "backgroundColor"), fg: s(document.body, "color"),
            pre: s(pre, "backgroundColor"), keyword: s(pre.querySelector(".hl-kn, .hl-k"), "color"),
          };
        }"""
    )


def test_the_dark_theme_follows_prefers_color_scheme(browser, live_server, transactional_db, django_user_model):
    run, rollout = _rollout()
    url = f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/"
    page = _login(browser, live_server, django_user_model, color_scheme="dark")
    page.goto(url)
    dark = _colours(page)
    assert dark["body"] == "rgb(15, 20, 27)" and dark["fg"] == "rgb(229, 231, 235)"
    assert dark["pre"] == "rgb(30, 38, 49)"
    page.emulate_media(color_scheme="light")
    light = _colours(page)
    assert light["body"] == "rgb(247, 247, 249)" and light["pre"] == "rgb(243, 244, 246)"
    assert light["keyword"] != dark["keyword"]  # the token colours change with it
    assert page.errors == [], page.errors


def test_copy_buttons_copy_the_raw_text_of_an_argument_and_of_an_item(
    browser, live_server, transactional_db, django_user_model
):
    from playwright.sync_api import expect

    run, rollout = _rollout()
    page = _login(browser, live_server, django_user_model, permissions=["clipboard-read", "clipboard-write"])
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    argument = page.locator("#item-1 dd.f-v")
    argument.hover()
    argument.locator("button.copy-btn").click()
    expect(argument.locator("button.copy-btn")).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == COMMAND  # text, not the highlighted HTML
    item_button = page.locator("#item-1 .item-tools button.copy-item")
    item_button.click()
    expect(item_button).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == json.dumps({"command": COMMAND})
    code = page.locator("#item-0 .md > .copy-wrap > button.copy-btn")
    expect(code).to_have_count(1)  # the fenced block has its own
    page.locator("#item-0 .md > .copy-wrap").hover()
    code.click()
    expect(code).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == "import os\nprint(os.getcwd())\n"
    assert page.locator("button.copy-item").count() == 4  # every item: the task input and the three
    assert page.errors == [], page.errors


def test_boxes_in_a_calls_arguments_are_drawn_over_the_image_before_it(
    browser, live_server, transactional_db, django_user_model
):
    from playwright.sync_api import expect

    from tests.test_view_images import png, user_with_images

    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, user_with_images(png(400, 300)), {}),
            (0, call("c1", "crop", json.dumps({"bbox": [0.5, 0.5, 1.0, 1.0]})), {}),
        ],
    )
    page = _login(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    rect = page.locator(".bbox-wrap svg.bbox-svg rect.bbox-rect")
    expect(rect).to_have_count(1)
    assert rect.get_attribute("x") == "200" and rect.get_attribute("width") == "200"  # normalised: half of 400
    img = page.locator("img.part-img").bounding_box()
    box = rect.bounding_box()
    assert img is not None and box is not None
    assert abs(box["x"] - (img["x"] + img["width"] / 2)) < 4  # on the image's right half, as drawn
    assert abs(box["y"] + box["height"] - (img["y"] + img["height"])) < 4
    assert page.errors == [], page.errors
