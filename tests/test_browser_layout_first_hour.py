"""The layout a newcomer tripped on, measured in a real browser: the sign-in form's fields line up
(same left edge and width), the import page is as wide as the other pages, and a long run name in the
runs list wraps between its parts, never mid-word, while the progress column stays narrow."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import CHROMIUM
from .run_factories import make_run
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.slow,
    pytest.mark.timeout(240),
]


def test_the_sign_in_fields_line_up(browser, live_server, transactional_db):
    page = browser.new_context(viewport={"width": 1360, "height": 900}).new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    user = page.locator("input[name=username]").bounding_box()
    password = page.locator("input[name=password]").bounding_box()
    assert abs(user["x"] - password["x"]) < 1 and abs(user["width"] - password["width"]) < 1


def test_the_import_page_is_as_wide_as_the_runs_list(browser, live_server, transactional_db, django_user_model):
    page = _page(browser, live_server, django_user_model)
    main = page.locator("main").bounding_box()
    page.goto(f"{live_server.url}/import/")
    card = page.locator("section.import-card").bounding_box()
    assert card["width"] > 0.9 * main["width"]


def test_a_long_run_name_wraps_between_its_parts_not_mid_word(
    browser, live_server, transactional_db, django_user_model
):
    make_run(2, name="counter_tasks.jsonl / only_the_first_two_tasks_with_a_long_descriptive_suffix.jsonl")
    page = _page(browser, live_server, django_user_model, width=1100)
    cell = page.locator("td.run-name").first
    lines = cell.evaluate(
        """td => {
            const range = document.createRange(), text = td.querySelector('a') || td;
            const walker = document.createTreeWalker(text, NodeFilter.SHOW_TEXT);
            const tops = [];
            let node;
            while ((node = walker.nextNode())) {
                for (let i = 0; i < node.length; i++) {
                    range.setStart(node, i); range.setEnd(node, i + 1);
                    const r = range.getClientRects()[0];
                    if (r) tops.push([node.data[i], Math.round(r.top)]);
                }
            }
            return tops;
        }"""
    )
    # Each line break falls after a separator or a space, never inside a word.
    for (before, top_before), (_after, top_after) in zip(lines, lines[1:]):
        if top_after > top_before:
            assert before in " /_.-", (before, lines)
    progress = page.locator("table.runs td.progress-cell").first
    assert progress.bounding_box()["width"] < cell.bounding_box()["width"]
