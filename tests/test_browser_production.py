"""The dashboard under gunicorn with DEBUG off, in a real browser: styles and htmx are
live, no page reports a Content-Security-Policy violation, Cancel asks first, and a session that
ends while the run page polls sends the window to sign in and back to the run page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollouts.models import Run

from .conftest import CHROMIUM
from .run_factories import make_run

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(240),
]

# Every violation, whether the browser logs it or a page listener sees it, reaches the console.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", function (e) {
  console.error("CSP violation: " + e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


def _csp_errors(messages: list[str]) -> list[str]:
    return [m for m in messages if "CSP violation" in m or "Content Security Policy" in m]


def _sign_in(page, base: str) -> None:
    page.fill("input[name=username]", "erin")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")


def test_the_dashboard_under_gunicorn_with_debug_off_is_styled_live_and_csp_clean(browser, gunicorn, django_user_model):  # noqa: F811
    from playwright.sync_api import expect

    django_user_model.objects.create_user(username="erin", password="correct horse battery")
    run = make_run(3, status=Run.Status.RUNNING, name="waiting run")  # pending keys, no worker: it polls
    base = gunicorn.start()

    context = browser.new_context(viewport={"width": 1360, "height": 1000})
    context.add_init_script(REPORT_VIOLATIONS)
    page = context.new_page()
    page.set_default_timeout(20_000)
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))

    page.goto(f"{base}/")
    page.wait_for_url(re.compile(r".*/accounts/login/\?next=/$"))
    _sign_in(page, base)
    page.wait_for_url(f"{base}/")

    # Styles: the stylesheet applied (the top bar is coloured, the progress bar is drawn).
    assert page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )
    assert page.evaluate("getComputedStyle(document.querySelector('.progress')).height") == "10px"
    # htmx: loaded, and the runs list refreshes itself (an htmx request, not a reload).
    assert page.evaluate("typeof window.htmx") == "object"
    with page.expect_request(
        lambda r: r.headers.get("hx-request") == "true" and r.url.startswith(f"{base}/"), timeout=15_000
    ):
        pass

    # The run page: the lazy charts load and the live part polls.
    page.click(f"a[href='/runs/{run.pk}/']")
    page.wait_for_url(f"{base}/runs/{run.pk}/")
    # (Locator waits, not wait_for_function: its polling evaluates a string, which the CSP forbids.)
    expect(page.locator("#run-charts")).not_to_contain_text("Loading…")
    with page.expect_request(lambda r: f"/runs/{run.pk}/live/" in r.url, timeout=15_000):
        pass
    assert page.inner_text("#run-status").strip() == "running"

    # Cancel asks first: dismissed, nothing happens; accepted, the run is cancelled.
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("#cancel-run")
    page.wait_for_timeout(500)
    assert asked and asked[0].startswith("Cancel this run?")
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel-run")
    expect(page.locator("#run-status")).to_have_text("cancelled")
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED

    assert _csp_errors(console) == [], console
    # The listener does report a violation (so the check above can fail).
    page.evaluate("document.body.insertAdjacentHTML('beforeend', '<div style=\"color: red\">x</div>')")
    page.wait_for_timeout(300)
    assert _csp_errors(console), console
    context.close()


def test_a_session_that_ends_while_the_run_page_polls_goes_to_sign_in_and_back(browser, gunicorn, django_user_model):  # noqa: F811
    django_user_model.objects.create_user(username="erin", password="correct horse battery")
    run = make_run(2, status=Run.Status.RUNNING, name="polled run")
    base = gunicorn.start()

    context = browser.new_context()
    context.add_init_script(REPORT_VIOLATIONS)
    page = context.new_page()
    page.set_default_timeout(20_000)
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.goto(f"{base}/runs/{run.pk}/?status=pending")
    _sign_in(page, base)
    page.wait_for_url(f"{base}/runs/{run.pk}/?status=pending")
    assert page.get_attribute("#run-live", "hx-trigger") == "every 2s"

    context.clear_cookies()  # signed out (the session expired, or a sign-out in another tab)
    # The next poll takes the whole window to the sign-in page (no sign-in page pasted into the
    # live area), with next = the page in the address bar.
    page.wait_for_url(re.compile(r".*/accounts/login/\?next=.*"), timeout=20_000)
    assert "next=/runs/%d/%%3Fstatus%%3Dpending" % run.pk in page.url
    assert page.locator("header.topbar").count() == 1
    _sign_in(page, base)
    page.wait_for_url(f"{base}/runs/{run.pk}/?status=pending")
    assert page.locator("header.topbar").count() == 1 and page.locator("#run-live").count() == 1
    assert page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )
    assert _csp_errors(console) == [], console
    context.close()
