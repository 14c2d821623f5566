"""A reply of 120 items (reasoning interleaved with calls) in a real browser: it reads as one
line per call in folded sub-groups, and "Expand all" opens every group and every reasoning."""

from __future__ import annotations

import json
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


def test_expand_all_opens_the_sub_groups_and_the_reasoning(browser, live_server, transactional_db, django_user_model):
    from playwright.sync_api import expect

    output = []
    for k in range(60):
        output.append(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": f"I should look at part {k}"}]}
        )
        output.append(
            {"type": "function_call", "name": "search", "call_id": f"c{k}", "arguments": json.dumps({"query": f"q{k}"})}
        )
    row = {"responses_create_params": {"input": "find it"}, "response": {"output": output}, "reward": 0.0}
    rollout = Rollout.objects.get(run=import_rollouts([json.dumps(row)]).run)
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/")
    groups = page.locator("#timeline details.substep")
    expect(groups).to_have_count(60)
    expect(page.locator("#timeline details.substep[open]")).to_have_count(0)  # one line per call
    assert page.locator("#timeline summary.substep-sum").nth(7).inner_text().startswith("search")
    assert "search: q7" in page.locator("#timeline summary.substep-sum").nth(7).inner_text()
    page.click("#expand-all")
    expect(page.locator("#timeline details.substep:not([open])")).to_have_count(0)
    expect(page.locator("#timeline details.reasoning")).to_have_count(60)
    expect(page.locator("#timeline details.reasoning:not([open])")).to_have_count(0)
    assert page.locator("#body-118 pre.think-text").is_visible()
    # the search finds a reasoning text inside a folded group and opens it
    page.click("#collapse-all")
    page.click("#collapse-all")
    page.fill("#traj-q", "part 42")
    expect(page.locator("#traj-hits")).to_have_text("1 of 1")
    expect(page.locator("#timeline details.substep[open]")).to_have_count(1)
    assert page.errors == [], page.errors
