"""Content rendering on the trajectory page in a real browser, on NeMo Gym's real tau2
and mini_swe_agent_2 traces: "show all N characters" loads the rest of a long text into the page
without a reload, the plain-text toggle swaps in place and back, thinking is folded until opened,
and nothing breaks the Content-Security-Policy (violations are console errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout, TrajectoryItem

from .conftest import CHROMIUM
from .test_browser_trajectory import _page

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]


def _import(shared_data, name):
    with (shared_data / name / "example_rollouts.jsonl").open("rb") as fh:
        return import_rollouts(fh, source="example_rollouts.jsonl").run


def test_show_all_loads_a_long_system_prompt_in_place(
    browser, live_server, transactional_db, django_user_model, shared_data
):  # noqa: F811
    from playwright.sync_api import expect

    run = _import(shared_data, "tau2")
    rollout = next(
        r
        for r in Rollout.objects.filter(run=run).order_by("task_index")
        if len(json.loads(r.task.row_json)["responses_create_params"]["input"][0]["content"]) == 23_675
    )
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    page.evaluate("window.__notReloaded = true")
    body = page.locator("#body-input-0")
    link = body.locator("a.show-all")
    expect(link).to_have_text("show all 23,675 characters")
    before = len(body.inner_text())
    link.click()
    expect(page.locator("#body-input-0 a.show-all")).to_have_count(0)
    expect(page.locator("#body-input-0 .elided")).to_have_count(0)  # no "… N more characters" left
    after = len(page.locator("#body-input-0").inner_text())
    assert after > before + 3_000
    assert page.evaluate("window.__notReloaded") is True  # the same page: loaded in place
    # the plain-text toggle swaps in place too, and back
    page.locator("#body-input-0 a.view-toggle").click()
    expect(page.locator("#body-input-0 pre.plain")).to_have_count(1)
    expect(page.locator("#body-input-0 .md")).to_have_count(0)
    page.locator("#body-input-0 a.view-toggle").click()
    expect(page.locator("#body-input-0 .md")).not_to_have_count(0)
    assert page.evaluate("window.__notReloaded") is True
    assert page.errors == [], page.errors


def test_thinking_is_folded_commands_are_code_and_the_patch_is_a_diff(
    browser, live_server, transactional_db, django_user_model, shared_data
):  # noqa: F811
    from playwright.sync_api import expect

    run = _import(shared_data, "mini_swe_agent_2")
    rollout = Rollout.objects.get(run=run, task_index=0)
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{rollout.pk}/")
    message = TrajectoryItem.objects.filter(rollout=rollout, kind="message").order_by("seq").first()
    think = page.locator(f"#body-{message.seq} details.think").first
    expect(think).not_to_have_attribute("open", "")
    text = think.locator("pre.think-text")
    expect(text).to_be_hidden()  # folded: thinking takes no room until opened
    think.locator("summary").click()
    expect(text).to_be_visible()
    call = TrajectoryItem.objects.filter(rollout=rollout, kind="function_call").order_by("seq").first()
    command = json.loads(call.payload["arguments"])["command"]
    expect(page.locator(f"#body-{call.seq} pre.code")).to_have_text(command)  # as typed, no JSON escapes
    page.locator("details.traj-others > summary").click()
    expect(page.locator("#verify pre.diff .d-a").first).to_be_visible()
    assert page.errors == [], page.errors
