"""The run page's SFT export says, once its panel is opened, how many rollouts it would leave out
and why, and says it again when the reasoning option changes (htmx, no page reload)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts.collection.importer import import_rollouts

from .conftest import CHROMIUM
from .test_browser_trajectory import _page
from .test_sft_validity import mixed_file  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


def test_the_sft_panel_counts_the_rollouts_left_out(
    browser, live_server, transactional_db, django_user_model, mixed_file
):  # noqa: F811
    from playwright.sync_api import expect

    with mixed_file.open("rb") as fh:
        run = import_rollouts(fh, source="rollouts.jsonl").run
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.evaluate("window.__notReloaded = true")
    page.locator("#curated-export > summary").click()
    check = page.locator("#sft-check")
    expect(check).to_contain_text("5 rows to write; 3 rollouts left out: no assistant turn")
    with page.expect_response(
        lambda r: "/export/sft-check/" in r.url and "reasoning=drop" in r.url and r.status == 200
    ):
        page.select_option("#curated-sft select[name=reasoning]", "drop")
    expect(check).to_contain_text("3 rollouts left out: no assistant turn")
    assert page.evaluate("window.__notReloaded") is True
    assert page.errors == [], page.errors
