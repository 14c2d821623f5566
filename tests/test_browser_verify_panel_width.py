"""The verify panel at the bottom of the rollout page in a real browser, on every real trace with
wide verify fields: opening every field keeps the page as wide as the window (wide values scroll
inside the panel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout

from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


@pytest.mark.parametrize("folder", ["mini_swe_agent_2", "tau2", "example_multi_step"])
def test_opening_wide_verify_fields_keeps_the_page_as_wide_as_the_window(
    browser, live_server, transactional_db, django_user_model, shared_data, folder
):
    with (shared_data / folder / "example_rollouts.jsonl").open("rb") as fh:
        run = import_rollouts(fh, source="example_rollouts.jsonl").run
    rollout = Rollout.objects.filter(run=run).order_by("id").first()
    page = _page(browser, live_server, django_user_model, width=720, height=900)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    opened = page.evaluate(
        "() => { const ds = document.querySelectorAll('#verify details'); ds.forEach(d => d.open = true);"
        " return ds.length; }"
    )
    assert opened >= 1
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
