"""The trajectory page in a real browser, on NeMo Gym's real mini_swe_agent_2 trace
(task 0: 10 steps, 55 items): the outline jumps to a step and follows the step being read, n/p
move between steps, collapse all / expand all fold every item, the search box finds text in
folded items (they open) and moves between hits; a running rollout's page grows live against the
example agent (with latency), and the run page refreshes its charts when the run finishes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.collection.importer import import_rollouts
from rollouts.models import AgentCall, Rollout, Run

from .conftest import CHROMIUM

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(300),
]

PASSWORD = "correct horse battery"


def _page(browser, live_server, django_user_model, width=1360, height=1000):  # noqa: F811
    django_user_model.objects.create_user(username="tess", password=PASSWORD)
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(20_000)
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("console", lambda msg: page.errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "tess")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


def _mini_swe(shared_data) -> Rollout:
    with (shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").open("rb") as fh:
        run = import_rollouts(fh, source="example_rollouts.jsonl").run
    return Rollout.objects.get(run=run, task_index=0)


def _current(page) -> str:
    return page.get_attribute(".outline-row.current", "data-target")


def _screenshot(page, name: str) -> None:
    """With GYMWEB_SCREENSHOTS=<dir> (scripts/screenshots.py), keep this page as <dir>/<name>.png."""
    if os.environ.get("GYMWEB_SCREENSHOTS"):
        page.screenshot(path=str(Path(os.environ["GYMWEB_SCREENSHOTS"]) / f"{name}.png"))


def test_outline_folding_keys_and_search_on_a_real_trace(
    browser, live_server, transactional_db, django_user_model, shared_data
):  # noqa: F811
    from playwright.sync_api import expect

    rollout = _mini_swe(shared_data)
    page = _page(browser, live_server, django_user_model)
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/")
    steps = AgentCall.objects.filter(rollout=rollout).count()
    assert steps == 10

    # The outline lists the task input and every step, with its tools; imported: latency unknown.
    rows = page.locator(".outline-row")
    expect(rows).to_have_count(1 + steps)
    assert "bash" in rows.nth(1).inner_text()
    assert "latency unknown" in page.inner_text("#outline-body")
    assert _current(page) == "step-input"
    _screenshot(page, "trajectory")

    # Clicking a row jumps to its step; the step reaches the top and its row is highlighted.
    page.click('.outline-row[data-target="step-6"]')
    expect(page.locator('.outline-row[data-target="step-6"]')).to_have_class(re.compile(r"\bcurrent\b"))
    top = page.locator("#step-6").bounding_box()["y"]
    assert 0 <= top < 120
    assert page.url.endswith("#step-6")

    # Scrolling by hand moves the highlight (IntersectionObserver).
    page.locator("#step-2").scroll_into_view_if_needed()
    page.evaluate("document.getElementById('step-2').scrollIntoView({block: 'start'})")
    expect(page.locator('.outline-row[data-target="step-2"]')).to_have_class(re.compile(r"\bcurrent\b"))

    # n / p: next and previous step.
    page.locator("body").press("n")
    expect(page.locator('.outline-row[data-target="step-3"]')).to_have_class(re.compile(r"\bcurrent\b"))
    page.locator("body").press("n")
    expect(page.locator('.outline-row[data-target="step-4"]')).to_have_class(re.compile(r"\bcurrent\b"))
    page.locator("body").press("p")
    expect(page.locator('.outline-row[data-target="step-3"]')).to_have_class(re.compile(r"\bcurrent\b"))

    # Collapse all folds every item to its one-line summary: the whole trace fits in three screens.
    full_height = page.evaluate("document.documentElement.scrollHeight")
    page.locator("body").press("c")
    folds = page.locator("#timeline details.fold")
    assert folds.count() == 55 + 2  # every item, and the two input messages
    expect(page.locator("#timeline details.fold[open]")).to_have_count(0)
    # (the verdict panel above the trace is not part of it)
    verdict = page.evaluate("document.getElementById('traj-verdict').getBoundingClientRect().height")
    folded_height = page.evaluate("document.documentElement.scrollHeight") - verdict
    assert folded_height < 3 * 1000 < full_height - verdict
    summary = page.locator("#step-0 details.fold summary").first.inner_text()
    assert "assistant" in summary and "chars" in summary
    # c again folds the steps too; e opens everything.
    page.locator("body").press("c")
    expect(page.locator("#timeline details.step[open]")).to_have_count(0)
    page.locator("body").press("e")
    expect(page.locator("#timeline details.fold:not([open])")).to_have_count(0)
    expect(page.locator("#timeline details.step:not([open])")).to_have_count(0)
    page.click("#collapse-all")
    expect(page.locator("#timeline details.fold[open]")).to_have_count(0)
    page.evaluate("window.scrollTo(0, 0)")
    _screenshot(page, "trajectory_folded")

    # "/" focuses the search; a hit inside folded items opens them; Enter / Shift-Enter move.
    page.locator("body").press("/")
    assert page.evaluate("document.activeElement.id") == "traj-q"
    page.keyboard.type("extra characters after command")
    page.keyboard.press("Enter")
    expect(page.locator("#traj-hits")).to_have_text("1 of 3")
    assert page.locator("#timeline details.fold[open]").count() == 3  # the three outputs holding a hit
    page.keyboard.press("Enter")
    expect(page.locator("#traj-hits")).to_have_text("2 of 3")
    page.keyboard.press("Shift+Enter")
    expect(page.locator("#traj-hits")).to_have_text("1 of 3")
    page.keyboard.press("Shift+Enter")
    expect(page.locator("#traj-hits")).to_have_text("3 of 3")
    assert "q=extra+characters+after+command" in page.url or "q=extra%20characters" in page.url
    # The text itself is untouched (highlights are ranges, never markup in the text).
    assert page.locator("#timeline").inner_text().count("extra characters after command") == 3

    # ?q= on arrival: the page opens with the hits highlighted and counted.
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/?q=CommandExecError")
    expect(page.locator("#traj-hits")).to_have_text(re.compile(r"^1 of \d+$"))
    assert page.input_value("#traj-q") == "CommandExecError"
    page.fill("#traj-q", "no such text anywhere xyzzy")
    expect(page.locator("#traj-hits")).to_have_text("no match")
    assert page.errors == []


def test_the_outline_folds_away_on_a_narrow_screen(
    browser, live_server, transactional_db, django_user_model, shared_data
):  # noqa: F811
    from playwright.sync_api import expect

    rollout = _mini_swe(shared_data)
    page = _page(browser, live_server, django_user_model, width=600, height=900)
    page.goto(f"{live_server.url}/runs/{rollout.run_id}/rollouts/{rollout.pk}/")
    expect(page.locator("#outline-box")).not_to_have_attribute("open", "")
    assert not page.locator('.outline-row[data-target="step-1"]').is_visible()
    page.click("#outline-box > summary")
    expect(page.locator('.outline-row[data-target="step-1"]')).to_be_visible()
    assert page.errors == []


@pytest.fixture
def slow_agent_url():
    """The example counter agent, sleeping 1.5 s on every call: a rollout runs long enough to watch."""
    from gymweb.examples._serve import BackgroundServer
    from gymweb.examples.counter_agent import make_app

    server = BackgroundServer(make_app(latency_ms=1500)).start()
    yield server.url
    server.stop()


def test_a_running_rollout_grows_live_and_the_run_page_refreshes_at_the_end(
    browser,
    live_server,
    workers,
    django_user_model,
    counter_env_url,
    slow_agent_url,
    counter_tasks_path,
    shared_data,  # noqa: F811
):
    from playwright.sync_api import expect

    with counter_tasks_path.open("rb") as fh:
        parsed = read_jsonl(fh)
    run = runs.create_run(
        parsed, name="slow", agent_url=slow_agent_url, env_url=counter_env_url, limit=2, concurrency=1
    )
    runs.launch(run)
    first = Rollout.objects.get(run=run, task_index=0)
    page = _page(browser, live_server, django_user_model)

    # The first rollout's page before any worker: nothing yet, a tail that polls.
    page.goto(f"{live_server.url}/runs/{run.pk}/rollouts/{first.pk}/")
    assert "No agent call yet" in page.inner_text("#timeline")
    assert page.get_attribute("#traj-tail", "hx-trigger") == "every 2s"
    page.evaluate("window.__gymwebMark = 'still here'")
    workers.start(workers=1)

    # Steps appear as they are stored (1.5 s apart), with timing: the outline draws them on one axis.
    expect(page.locator("#timeline details.step[data-step='0']")).to_have_count(1, timeout=60_000)
    expect(page.locator(".traj-summary .badge.succeeded")).to_have_count(1, timeout=60_000)
    assert page.evaluate("window.__gymwebMark") == "still here"  # no reload
    first.refresh_from_db()
    assert first.num_agent_calls == 3
    expect(page.locator("#timeline details.step[data-step]")).to_have_count(3)
    expect(page.locator("#count-calls")).to_have_text("3")
    expect(page.locator(".outline-row")).to_have_count(1 + 3)
    assert page.locator(".outline-row .wf-agent").count() == 3 and page.locator(".outline-row .wf-tools").count() == 2
    assert "increment_counter" in page.inner_text("#outline-body")
    expect(page.locator("#traj-end .traj-verify")).to_have_count(1)  # the verify panel came with the end
    expect(page.locator("#traj-tail")).not_to_have_attribute("hx-trigger", "every 2s")  # polling stopped
    assert page.errors == []

    # The run page, watched while the second rollout runs: the running row shows its agent calls,
    # and when the run ends every chart and count says the final numbers.
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.evaluate("window.__gymwebMark = 'still here'")
    expect(page.locator("#run-status")).to_have_text("completed", timeout=90_000)
    total_calls = AgentCall.objects.filter(rollout__run=run).count()
    assert total_calls == 6
    expect(page.locator("#run-charts")).to_contain_text(f"{total_calls} calls of finished attempts")
    expect(page.locator("#evaluation")).not_to_contain_text("Available when the run is finished")
    expect(page.locator("#rollout-table .badge.succeeded")).to_have_count(2)
    assert page.evaluate("window.__gymwebMark") == "still here"
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    assert page.errors == []
    # The runs list beside two imported runs, one with a long name: it wraps in its own column,
    # cut with the whole name as its title; the URL columns never wrap.
    _mini_swe(shared_data)
    long_name = "/mnt/checkpoints/nemo_gym/eval_0.7.0/tau2/airline/rollouts.jsonl + /mnt/checkpoints/nemo_gym/eval_0.7.0/tau2/airline/rollouts_failures.jsonl"
    with (shared_data / "tau2" / "example_rollouts.jsonl").open("rb") as fh:
        import_rollouts(fh, name=long_name)
    page.goto(f"{live_server.url}/")
    expect(page.locator("table.runs")).to_contain_text("slow")
    assert page.get_attribute(f'td.run-name a[title="{long_name}"]', "title") == long_name
    url_cell = page.locator("td.url .mono").first.bounding_box()
    assert url_cell["height"] < 24  # one line
    _screenshot(page, "runs_list")
