"""Review mode in a real browser, with the keyboard only: from a filtered run table, "Review these";
1–9 toggle labels, r opens the note box (Ctrl-Enter saves), j marks reviewed and moves on, k goes
back; the progress line follows; the trajectory page's own keys stay out of the way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollouts.models import Note, ReviewMark, Rollout, RolloutLabel

from .conftest import CHROMIUM
from .run_factories import finish, key, make_run

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(240),
]


def test_review_mode_with_the_keyboard(browser, live_server, transactional_db, django_user_model):  # noqa: F811
    django_user_model.objects.create_user(username="rita", password="correct horse battery")
    run = make_run(4)
    for t, reward in enumerate([1.0, 0.0, 1.0, 1.0]):
        finish(key(run, t), Rollout.Status.SUCCEEDED, reward)
    first, third, fourth = key(run, 0), key(run, 2), key(run, 3)

    page = browser.new_context(viewport={"width": 1300, "height": 1000}).new_page()
    page.set_default_timeout(15_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "rita")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    # A filtered list (reward ≥ 1: tasks 0, 2, 3), then review mode from its link.
    page.goto(f"{live_server.url}/runs/{run.pk}/?reward_min=1")
    page.click("#review-start")
    page.wait_for_url(re.compile(rf".*/rollouts/{first.pk}/\?.*review=1"))
    assert page.inner_text("#review-progress") == "0 of 3 reviewed"

    # 1 toggles "good" (HTMX swaps the panel), 3 toggles "reward-hack"; 1 again takes "good" off.
    page.keyboard.press("1")
    page.wait_for_selector('button[data-key="1"][aria-pressed="true"]')
    page.keyboard.press("3")
    page.wait_for_selector('button[data-key="3"][aria-pressed="true"]')
    page.keyboard.press("1")
    page.wait_for_selector('button[data-key="1"][aria-pressed="false"]')
    assert list(RolloutLabel.objects.filter(rollout=first).values_list("label__name", flat=True)) == ["reward-hack"]
    assert page.inner_text("#review-progress") == "1 of 3 reviewed"  # labelling counts as reviewed

    # r opens the note box; typing there never triggers a key; Ctrl-Enter saves.
    page.keyboard.press("r")
    assert page.evaluate("document.activeElement.id") == "note-text"
    page.keyboard.type("printed 1 2 j k without calling the tool")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector(".note-text")
    assert Note.objects.get(rollout=first).text == "printed 1 2 j k without calling the tool"
    assert list(RolloutLabel.objects.filter(rollout=first).values_list("label__name", flat=True)) == ["reward-hack"]

    # j: reviewed, next of the list (task 2, not task 1 which the filter leaves out).
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf".*/rollouts/{third.pk}/\?.*review=1"))
    assert page.inner_text("#review-progress") == "1 of 3 reviewed"
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf".*/rollouts/{fourth.pk}/\?.*review=1"))
    assert page.inner_text("#review-progress") == "2 of 3 reviewed"

    # k goes back without marking anything.
    page.keyboard.press("k")
    page.wait_for_url(re.compile(rf".*/rollouts/{third.pk}/\?.*review=1"))
    assert page.inner_text("#review-progress") == "2 of 3 reviewed"
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf".*/rollouts/{fourth.pk}/\?.*review=1"))

    # j on the last one ends on the list's summary.
    page.keyboard.press("j")
    page.wait_for_url(re.compile(r".*/review/\?.*summary=1"))
    assert page.inner_text("#review-progress") == "3 of 3 reviewed"
    assert set(ReviewMark.objects.values_list("rollout_id", flat=True)) == {first.pk, third.pk, fourth.pk}
    assert errors == []
