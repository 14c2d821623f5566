"""Review mode: from any filtered list, one rollout per page; "j" (a POST) counts the rollout as
reviewed and moves on; progress "N of M reviewed" is kept per user and per list."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.urls import reverse

from rollouts.models import ReviewList, ReviewMark, Rollout
from rollouts.review import actions

from .run_factories import finish, key, make_run

S = Rollout.Status


@pytest.fixture
def run(db):
    run = make_run(5)
    for t, reward in enumerate([1.0, 0.0, 1.0, 0.0, 1.0]):
        finish(key(run, t), S.SUCCEEDED, reward)
    return run


def start(client, run, query=""):
    return client.get(reverse("review_start", args=[run.pk]) + (f"?{query}" if query else ""))


def next_(client, run, rollout, query_params: dict):
    return client.post(reverse("review_next", args=[run.pk]), {**query_params, "rollout": rollout.pk})


def target(response) -> tuple[int, dict]:
    parts = urlsplit(response["Location"])
    rollout_id = int(parts.path.rstrip("/").split("/")[-1])
    return rollout_id, {k: v[0] for k, v in parse_qs(parts.query).items()}


def test_review_starts_at_the_first_rollout_of_the_filtered_list(signed_in, run):
    response = start(signed_in, run, "reward_min=1")
    assert response.status_code == 302
    rollout_id, params = target(response)
    assert rollout_id == key(run, 0).pk and params == {"reward_min": "1.0", "review": "1"}


def test_the_page_in_review_mode_shows_progress_and_the_keys(signed_in, run):
    page = signed_in.get(key(run, 0).get_absolute_url() + "?reward_min=1&review=1")
    html = page.content.decode()
    assert 'data-review-mode="1"' in html and 'id="review-progress">0 of 3 reviewed<' in html
    assert 'data-review="next-form"' in html and '<input type="hidden" name="reward_min" value="1.0">' in html
    assert 'data-review="prev"' not in html  # the first of the list


def test_j_marks_reviewed_and_moves_to_the_next_of_the_list(signed_in, user, run):
    response = next_(signed_in, run, key(run, 0), {"reward_min": "1"})
    rollout_id, params = target(response)
    assert rollout_id == key(run, 2).pk and params["review"] == "1"
    html = signed_in.get(response["Location"]).content.decode()
    assert 'id="review-progress">1 of 3 reviewed<' in html and 'data-review="prev"' in html
    review_list = ReviewList.objects.get(user=user, run=run)
    assert review_list.filters == "reward_min=1.0"
    assert list(ReviewMark.objects.values_list("rollout_id", flat=True)) == [key(run, 0).pk]


def test_past_the_last_rollout_comes_the_summary(signed_in, run):
    params = {"reward_min": "1"}
    for t in (0, 2, 4):
        response = next_(signed_in, run, key(run, t), params)
    assert reverse("review_start", args=[run.pk]) in response["Location"] and "summary=1" in response["Location"]
    html = signed_in.get(response["Location"]).content.decode()
    assert 'id="review-progress">3 of 3 reviewed<' in html and "Every rollout of this list is reviewed" in html


def test_coming_back_resumes_at_the_first_not_reviewed(signed_in, run):
    next_(signed_in, run, key(run, 0), {})
    next_(signed_in, run, key(run, 1), {})
    rollout_id, _ = target(start(signed_in, run))
    assert rollout_id == key(run, 2).pk


def test_a_skipped_rollout_is_still_to_do_at_the_end(signed_in, run):
    # Open the second one directly and go on from there: the first stays unreviewed.
    for t in (1, 2, 3, 4):
        response = next_(signed_in, run, key(run, t), {})
    html = signed_in.get(response["Location"]).content.decode()
    assert "4 of 5 reviewed" in html and 'id="review-continue"' in html


def test_progress_is_kept_per_list(signed_in, run):
    next_(signed_in, run, key(run, 0), {"reward_min": "1"})
    assert (
        'id="review-progress">0 of 5 reviewed<'
        in signed_in.get(key(run, 0).get_absolute_url() + "?review=1").content.decode()
    )
    assert (
        'id="review-progress">1 of 3 reviewed<'
        in signed_in.get(key(run, 0).get_absolute_url() + "?reward_min=1&review=1").content.decode()
    )
    # The same list sorted differently is the same list.
    assert (
        "1 of 3 reviewed"
        in signed_in.get(key(run, 0).get_absolute_url() + "?reward_min=1&sort=-reward&review=1").content.decode()
    )


def test_progress_is_kept_per_user(signed_in, run, django_user_model):
    next_(signed_in, run, key(run, 0), {})
    bob = Client()
    bob.force_login(django_user_model.objects.create_user(username="bob", password="x"))
    assert "0 of 5 reviewed" in bob.get(key(run, 0).get_absolute_url() + "?review=1").content.decode()
    assert "1 of 5 reviewed" in signed_in.get(key(run, 0).get_absolute_url() + "?review=1").content.decode()


def test_labelling_in_review_mode_counts_as_reviewed(signed_in, run):
    r = key(run, 1)
    response = signed_in.post(
        reverse("review_label", args=[run.pk, r.pk]),
        {"label_name": "bad", "review": "1", "reward_max": "0"},
        HTTP_HX_REQUEST="true",
    )
    html = response.content.decode()
    assert 'data-review-mode="1"' in html and 'id="review-progress">1 of 2 reviewed<' in html


def test_labelling_outside_review_mode_marks_nothing(signed_in, run):
    signed_in.post(reverse("review_label", args=[run.pk, key(run, 1).pk]), {"label_name": "bad"})
    assert not ReviewMark.objects.exists()


def test_a_list_filtered_by_label_counts_only_what_is_still_in_it(signed_in, user, run):
    # Review the unlabelled ones and label as you go: labelled rollouts leave the list.
    r = key(run, 0)
    next_(signed_in, run, r, {"label_name": "-"})
    actions.set_label(r, actions.find_label("good", team_id=r.run.team_id), True, user)
    html = signed_in.get(key(run, 1).get_absolute_url() + "?label=-&review=1").content.decode()
    assert "0 of 4 reviewed" in html


def test_reset_forgets_the_list_s_progress(signed_in, run):
    next_(signed_in, run, key(run, 0), {})
    response = signed_in.post(reverse("review_reset", args=[run.pk]), {})
    assert response.status_code == 302 and not ReviewMark.objects.exists()


def test_an_empty_list_says_so(signed_in, run):
    response = start(signed_in, run, "reward_min=5")
    assert response.status_code == 200 and "No rollout is in this list" in response.content.decode()


def test_review_mode_needs_a_signed_in_user_and_a_csrf_token(client, user, run):
    assert reverse("login") in start(client, run)["Location"]
    assert reverse("login") in next_(client, run, key(run, 0), {})["Location"]
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert next_(strict, run, key(run, 0), {}).status_code == 403
    assert strict.post(reverse("review_reset", args=[run.pk]), {}).status_code == 403
    assert not ReviewMark.objects.exists()


def test_next_with_a_rollout_of_another_run_is_404(signed_in, run):
    other = make_run(1)
    assert next_(signed_in, other, key(run, 0), {}).status_code == 404


def test_the_run_page_links_review_mode_to_the_filtered_list(signed_in, run):
    html = signed_in.get(reverse("run", args=[run.pk]) + "?reward_min=1").content.decode()
    assert f'href="{reverse("review_start", args=[run.pk])}?reward_min=1.0"' in html and "Review these" in html


def test_j_on_a_rollout_that_left_the_list_goes_on_with_the_list(signed_in, user, run):
    # Reviewing unlabelled rollouts: label the first (it leaves the list), then j.
    r = key(run, 0)
    actions.set_label(r, actions.find_label("good", team_id=r.run.team_id), True, user)
    response = next_(signed_in, run, r, {"label": "-"})
    assert response["Location"] == reverse("review_start", args=[run.pk]) + "?label=-"
    rollout_id, params = target(signed_in.get(response["Location"]))
    assert rollout_id == key(run, 1).pk and params["label"] == "-"
