"""Add to queue: a run's filtered table links its list to the add page, which says how many
rollouts the list holds and adds them, in order, to a queue of the run's team or a new one; the
same rollout never twice, and rollouts of several runs end up in one queue."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.models import QueueEntry, ReviewQueue, Rollout

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


def add(client, run, queue=None, new="", query=""):
    body = {"new_queue": new} if new else {"queue": queue.pk}
    return client.post(reverse("queue_add", args=[run.pk]) + (f"?{query}" if query else ""), {**body, **_q(query)})


def _q(query: str) -> dict:
    return dict(p.split("=", 1) for p in query.split("&")) if query else {}


def test_the_run_table_links_its_filtered_list_to_add_to_queue(signed_in, two_runs):
    first, _ = two_runs
    html = signed_in.get(first.get_absolute_url() + "?reward_min=1").content.decode()
    assert f'href="{reverse("queue_add", args=[first.pk])}?reward_min=1.0' in html


def test_add_to_queue_takes_the_filtered_list_of_several_runs(signed_in, two_runs):
    first, second = two_runs
    page = signed_in.get(reverse("queue_add", args=[first.pk]) + "?reward_min=1")
    assert 'id="queue-add-count">2 rollouts<' in page.content.decode()
    response = add(signed_in, first, new="mixed", query="reward_min=1")
    queue = ReviewQueue.objects.get(name="mixed")
    assert response["Location"] == queue.get_absolute_url()
    add(signed_in, second, queue)
    add(signed_in, first, queue, query="reward_min=1")  # again: nothing twice
    got = list(QueueEntry.objects.filter(queue=queue).values_list("rollout_id", flat=True))
    assert got == [key(first, 0).pk, key(first, 2).pk, key(second, 0).pk, key(second, 1).pk, key(second, 2).pk]


def test_add_without_a_queue_says_so_and_adds_nothing(signed_in, two_runs):
    first, _ = two_runs
    response = signed_in.post(reverse("queue_add", args=[first.pk]), {"queue": ""})
    assert response.status_code == 400 and "choose a queue, or name a new one" in response.content.decode()
    assert not QueueEntry.objects.exists()


def test_a_refused_add_leaves_no_new_empty_queue(signed_in, two_runs, monkeypatch):
    first, _ = two_runs
    monkeypatch.setattr("rollouts.review.queues.MAX_ADD", 2)
    response = add(signed_in, first, new="too big")
    assert response.status_code == 400 and "more than 2 rollouts" in response.content.decode()
    assert not ReviewQueue.objects.filter(name="too big").exists()


def test_a_queue_id_past_64_bits_is_no_queue(signed_in, two_runs):
    first, _ = two_runs
    response = signed_in.post(reverse("queue_add", args=[first.pk]), {"queue": str(2**63)})
    assert response.status_code == 400 and "choose a queue" in response.content.decode()
