"""The pages speak the user's words: no internal names or jargon ("key" for a rollout, "lease",
"dispatcher", "seed", gymweb's private field names) in the text or the tooltips of the run page,
a rollout page, the profile, compare and import pages."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from django.urls import reverse

from rollouts.models import Rollout

from .run_factories import finish, key, make_run

S = Rollout.Status
pytestmark = pytest.mark.django_db

JARGON = re.compile(r"\b(keys?|lease[sd]?|dispatcher|seed(?:ed|s)?|_gymweb_failure_kind)\b", re.IGNORECASE)
# Keyboard keys are keys (review mode's help names them), and a bootstrap's random seed is one.
KEYBOARD = re.compile(r"\bkeys? (?:1|j/k|<kbd>)|\brandom seed\b", re.IGNORECASE)


def _words(page: str) -> list[str]:
    """The page's visible text and tooltips, without scripts, styles and attribute values other than titles."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    titles = re.findall(r'\btitle="([^"]*)"', page)
    text = re.sub(r"<[^>]+>", "\n", page)
    return [html_lib.unescape(t) for t in [*titles, *text.split("\n")] if t.strip()]


def _jargon(page: str) -> list[str]:
    found = [w for w in _words(page) if JARGON.search(KEYBOARD.sub("", w))]
    return found


@pytest.fixture
def run(db):
    run = make_run(3, num_repeats=2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 0, 1), S.SUCCEEDED, 0.0)
    finish(key(run, 1, 0), S.FAILED, kind="agent_unreachable", error="connection refused", terminal=True)
    finish(key(run, 1, 1), S.FAILED, kind="seed_failed", error="seed_session answered 500")
    return run


def test_the_run_page_uses_no_jargon(signed_in, run):
    assert _jargon(signed_in.get(reverse("run", args=[run.pk])).content.decode()) == []


def test_a_rollout_page_uses_no_jargon(signed_in, run):
    for rollout in (key(run, 0, 0), key(run, 1, 0)):
        page = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
        assert _jargon(page) == [], rollout


def test_the_profile_compare_and_import_pages_use_no_jargon(signed_in, run):
    other = make_run(3, num_repeats=2, name="other")
    finish(key(other, 0, 0), S.SUCCEEDED, 1.0)
    for url in (
        reverse("run_profile", args=[run.pk]),
        reverse("compare") + f"?a={run.pk}&b={other.pk}",
        reverse("import"),
        reverse("runs"),
    ):
        assert _jargon(signed_in.get(url).content.decode()) == [], url
