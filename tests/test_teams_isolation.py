"""Two teams on one instance cannot see or touch each other's runs: another team's run answers 404
(as a missing one: its existence is not revealed) on its page, its rollout page, its downloads,
its review and run actions and the API; lists and the compare picker leave it out. A superuser sees
every team's runs. New runs and datasets go to the user's team."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Dataset, Run, Team
from rollouts.tokens import create_token

from .run_factories import dataset_lines, finish, key, make_run

API = "/api/v1"


@pytest.fixture
def two_teams(db, django_user_model):
    red = Team.objects.create(name="red")
    blue = Team.objects.create(name="blue")
    alice = django_user_model.objects.create_user(username="alice", password="x")
    bob = django_user_model.objects.create_user(username="bob", password="x")
    red.members.add(alice)
    blue.members.add(bob)
    theirs = make_run(2, name="blue secret run", team=blue)
    finish(key(theirs, 0), "succeeded", 1.0)
    mine = make_run(2, name="red run", team=red)
    finish(key(mine, 0), "succeeded", 1.0)
    blue_set = runs.store_dataset(read_jsonl(dataset_lines(2), source="blue.jsonl"), "blue tasks", user=bob)
    return {
        "red": red,
        "blue": blue,
        "alice": alice,
        "bob": bob,
        "theirs": theirs,
        "mine": mine,
        "blue_set": blue_set,
    }


def test_users_made_while_teams_exist_join_no_team(two_teams):
    # alice and bob were made after "red" and "blue": the default team took neither
    assert list(two_teams["alice"].teams.values_list("name", flat=True)) == ["red"]
    assert list(two_teams["bob"].teams.values_list("name", flat=True)) == ["blue"]


def test_another_teams_run_page_and_rollout_page_answer_404(client, two_teams):
    client.force_login(two_teams["alice"])
    theirs, mine = two_teams["theirs"], two_teams["mine"]
    r = key(theirs, 0).pk
    for name, kwargs in [
        ("run", {"run_id": theirs.pk}),
        ("run_live", {"run_id": theirs.pk}),
        ("run_profile", {"run_id": theirs.pk}),
        ("rollout", {"run_id": theirs.pk, "rollout_id": r}),
        ("rollout_raw", {"run_id": theirs.pk, "rollout_id": r}),
    ]:
        assert client.get(reverse(name, kwargs=kwargs)).status_code == 404, name
    assert client.get(reverse("run", args=[mine.pk])).status_code == 200
    assert client.get(reverse("rollout", args=[mine.pk, key(mine, 0).pk])).status_code == 200


def test_another_teams_downloads_answer_404(client, two_teams):
    client.force_login(two_teams["alice"])
    theirs, mine = two_teams["theirs"], two_teams["mine"]
    assert client.get(reverse("run_export", args=[theirs.pk, "rollouts"])).status_code == 404
    assert client.get(reverse("run_export_sft", args=[theirs.pk])).status_code == 404
    assert client.get(reverse("run_export", args=[mine.pk, "rollouts"])).status_code == 200


def test_another_teams_review_and_run_actions_answer_404_and_change_nothing(client, two_teams):
    client.force_login(two_teams["alice"])
    theirs = two_teams["theirs"]
    r = key(theirs, 1)
    assert client.post(reverse("review_label", args=[theirs.pk, r.pk]), {"label": "good"}).status_code == 404
    assert client.post(reverse("review_note", args=[theirs.pk, r.pk]), {"text": "mine now"}).status_code == 404
    assert client.post(reverse("run_cancel", args=[theirs.pk])).status_code == 404
    assert client.post(reverse("run_retry", args=[theirs.pk])).status_code == 404
    assert client.post(reverse("run_delete", args=[theirs.pk])).status_code == 404
    assert Run.objects.filter(pk=theirs.pk).exists()
    assert not r.review_labels.exists() and not r.notes.exists()


def test_the_runs_list_and_the_compare_picker_leave_out_another_teams_runs(client, two_teams):
    client.force_login(two_teams["alice"])
    listing = client.get(reverse("runs")).content.decode()
    assert "red run" in listing and "blue secret run" not in listing
    picker = client.get(reverse("compare")).content.decode()
    assert "red run" in picker and "blue secret run" not in picker
    # named in the querystring, it is refused as an unknown choice, never compared
    theirs, mine = two_teams["theirs"], two_teams["mine"]
    page = client.get(reverse("compare"), {"a": mine.pk, "b": theirs.pk}).content.decode()
    assert "blue secret run" not in page


def test_the_environments_page_leaves_out_another_teams_env_urls_and_run_names(client, two_teams):
    # Closed ports: the page's health probe is refused at once.
    Run.objects.filter(pk=two_teams["theirs"].pk).update(env_url="http://127.0.0.1:9/blue-env")
    Run.objects.filter(pk=two_teams["mine"].pk).update(env_url="http://127.0.0.1:9/red-env")
    client.force_login(two_teams["alice"])
    page = client.get(reverse("environments")).content.decode()
    mine, theirs = reverse("run", args=[two_teams["mine"].pk]), reverse("run", args=[two_teams["theirs"].pk])
    assert "red-env" in page and f'href="{mine}"' in page
    assert "blue-env" not in page and f'href="{theirs}"' not in page


def test_the_api_answers_404_for_another_teams_run_and_rollout_and_lists_only_its_own(client, two_teams):
    _row, token = create_token(two_teams["alice"], "t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    theirs, mine = two_teams["theirs"], two_teams["mine"]
    r = key(theirs, 0).pk
    for method, url in [
        ("get", f"{API}/runs/{theirs.pk}"),
        ("get", f"{API}/runs/{theirs.pk}/rollouts"),
        ("get", f"{API}/runs/{theirs.pk}/rollouts.jsonl"),
        ("post", f"{API}/runs/{theirs.pk}/cancel"),
        ("get", f"{API}/rollouts/{r}"),
        ("post", f"{API}/rollouts/{r}/notes"),
        ("get", f"{API}/datasets/{two_teams['blue_set'].pk}"),
    ]:
        response = getattr(client, method)(url, **auth, content_type="application/json", data={"text": "x"})
        assert response.status_code == 404, (method, url, response.status_code)
    ids = [run["id"] for run in client.get(f"{API}/runs", **auth).json()]
    assert ids == [mine.pk]
    assert two_teams["blue_set"].pk not in [d["id"] for d in client.get(f"{API}/datasets", **auth).json()]
    assert client.get(f"{API}/runs/{mine.pk}", **auth).status_code == 200


def test_a_superuser_sees_every_teams_runs(client, two_teams, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="x")
    client.force_login(root)
    assert client.get(reverse("run", args=[two_teams["theirs"].pk])).status_code == 200
    listing = client.get(reverse("runs")).content.decode()
    assert "red run" in listing and "blue secret run" in listing


def test_a_new_run_goes_to_the_users_team_and_a_member_of_two_picks_one(client, two_teams, counter_tasks_path):
    alice = two_teams["alice"]
    client.force_login(alice)
    form = {
        "agent_url": "http://127.0.0.1:9102",
        "env_url": "http://127.0.0.1:9101",
        "agent_name": "counter_agent",
        "concurrency": 4,
        "num_repeats": 1,
        "max_attempts": 1,
        "remote_responses_timeout_s": 30,
        "run_timeout_s": 60,
    }
    with open(counter_tasks_path, "rb") as f:
        response = client.post(reverse("run_new"), {**form, "dataset_file": f})
    assert response.status_code == 302
    run = Run.objects.latest("id")
    assert run.team == two_teams["red"] and run.dataset.team == two_teams["red"]
    # in two teams: the form offers both and puts the run where it is told
    two_teams["blue"].members.add(alice)
    page = client.get(reverse("run_new")).content.decode()
    assert 'name="team"' in page
    with open(counter_tasks_path, "rb") as f:
        response = client.post(reverse("run_new"), {**form, "dataset_file": f, "team": two_teams["blue"].pk})
    assert response.status_code == 302
    run = Run.objects.latest("id")
    assert run.team == two_teams["blue"] and run.dataset.team == two_teams["blue"]


def test_another_teams_dataset_is_not_offered_on_the_new_run_form(client, two_teams):
    client.force_login(two_teams["alice"])
    page = client.get(reverse("run_new")).content.decode()
    blue_sets = Dataset.objects.filter(team=two_teams["blue"])
    assert two_teams["blue_set"] in blue_sets
    assert "blue tasks" not in page
    assert client.get(reverse("dataset_new_run", args=[two_teams["blue_set"].pk])).status_code == 404
    client.force_login(two_teams["bob"])
    assert "blue tasks" in client.get(reverse("run_new")).content.decode()
    assert client.get(reverse("dataset_new_run", args=[two_teams["blue_set"].pk])).status_code == 200
