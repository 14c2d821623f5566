"""A review queue in a real browser: rollouts of two runs added from their filtered tables, "Next
unreviewed" opens the first, the rubric is filled in from the review panel, and j steps on to the
other run's rollout; the queue's page then shows the progress per assignee."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollouts.models import QueueEntry, Rollout, RubricAnswer
from rollouts.review import rubric

from .conftest import CHROMIUM
from .run_factories import finish, key, make_run

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
    pytest.mark.timeout(240),
]


def test_a_queue_across_two_runs_with_the_rubric(browser, live_server, transactional_db, django_user_model):  # noqa: F811
    rita = django_user_model.objects.create_user(username="rita", password="correct horse battery")
    first, second = make_run(2, name="first run"), make_run(2, name="second run")
    for run in (first, second):
        finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
        finish(key(run, 1), Rollout.Status.SUCCEEDED, 0.0)
    rubric.set_rubric(rubric.parse_lines("correctness: 0..5\nstyle: poor | ok | good"), rita)

    page = browser.new_context(viewport={"width": 1300, "height": 1000}).new_page()
    page.set_default_timeout(15_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "rita")
    page.fill("input[name=password]", "correct horse battery")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    # From each run's table filtered to reward ≥ 1: "Add to queue" (a new queue, then the same one).
    page.goto(f"{live_server.url}/runs/{first.pk}/?reward_min=1")
    page.click("#queue-add-link")
    assert page.inner_text("#queue-add-count") == "1 rollout"
    page.fill("input[name=new_queue]", "successes to check")
    page.click("#queue-add-submit")
    page.wait_for_url(re.compile(r".*/queues/\d+/$"))
    page.goto(f"{live_server.url}/runs/{second.pk}/?reward_min=1")
    page.click("#queue-add-link")
    page.click("#queue-add-submit")
    page.wait_for_url(re.compile(r".*/queues/\d+/$"))
    assert page.inner_text("#queue-reviewed") == "0 of 2 reviewed"

    # Next unreviewed: the first run's rollout, in the queue's review panel; the rubric filled in.
    page.click("#queue-next")
    page.wait_for_url(re.compile(rf".*/rollouts/{key(first, 0).pk}/\?queue=\d+"))
    page.fill("input[name=rubric_correctness]", "4")
    page.select_option("select[name=rubric_style]", "good")
    page.click("#review-rubric button[type=submit]")
    page.wait_for_selector("#rubric-answers")
    assert page.inner_text("#review-progress") == "1 of 2 reviewed"  # answering counts as reviewed

    # j: on to the other run's rollout.
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf".*/rollouts/{key(second, 0).pk}/\?queue=\d+"))
    page.keyboard.press("j")
    page.wait_for_url(re.compile(r".*/queues/\d+/$"))
    assert page.inner_text("#queue-reviewed") == "2 of 2 reviewed"
    assert RubricAnswer.objects.get().user == rita
    assert set(QueueEntry.objects.values_list("reviewed_by__username", flat=True)) == {"rita"}
    assert errors == []
