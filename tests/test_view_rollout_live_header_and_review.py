"""A watched rollout's page stays current: while it runs the header counts the tokens its stored
calls reported; when it ends, the live update re-renders the review panel (the env reward and
"correct the reward…") with the page's own query, so nothing needs a reload."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.models import AgentCall, Rollout

from .test_view_trajectory_outline import _page, _timed_rollout

pytestmark = pytest.mark.django_db

USAGE = {
    "input_tokens": 120,
    "output_tokens": 30,
    "total_tokens": 150,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


def test_a_running_attempts_header_shows_the_tokens_of_its_stored_calls(signed_in):
    rollout = _timed_rollout(status=Rollout.Status.RUNNING)
    AgentCall.objects.filter(rollout=rollout, index=0).update(usage=USAGE)
    html = _page(signed_in, rollout)
    assert '<dd id="count-tokens" title="so far: the calls stored until now">120 / 30 / 150</dd>' in html
    assert ">not reported<" not in html


def test_a_running_attempt_whose_calls_report_no_usage_says_so_far(signed_in):
    rollout = _timed_rollout(status=Rollout.Status.RUNNING)
    AgentCall.objects.filter(rollout=rollout).update(usage=None)
    assert "not reported so far" in _page(signed_in, rollout)


def test_the_live_update_of_an_ended_attempt_carries_its_review_panel_with_the_reward(signed_in):
    rollout = _timed_rollout(status=Rollout.Status.RUNNING)
    page = reverse("rollout", args=[rollout.run_id, rollout.pk])
    html = _page(signed_in, rollout)
    assert "no env reward" in html and "correct the reward…" not in html
    live = reverse("rollout_live", args=[rollout.run_id, rollout.pk])

    # Still running: no review panel in the live answer (it would not change).
    running = signed_in.get(live, {"from": 1}, headers={"HX-Current-URL": f"http://testserver{page}"})
    assert 'id="review-panel"' not in running.content.decode()

    Rollout.objects.filter(pk=rollout.pk).update(status=Rollout.Status.SUCCEEDED, reward=1.0)
    body = signed_in.get(
        live, {"from": 1}, headers={"HX-Current-URL": f"http://testserver{page}?review=1&status=succeeded"}
    ).content.decode()
    panel = body[body.index('<section id="review-panel"') :]
    assert 'hx-swap-oob="true"' in panel[: panel.index(">")]
    assert '<strong id="env-reward">1.0</strong>' in panel and "no env reward" not in panel
    assert "correct the reward…" in panel
    # The panel's forms return to the page (with its query), not to the live URL.
    assert f'value="{page}?review=1&amp;status=succeeded"' in panel and live not in panel
    assert 'data-review-mode="1"' in panel  # review mode kept from the page's query


def test_a_live_update_from_another_page_gets_a_panel_that_returns_to_the_rollout_page(signed_in):
    rollout = _timed_rollout(status=Rollout.Status.SUCCEEDED)
    live = reverse("rollout_live", args=[rollout.run_id, rollout.pk])
    body = signed_in.get(live, {"from": 0}, headers={"HX-Current-URL": "http://evil.example/x?review=1"})
    text = body.content.decode()
    assert "evil.example" not in text and 'data-review-mode="1"' not in text
    page = reverse("rollout", args=[rollout.run_id, rollout.pk])
    assert f'name="next" value="{page}"' in text and live not in text
