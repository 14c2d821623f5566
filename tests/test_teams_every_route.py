"""Every dashboard route (``rollouts.web``) that names a run, a rollout, a dataset, a label or a review queue
answers 404 for another team's one, GET or POST: a page or action added later cannot forget the team rule
(``rollouts.web.access``) without this test naming it. Renaming another team's dataset changes nothing."""

from __future__ import annotations

import pytest
from django.urls import URLPattern, get_resolver, reverse

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Dataset, Label, QueueEntry, ReviewQueue, Run, Team

from .run_factories import dataset_lines, finish, key, make_run

# Routes keyed by something other than a team's run, dataset or label: a user's own task or token.
NOT_TEAM_KEYED = {"task_id", "token_id", "note_id"}
TEAM_KEYED = {"run_id", "rollout_id", "dataset_id", "label_id", "queue_id"}


@pytest.fixture
def theirs(db, django_user_model):
    red, blue = Team.objects.create(name="red"), Team.objects.create(name="blue")
    alice = django_user_model.objects.create_user(username="alice", password="x")
    bob = django_user_model.objects.create_user(username="bob", password="x")
    red.members.add(alice)
    blue.members.add(bob)
    run = make_run(2, name="blue secret run", team=blue)
    finish(key(run, 0), "succeeded", 1.0)
    dataset = runs.store_dataset(read_jsonl(dataset_lines(2), source="blue.jsonl"), "blue tasks", user=bob)
    queue = ReviewQueue.objects.create(name="blue queue", team=blue, created_by=bob)
    QueueEntry.objects.create(queue=queue, rollout=key(run, 0))
    label = Label.objects.get(team=blue, name="bad")
    return {"alice": alice, "run": run, "rollout": key(run, 0), "dataset": dataset, "queue": queue, "label": label}


def _team_keyed_routes() -> list[URLPattern]:
    out = []
    for entry in get_resolver().url_patterns:
        for pattern in getattr(entry, "url_patterns", [entry]):
            if not isinstance(pattern, URLPattern) or not pattern.name:
                continue
            if not pattern.callback.__module__.startswith("rollouts.web"):  # the API has its own tests
                continue
            names = set(pattern.pattern.regex.groupindex)
            if names & TEAM_KEYED and not names & NOT_TEAM_KEYED:
                out.append(pattern)
    return out


def test_every_route_of_another_teams_run_rollout_or_dataset_answers_404(client, theirs):
    client.force_login(theirs["alice"])
    values = {
        "run_id": theirs["run"].pk,
        "rollout_id": theirs["rollout"].pk,
        "dataset_id": theirs["dataset"].pk,
        "queue_id": theirs["queue"].pk,
        "label_id": theirs["label"].pk,
        "kind": "rollouts",
        "fmt": "md",
        "key": "verify",
    }
    routes = _team_keyed_routes()
    assert len(routes) >= 25, [p.name for p in routes]
    leaks = []
    for pattern in routes:
        url = reverse(pattern.name, kwargs={n: values[n] for n in pattern.pattern.regex.groupindex})
        response = client.get(url)
        if response.status_code == 405:  # POST only
            response = client.post(url, {"name": "mine now", "text": "mine now", "label": "good"})
        if response.status_code != 404:
            leaks.append((pattern.name, response.status_code))
    assert leaks == []
    run = Run.objects.get(pk=theirs["run"].pk)
    assert run.name == "blue secret run" and run.status == Run.Status.COMPLETED
    assert QueueEntry.objects.get().assigned_to is None and QueueEntry.objects.get().reviewed_at is None
    assert Label.objects.get(pk=theirs["label"].pk).position == 1  # not moved up


def test_renaming_another_teams_dataset_changes_nothing(client, theirs):
    client.force_login(theirs["alice"])
    response = client.post(reverse("dataset_rename"), {"dataset": theirs["dataset"].pk, "name": "mine now"})
    assert response.status_code in (302, 403)
    assert Dataset.objects.get(pk=theirs["dataset"].pk).name == "blue tasks"


def test_the_new_run_forms_dataset_choices_are_the_users_teams_only(client, theirs):
    client.force_login(theirs["alice"])
    page = client.get(reverse("run_new")).content.decode()
    assert "blue tasks" not in page
