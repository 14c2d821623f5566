"""Content-Security-Policy (django-csp): every page carries a policy that allows only
this origin's scripts and styles, and no page needs more (no inline script, style or handler).
The browser test (test_browser_production) checks that no violation is reported with htmx live."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run


def _policy(response) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    return {part.split()[0]: " ".join(part.split()[1:]) for part in header.split(";") if part.strip()}


def _inline_code(html: str) -> list[str]:
    """Everything in ``html`` that a policy without 'unsafe-inline' blocks."""
    found = re.findall(r"<[^>]*\sstyle=[^>]*>", html)
    found += re.findall(r"<style\b[^>]*>", html)
    found += [s for s in re.findall(r"<script\b[^>]*>", html) if "src=" not in s and "application/json" not in s]
    found += re.findall(r"<[^>]*\son[a-z]+=[^>]*>", html)
    found += re.findall(r"javascript:", html)
    return found


@pytest.fixture
def pages(signed_in, db):
    run = make_run(3, status=Run.Status.RUNNING)
    finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    finish(key(run, 1), Rollout.Status.FAILED)
    done = make_run(2, status=Run.Status.COMPLETED, name="done")
    finish(key(done, 0), Rollout.Status.SUCCEEDED, 0.5)
    rollout = key(run, 0)
    return [
        reverse("runs"),
        reverse("run", args=[run.pk]),
        reverse("run_live", args=[run.pk]),
        reverse("run_charts", args=[run.pk]),
        reverse("rollout", args=[run.pk, rollout.pk]),
        reverse("run_new"),
        reverse("import"),
        reverse("check_agent"),
        reverse("compare") + f"?a={run.pk}&b={done.pk}",
        reverse("run_profile", args=[done.pk]),
        reverse("run_evaluation", args=[done.pk]),
        # review: review mode on a trajectory, its summary, labels, account, a prefilled new run
        reverse("rollout", args=[run.pk, rollout.pk]) + "?review=1",
        reverse("review_start", args=[run.pk]) + "?summary=1",
        reverse("labels"),
        reverse("account"),
        # an item's whole body, as the "show all" link's page
        reverse("rollout_item", args=[run.pk, rollout.pk, "input-0"]) + "?full=1",
    ]


def test_every_page_carries_a_strict_policy_and_needs_no_inline_code(signed_in, pages, manifest_static):
    # (With the production storage: every static file a page names is in collectstatic's manifest.)
    assert len(pages) >= 10
    full_pages = 0
    for url in pages:
        response = signed_in.get(url)
        assert response.status_code == 200, url
        policy = _policy(response)
        assert (
            policy["default-src"] == "'self'" and policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
        ), url
        assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'", url
        assert "unsafe" not in response["Content-Security-Policy"]
        assert _inline_code(response.content.decode()) == [], url
        # htmx must not add its indicator <style> (it reads this config before it starts).
        if "<head>" in response.content.decode():
            assert '"includeIndicatorStyles": false' in response.content.decode()
            full_pages += 1
    assert full_pages >= 5  # the htmx configuration was checked on whole pages, not only on fragments


def test_pages_for_visitors_and_errors_carry_the_policy_too(db, settings):
    visitor = Client()
    for response in (
        visitor.get(reverse("login")),
        visitor.get("/no-such-page/"),
        Client(enforce_csrf_checks=True).post(reverse("login"), {}),
    ):
        assert "script-src 'self'" in response["Content-Security-Policy"]
        assert _inline_code(response.content.decode()) == []


def test_progress_bars_are_drawn_without_style_attributes(signed_in, db):
    run = make_run(4, status=Run.Status.RUNNING)
    finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    finish(key(run, 1), Rollout.Status.FAILED)
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    # 1 of 4 keys succeeded, 1 failed: each a quarter of the bar.
    assert '<rect class="ok-bar" width="25.00" height="1">' in html
    assert '<rect class="bad-bar" x="25.00" width="25.00" height="1">' in html
    listing = signed_in.get(reverse("runs")).content.decode()
    assert '<rect class="ok-bar" width="25.00"' in listing
