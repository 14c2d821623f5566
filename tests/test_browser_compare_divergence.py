"""Side by side in a real browser, on NeMo Gym's mini_swe_agent_2 trace against a copy whose last
assistant message differs: "jump to the first divergence" brings the differing step into view."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from rollouts.collection.importer import import_rollouts

from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


def test_jump_to_the_first_divergence(browser, live_server, transactional_db, django_user_model, shared_data):
    from playwright.sync_api import expect

    row = json.loads((shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").read_text().splitlines()[0])
    a = import_rollouts(io.BytesIO((json.dumps(row) + "\n").encode()), source="a/rollouts.jsonl").run
    message = [o for o in row["response"]["output"] if o.get("type") == "message"][-1]
    message["content"][0]["text"] = "A different ending."
    b = import_rollouts(io.BytesIO((json.dumps(row) + "\n").encode()), source="b/rollouts.jsonl").run
    page = _page(browser, live_server, django_user_model, height=900)
    page.goto(f"{live_server.url}/compare/?a={a.pk}&b={b.pk}&task={row['_ng_task_index']}")

    target = page.locator("#first-divergence")
    expect(target).not_to_be_in_viewport()
    page.click("text=jump to the first divergence")
    expect(target).to_be_in_viewport()
    assert page.url.endswith("#first-divergence")
    expect(target.locator(".aligned-diffs pre.diff")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.errors == [], page.errors
