"""Labels belong to a team: each team has its own set (starting with the default five), a user
sees and uses only their teams' sets (pages, filters, the API), and a rollout takes only its run's
team's labels, so another team's label set is invisible and unusable."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.models import Label, RolloutLabel, Team
from rollouts.review import actions
from rollouts.review.actions import ReviewError
from rollouts.tokens import create_token

from .run_factories import finish, key, make_run

API = "/api/v1"


@pytest.fixture
def two(db, django_user_model):
    red, blue = Team.objects.create(name="red"), Team.objects.create(name="blue")
    alice = django_user_model.objects.create_user(username="alice", password="x")
    bob = django_user_model.objects.create_user(username="bob", password="x")
    red.members.add(alice)
    blue.members.add(bob)
    secret = actions.create_label("blue-secret", "only blue knows", bob, team_id=blue.pk)
    mine = make_run(2, name="red run", team=red)
    finish(key(mine, 0), "succeeded", 1.0)
    _row, token = create_token(alice, "t")
    return {
        "red": red,
        "blue": blue,
        "alice": alice,
        "secret": secret,
        "mine": mine,
        "auth": {"HTTP_AUTHORIZATION": f"Bearer {token}"},
    }


def test_a_new_team_starts_with_the_default_five_labels_of_its_own(two):
    for team in (two["red"], two["blue"]):
        names = list(actions.labels_of(team.pk).values_list("name", flat=True))
        assert names[:5] == ["good", "bad", "reward-hack", "verifier-wrong", "env-bug"]
    assert Label.objects.get(team=two["red"], name="good") != Label.objects.get(team=two["blue"], name="good")


def test_the_same_label_name_may_be_in_two_teams_but_not_twice_in_one(two):
    actions.create_label("blue-secret", team_id=two["red"].pk)
    with pytest.raises(ReviewError, match="exists already"):
        actions.create_label("blue-secret", team_id=two["red"].pk)


def test_the_labels_page_shows_the_users_teams_sets_only(client, two):
    client.force_login(two["alice"])
    page = client.get(reverse("labels")).content.decode()
    assert "reward-hack" in page and "blue-secret" not in page and "only blue knows" not in page


def test_a_label_added_on_the_page_goes_to_the_users_team_and_another_team_is_refused(client, two):
    client.force_login(two["alice"])
    assert client.post(reverse("labels"), {"name": "red-only"}).status_code == 302
    assert Label.objects.get(name="red-only").team == two["red"]
    refused = client.post(reverse("labels"), {"name": "sneaky", "team": two["blue"].pk})
    assert refused.status_code == 400 and "not one of your teams" in refused.content.decode()
    assert not Label.objects.filter(name="sneaky").exists()


def test_another_teams_label_cannot_be_put_on_a_rollout(client, two):
    client.force_login(two["alice"])
    r = key(two["mine"], 0)
    url = reverse("review_label", args=[r.run_id, r.pk])
    response = client.post(url, {"label_name": "blue-secret"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "no label" in response.content.decode()
    with pytest.raises(ReviewError):
        actions.set_label(r, two["secret"], True, two["alice"])
    assert not RolloutLabel.objects.exists()


def test_the_run_tables_label_filter_offers_the_runs_team_set_only(client, two):
    client.force_login(two["alice"])
    response = client.get(reverse("run", args=[two["mine"].pk]))
    choices = [value for value, _text in response.context["filter"].fields["label"].choices]
    assert "good" in choices and "blue-secret" not in choices


def test_the_api_lists_and_uses_the_tokens_teams_labels_only(client, two):
    listed = client.get(f"{API}/labels", **two["auth"]).json()
    assert {lab["team"] for lab in listed} == {two["red"].pk}
    assert "blue-secret" not in {lab["name"] for lab in listed}
    r = key(two["mine"], 0)
    used = client.post(
        f"{API}/rollouts/{r.pk}/labels",
        data=json.dumps({"label": "blue-secret"}),
        content_type="application/json",
        **two["auth"],
    )
    assert used.status_code == 400 and not RolloutLabel.objects.exists()
    made = client.post(
        f"{API}/labels",
        data=json.dumps({"name": "x-blue", "team": two["blue"].pk}),
        content_type="application/json",
        **two["auth"],
    )
    assert made.status_code == 400 and not Label.objects.filter(name="x-blue").exists()
    ok = client.post(
        f"{API}/labels", data=json.dumps({"name": "x-red"}), content_type="application/json", **two["auth"]
    )
    assert ok.status_code == 201 and ok.json()["team"] == two["red"].pk
