"""Review queue pages: the queues list and a new queue, the queue page's progress (reviewed/total
and per assignee), assignment to a member of the team, and team isolation (another team's queue is
404; a queue holds its own team's rollouts only). Adding to a queue: test_view_queue_add.py."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.models import QueueEntry, ReviewQueue, Rollout, Team
from rollouts.review import queues

from .run_factories import finish, key, make_run

S = Rollout.Status


@pytest.fixture
def two_runs(db, user):
    first, second = make_run(4, name="first"), make_run(3, name="second")
    for t, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
        finish(key(first, t), S.SUCCEEDED, reward)
    for t in range(3):
        finish(key(second, t), S.SUCCEEDED, 1.0)
    return first, second


def test_a_new_queue_is_made_in_the_users_team_and_listed(signed_in, user):
    response = signed_in.post(reverse("queues"), {"name": "reward hacks"})
    queue = ReviewQueue.objects.get()
    assert response.status_code == 302 and response["Location"] == queue.get_absolute_url()
    assert queue.team.name == "default" and queue.created_by == user
    html = signed_in.get(reverse("queues")).content.decode()
    assert "reward hacks" in html and f'data-queue-progress="{queue.pk}">0 of 0<' in html


def test_a_queue_without_a_name_is_refused_and_nothing_is_made(signed_in):
    response = signed_in.post(reverse("queues"), {"name": "  "})
    assert response.status_code == 400 and "give the queue a name" in response.content.decode()
    assert not ReviewQueue.objects.exists()


def test_the_queue_page_shows_progress_overall_and_per_assignee(signed_in, user, django_user_model, two_runs):
    first, second = two_runs
    bob = django_user_model.objects.create_user(username="bob", password="x")
    queue = queues.create_queue("q", user)
    queues.add_rollouts(queue, Rollout.objects.filter(run__in=[first, second]).order_by("id"), user)
    entries = list(QueueEntry.objects.filter(queue=queue).order_by("id"))
    queues.assign(queue, bob, [e.pk for e in entries[:3]])
    queues.assign(queue, user, [entries[3].pk])
    queues.mark_reviewed(queue, entries[0].rollout, bob)
    queues.mark_reviewed(queue, entries[3].rollout, user)
    queues.mark_reviewed(queue, entries[6].rollout, user)  # an unassigned one becomes the reviewer's
    html = signed_in.get(queue.get_absolute_url()).content.decode()
    assert 'id="queue-reviewed">3 of 7 reviewed<' in html and "4 left" in html
    rows = queues.progress(queue).rows
    assert rows == [
        {"user": "alice", "reviewed": 2, "total": 2},
        {"user": "bob", "reviewed": 1, "total": 3},
        {"user": None, "reviewed": 0, "total": 2},
    ]
    assert 'data-assignee="bob"><td>bob</td>\n        <td class="num">1</td><td class="num">3</td>' in html


def test_assign_the_ticked_entries_or_every_unassigned_one(signed_in, user, django_user_model, two_runs):
    first, _ = two_runs
    bob = django_user_model.objects.create_user(username="bob", password="x")
    queue = queues.create_queue("q", user)
    queues.add_rollouts(queue, Rollout.objects.filter(run=first).order_by("id"), user)
    ids = list(QueueEntry.objects.filter(queue=queue).order_by("id").values_list("id", flat=True))
    url = reverse("queue_assign", args=[queue.pk])
    response = signed_in.post(url, {"assignee": "bob", "entry": ids[:2], "scope": "selected"})
    assert response.status_code == 302
    response = signed_in.post(url, {"assignee": "alice", "scope": "unassigned"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'id="queue-body"' in response.content.decode()
    assigned = dict(QueueEntry.objects.values_list("id", "assigned_to__username"))
    assert [assigned[i] for i in ids] == ["bob", "bob", "alice", "alice"]
    assert bob.pk and queues.progress(queue).rows[1] == {"user": "bob", "reviewed": 0, "total": 2}


def test_assigning_to_someone_outside_the_team_is_refused(signed_in, user, django_user_model, two_runs):
    first, _ = two_runs
    outsider = django_user_model.objects.create_user(username="carol", password="x")
    Team.objects.get(name="default").members.remove(outsider)
    queue = queues.create_queue("q", user)
    queues.add_rollouts(queue, Rollout.objects.filter(run=first), user)
    response = signed_in.post(
        reverse("queue_assign", args=[queue.pk]), {"assignee": "carol", "scope": "unassigned"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 400 and "not a member of the queue&#x27;s team" in response.content.decode()
    assert not QueueEntry.objects.filter(assigned_to__isnull=False).exists()


@pytest.fixture
def teams(db, django_user_model):
    red, blue = Team.objects.create(name="red"), Team.objects.create(name="blue")
    alice = django_user_model.objects.create_user(username="alice", password="x")
    bob = django_user_model.objects.create_user(username="bob", password="x")
    red.members.add(alice)
    blue.members.add(bob)
    blue_run = make_run(2, name="blue run", team=blue)
    red_run = make_run(2, name="red run", team=red)
    blue_queue = ReviewQueue.objects.create(name="blue secrets", team=blue, created_by=bob)
    queues.add_rollouts(blue_queue, Rollout.objects.filter(run=blue_run), bob)
    return {"alice": alice, "blue_queue": blue_queue, "blue_run": blue_run, "red_run": red_run, "red": red}


def test_another_teams_queue_is_404_on_every_route(client, teams):
    client.force_login(teams["alice"])
    queue = teams["blue_queue"]
    assert client.get(reverse("queue", args=[queue.pk])).status_code == 404
    assert client.post(reverse("queue_assign", args=[queue.pk]), {"scope": "unassigned"}).status_code == 404
    assert client.post(reverse("queue_next", args=[queue.pk])).status_code == 404
    assert client.post(reverse("queue_add", args=[teams["red_run"].pk]), {"queue": queue.pk}).status_code == 404
    assert "blue secrets" not in client.get(reverse("queues")).content.decode()
    assert QueueEntry.objects.filter(queue=queue, assigned_to__isnull=False).count() == 0
    assert QueueEntry.objects.filter(queue=queue).count() == 2


def test_a_queue_takes_rollouts_of_its_own_teams_runs_only(teams):
    red_queue = ReviewQueue.objects.create(name="red", team=teams["red"])
    with pytest.raises(queues.ReviewError, match="not in the queue's team"):
        queues.add_rollouts(red_queue, Rollout.objects.filter(run__in=[teams["red_run"], teams["blue_run"]]))
    assert not QueueEntry.objects.filter(queue=red_queue).exists()
