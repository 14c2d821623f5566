"""Labels, notes and corrected rewards on a rollout: the trajectory page's review panel, its POST
actions (HTMX and plain), the Labels page, the run table's columns and filters, and permission
failures (anonymous, CSRF)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from rollouts.models import Label, Note, RewardCorrection, Rollout, RolloutLabel
from rollouts.review import actions
from rollouts.review.actions import ReviewError

from .run_factories import finish, key, make_run
from .test_view_rollout_detail import make_rollout, make_task, msg
from .test_view_rollout_detail import make_run as bare_run

S = Rollout.Status


@pytest.fixture
def run(db):
    run = make_run(4)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.SUCCEEDED, 0.0)
    finish(key(run, 2), S.FAILED, kind="agent_timeout")
    finish(key(run, 3), S.SUCCEEDED, 1.0)
    return run


def label_url(r):
    return reverse("review_label", args=[r.run_id, r.pk])


def note_url(r):
    return reverse("review_note", args=[r.run_id, r.pk])


def correction_url(r):
    return reverse("review_correction", args=[r.run_id, r.pk])


def test_an_instance_starts_with_the_five_labels_in_key_order(db):
    assert list(Label.objects.values_list("name", flat=True)) == [
        "good",
        "bad",
        "reward-hack",
        "verifier-wrong",
        "env-bug",
    ]


def test_a_label_toggles_on_and_off_and_keeps_who_and_when(signed_in, user, run):
    r = key(run, 0)
    response = signed_in.post(label_url(r), {"label_name": "reward-hack", "next": r.get_absolute_url()})
    assert response.status_code == 302 and response["Location"] == r.get_absolute_url()
    use = RolloutLabel.objects.get(rollout=r)
    assert use.label.name == "reward-hack" and use.created_by == user and use.created is not None
    signed_in.post(label_url(r), {"label_name": "reward-hack"})
    assert not RolloutLabel.objects.filter(rollout=r).exists()


def test_on_sets_a_label_without_toggling(signed_in, run):
    r = key(run, 0)
    for _ in range(2):
        signed_in.post(label_url(r), {"label_name": "good", "on": "1"})
    assert RolloutLabel.objects.filter(rollout=r).count() == 1
    signed_in.post(label_url(r), {"label_name": "good", "on": "0"})
    assert not RolloutLabel.objects.filter(rollout=r).exists()


def test_an_htmx_toggle_returns_the_panel_alone(signed_in, run):
    r = key(run, 0)
    response = signed_in.post(label_url(r), {"label_name": "good"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'id="review-panel"' in html and 'aria-pressed="true"' in html and "HX-Request" in response["Vary"]


def test_an_unknown_label_is_a_clear_error_and_stores_nothing(signed_in, run):
    r = key(run, 0)
    response = signed_in.post(label_url(r), {"label_name": "nope"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "no label &#x27;nope&#x27;" in response.content.decode()
    assert not RolloutLabel.objects.exists()


def test_a_redirect_back_never_leaves_the_site(signed_in, run):
    r = key(run, 0)
    response = signed_in.post(label_url(r), {"label_name": "good", "next": "https://evil.example/"})
    assert response["Location"] == r.get_absolute_url()


def test_actions_need_a_signed_in_user(client, run):
    r = key(run, 0)
    for url, data in (
        (label_url(r), {"label_name": "good"}),
        (note_url(r), {"text": "x"}),
        (correction_url(r), {"reward": 1, "reason": "x"}),
    ):
        response = client.post(url, data)
        assert response.status_code == 302 and reverse("login") in response["Location"]
    assert not RolloutLabel.objects.exists() and not Note.objects.exists() and not RewardCorrection.objects.exists()


def test_actions_refuse_a_post_without_the_csrf_token(user, run):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    r = key(run, 0)
    for url, data in (
        (label_url(r), {"label_name": "good"}),
        (note_url(r), {"text": "x"}),
        (correction_url(r), {"reward": 1, "reason": "x"}),
        (reverse("labels"), {"name": "new-one"}),
    ):
        assert strict.post(url, data).status_code == 403
    assert not RolloutLabel.objects.exists() and not Note.objects.exists() and not RewardCorrection.objects.exists()
    assert not Label.objects.filter(name="new-one").exists()


def test_actions_refuse_get(signed_in, run):
    r = key(run, 0)
    assert signed_in.get(label_url(r)).status_code == 405


def test_a_rollout_of_another_run_is_404(signed_in, run):
    other = make_run(1)
    r = key(run, 0)
    assert signed_in.post(reverse("review_label", args=[other.pk, r.pk]), {"label_name": "good"}).status_code == 404


def test_a_note_on_the_rollout_and_one_on_an_item(signed_in, user, db):
    brun = bare_run()
    r = make_rollout(brun, make_task(brun), items=[(0, msg("hello"), {}), (0, msg("done"), {})])
    signed_in.post(note_url(r), {"text": "  looks fine  "})
    signed_in.post(note_url(r), {"text": "this answer is made up", "item": "#1"})
    notes = list(Note.objects.filter(rollout=r).order_by("id"))
    assert [(n.text, n.item_seq, n.created_by) for n in notes] == [
        ("looks fine", None, user),
        ("this answer is made up", 1, user),
    ]
    page = signed_in.get(r.get_absolute_url()).content.decode()
    assert "this answer is made up" in page and 'href="#item-1"' in page and "notes (2)" in page


def test_a_note_posted_from_a_content_searched_list_keeps_the_search_apart(signed_in, user, db):
    # The panel's forms carry the list's filters, and ``text`` is the content-search filter: the
    # note goes in its own ``note`` field, and the list's ``text`` is not taken for the note.
    brun = bare_run()
    r = make_rollout(brun, make_task(brun), items=[(0, msg("hello"), {})])
    signed_in.post(note_url(r), {"note": "the model guessed", "text": "hello", "review": "1"})
    assert list(Note.objects.filter(rollout=r).values_list("text", flat=True)) == ["the model guessed"]
    page = signed_in.get(r.get_absolute_url()).content.decode()
    assert 'name="note"' in page and '<textarea name="text"' not in page


@pytest.mark.parametrize(
    "data, message",
    [
        ({"text": "   "}, "the note is empty"),
        ({"text": "x", "item": "7"}, "this rollout has no item #7"),
        ({"text": "x", "item": "first"}, "give the item&#x27;s number"),
    ],
)
def test_a_bad_note_is_reported_and_not_stored(signed_in, run, data, message):
    r = key(run, 0)
    response = signed_in.post(note_url(r), data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and message in response.content.decode()
    assert not Note.objects.exists()


def test_only_its_author_deletes_a_note(signed_in, user, run, django_user_model):
    r = key(run, 0)
    bob = django_user_model.objects.create_user(username="bob", password="x")
    mine = actions.add_note(r, "mine", user)
    theirs = actions.add_note(r, "theirs", bob)
    assert signed_in.post(reverse("review_note_delete", args=[run.pk, r.pk, mine.pk])).status_code == 302
    response = signed_in.post(reverse("review_note_delete", args=[run.pk, r.pk, theirs.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    assert list(Note.objects.values_list("text", flat=True)) == ["theirs"]


def test_a_corrected_reward_is_kept_beside_the_env_s(signed_in, user, run):
    r = key(run, 1)
    signed_in.post(correction_url(r), {"reward": "1", "reason": "the answer is right; the verifier mis-parsed it"})
    r.refresh_from_db()
    assert r.reward == 0.0  # the env's reward is never replaced
    corr = actions.current_correction(r)
    assert corr.reward == 1.0 and corr.created_by == user and "mis-parsed" in corr.reason
    page = signed_in.get(r.get_absolute_url()).content.decode()
    assert 'id="env-reward">0.0<' in page and 'id="corrected-reward">1.0<' in page


def test_withdrawing_keeps_the_history(signed_in, run):
    r = key(run, 1)
    signed_in.post(correction_url(r), {"reward": "1", "reason": "right answer"})
    signed_in.post(correction_url(r), {"withdraw": "1"})
    assert actions.current_correction(r) is None
    assert list(RewardCorrection.objects.filter(rollout=r).values_list("reward", flat=True)) == [1.0, None]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"reward": "high", "reason": "x"}, "must be a number"),
        ({"reward": "nan", "reason": "x"}, "finite"),
        ({"reward": "1"}, "say why"),
    ],
)
def test_a_bad_correction_is_reported_and_not_stored(signed_in, run, data, message):
    r = key(run, 1)
    response = signed_in.post(correction_url(r), data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and message in response.content.decode()
    assert not RewardCorrection.objects.exists()


def test_a_failed_rollout_has_no_verifier_reward_to_correct(run):
    with pytest.raises(ReviewError, match="only a succeeded rollout"):
        actions.correct_reward(key(run, 2), 1.0, "env bug")


def test_the_labels_page_adds_and_orders_labels(signed_in, run):
    response = signed_in.post(reverse("labels"), {"name": "Needs-Rerun", "description": "flaky env"})
    assert response.status_code == 302
    label = Label.objects.get(name="needs-rerun")
    assert label.position > Label.objects.get(name="env-bug").position
    signed_in.post(reverse("label_up", args=[label.pk]))
    names = list(Label.objects.order_by("position", "id").values_list("name", flat=True))
    assert names[-2:] == ["needs-rerun", "env-bug"]
    page = signed_in.get(reverse("labels")).content.decode()
    assert "needs-rerun" in page and "flaky env" in page


@pytest.mark.parametrize(
    "name, message", [("good", "exists already"), ("two words", "use 1–40"), ("", "use 1–40"), ("-x", "use 1–40")]
)
def test_the_labels_page_refuses_bad_names(signed_in, db, name, message):
    before = Label.objects.count()
    response = signed_in.post(reverse("labels"), {"name": name})
    assert response.status_code == 400 and message in response.content.decode()
    assert Label.objects.count() == before


def test_the_run_table_shows_labels_and_note_counts(signed_in, user, run):
    r = key(run, 0)
    actions.set_label(r, actions.find_label("good", team_id=run.team_id), True, user)
    actions.add_note(r, "one", user)
    actions.add_note(r, "two", user)
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert '<span class="badge label-badge">good</span>' in html and "✎ 2" in html


@pytest.mark.parametrize(
    "query, expected",
    [
        ("label=good", [0]),
        ("label=-", [1, 2, 3]),
        ("not_label=good", [1, 2, 3]),
        ("notes=yes", [1]),
        ("notes=no", [0, 2, 3]),
        ("corrected=yes", [3]),
        ("corrected=no", [0, 1, 2]),
        ("label=good&notes=no", [0]),
        # key 2 failed: it has no reward, so no reward bound matches it
        ("reward_max=0.5", [1]),
        ("reward_max=0.5&reward_source=corrected", [1, 3]),
        ("reward_min=0.5&reward_source=corrected", [0]),
    ],
)
def test_the_run_table_filters_by_label_notes_and_corrected_reward(signed_in, user, run, query, expected):
    actions.set_label(key(run, 0), actions.find_label("good", team_id=run.team_id), True, user)
    actions.add_note(key(run, 1), "hmm", user)
    actions.correct_reward(key(run, 3), 0.0, "reward hack", user)
    response = signed_in.get(reverse("run", args=[run.pk]) + "?" + query, HTTP_HX_REQUEST="true")
    tasks = [r.task_index for r, _url in response.context["rows"]]
    assert tasks == expected


def test_a_permalink_to_a_removed_label_is_an_empty_list_not_an_error(signed_in, run):
    response = signed_in.get(reverse("run", args=[run.pk]) + "?label=gone", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response.context["rows"] == []


@pytest.mark.parametrize("query", ["label=%00", "not_label=%00", "label=has%20space", "label=" + "x" * 300])
def test_a_label_filter_no_label_could_have_is_reported_on_the_field_not_a_server_error(signed_in, run, query):
    # A NUL reached PostgreSQL (a 500 there); no label can have it, so it is an invalid choice.
    field = query.split("=")[0]
    response = signed_in.get(reverse("run", args=[run.pk]) + "?" + query, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and field in response.context["filter"].errors
    assert response.context["rows"] == []  # an invalid filter: its error, no rows
    assert signed_in.get(reverse("rollout", args=[run.pk, key(run, 0).pk]) + "?" + query).status_code == 200
    assert signed_in.get(reverse("review_start", args=[run.pk]) + "?" + query).status_code in (200, 302)
    with pytest.raises(ReviewError):
        actions.find_label(query.split("=", 1)[1].replace("%00", "\x00"), team_id=run.team_id)


def test_the_trajectory_page_shows_the_panel_with_keys_for_the_first_nine_labels(signed_in, user, run):
    for n in range(6):
        actions.create_label(f"extra-{n}", team_id=run.team_id)
    r = key(run, 0)
    actions.set_label(r, actions.find_label("bad", team_id=run.team_id), True, user)
    html = signed_in.get(r.get_absolute_url()).content.decode()
    assert 'id="review-panel"' in html and "review.js" in html
    assert 'data-key="9"' in html and 'data-key="10"' not in html
    assert 'data-label="bad" title="on since' in html
    assert "data-review-mode" not in html  # not in review mode


def test_the_panel_escapes_what_reviewers_write(signed_in, user, run):
    r = key(run, 1)
    evil = "<script>alert(1)</script><img src=x onerror=alert(1)>"
    actions.add_note(r, evil, user)
    actions.correct_reward(r, 1.0, evil, user)
    html = signed_in.get(r.get_absolute_url()).content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_run_page_review_card_shows_rewards_both_ways(signed_in, user, run):
    actions.correct_reward(key(run, 1), 1.0, "right", user)
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    # env: successes 1, 0, 1 → 0.6667; corrected: 1, 1, 1 → 1.0
    assert 'id="reward-mean-corrected">1.0000<' in html and "0.6667" in html
    assert "1 corrected reward" in html


def test_a_flushed_label_table_gets_the_default_set_back_but_a_team_s_set_is_left_alone(db):
    from django.apps import apps
    from django.db.models.signals import post_migrate

    Label.objects.all().delete()
    post_migrate.send(
        sender=apps.get_app_config("rollouts"),
        app_config=apps.get_app_config("rollouts"),
        verbosity=0,
        interactive=False,
        using="default",
        apps=apps,
        plan=[],
    )
    assert list(Label.objects.values_list("name", flat=True)) == [
        "good",
        "bad",
        "reward-hack",
        "verifier-wrong",
        "env-bug",
    ]
    Label.objects.exclude(name="good").delete()
    assert actions.ensure_default_labels() == 0
    assert list(Label.objects.values_list("name", flat=True)) == ["good"]


def test_notes_and_reasons_keep_any_text_on_every_backend(signed_in, user, run):
    # PostgreSQL's text columns refuse U+0000; review text is stored losslessly (rollouts.lossless).
    r = key(run, 1)
    actions.add_note(r, "a\x00b \ufdd0 c", user)
    actions.correct_reward(r, 1.0, "nul\x00here", user)
    assert Note.objects.get(rollout=r).text == "a\x00b \ufdd0 c"
    assert actions.current_correction(r).reason == "nul\x00here"
    assert signed_in.get(r.get_absolute_url()).status_code == 200
