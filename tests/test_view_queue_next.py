""" "Next unreviewed" in a review queue: the user's own entries first, then an unassigned one (now
theirs); reviewed entries and other people's assigned ones are skipped. The rollout opens with the
queue's context, so the review panel's "reviewed · next" (j) steps through the queue across runs,
and a label given there counts the entry as reviewed."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.models import QueueEntry, Rollout
from rollouts.review import queues

from .run_factories import finish, key, make_run

S = Rollout.Status


@pytest.fixture
def setup(db, user, django_user_model):
    first, second = make_run(2, name="first"), make_run(2, name="second")
    for run in (first, second):
        for t in range(2):
            finish(key(run, t), S.SUCCEEDED, 1.0)
    bob = django_user_model.objects.create_user(username="bob", password="x")
    queue = queues.create_queue("q", user)
    ordered = [key(first, 0), key(first, 1), key(second, 0), key(second, 1)]
    for rollout in ordered:
        queues.add_rollouts(queue, Rollout.objects.filter(pk=rollout.pk), user)
    return {"queue": queue, "rollouts": ordered, "bob": bob}


def next_(client, queue, done=None):
    return client.post(reverse("queue_next", args=[queue.pk]), {"rollout": done.pk} if done else {})


def entry(queue, rollout) -> QueueEntry:
    return QueueEntry.objects.get(queue=queue, rollout=rollout)


def test_next_skips_reviewed_and_other_peoples_assigned_entries(signed_in, user, setup):
    queue, (a, b, c, d), bob = setup["queue"], setup["rollouts"], setup["bob"]
    queues.mark_reviewed(queue, a, bob)  # reviewed
    queues.assign(queue, bob, [entry(queue, b).pk])  # bob's
    queues.assign(queue, user, [entry(queue, d).pk])  # mine: before the unassigned c
    response = next_(signed_in, queue)
    assert response["Location"] == queues.rollout_url(queue.pk, d)
    queues.mark_reviewed(queue, d, user)
    response = next_(signed_in, queue)
    assert response["Location"] == queues.rollout_url(queue.pk, c)
    assert entry(queue, c).assigned_to == user  # handed out: now mine, never also bob's
    queues.mark_reviewed(queue, c, user)
    response = next_(signed_in, queue)
    assert response["Location"] == queue.get_absolute_url()  # b is bob's: nothing left for me
    assert "the rest is assigned to others" in signed_in.get(response["Location"]).content.decode()
    assert entry(queue, b).reviewed_at is None and entry(queue, b).assigned_to == bob


def test_an_unassigned_entry_is_handed_to_one_reviewer_only(setup, user):
    queue, bob = setup["queue"], setup["bob"]
    mine, his = queues.next_entry(queue, user), queues.next_entry(queue, bob)
    assert mine.rollout_id != his.rollout_id
    assert queues.next_entry(queue, user).pk == mine.pk  # still mine until reviewed


def test_reviewed_next_marks_the_entry_and_opens_the_next_across_runs(signed_in, user, setup):
    queue, (a, b, c, _d) = setup["queue"], setup["rollouts"]
    queues.mark_reviewed(queue, a, user)
    page = signed_in.get(queues.rollout_url(queue.pk, b)).content.decode()
    assert 'data-review-mode="1"' in page and 'id="queue-bar"' in page
    assert 'id="review-progress">1 of 4 reviewed<' in page
    assert f'action="{reverse("queue_next", args=[queue.pk])}"' in page and 'data-review="prev"' in page
    response = next_(signed_in, queue, done=b)
    assert entry(queue, b).reviewed_by == user and entry(queue, b).reviewed_at is not None
    assert response["Location"] == queues.rollout_url(queue.pk, c)  # the second run's rollout
    page = signed_in.get(response["Location"]).content.decode()
    assert 'id="review-progress">2 of 4 reviewed<' in page and "second" in page


def test_a_label_given_in_the_queue_counts_the_entry_as_reviewed(signed_in, user, setup):
    queue, (a, *_rest) = setup["queue"], setup["rollouts"]
    response = signed_in.post(
        reverse("review_label", args=[a.run_id, a.pk]),
        {"label_name": "good", "queue": queue.pk, "next": queues.rollout_url(queue.pk, a)},
        HTTP_HX_REQUEST="true",
    )
    html = response.content.decode()
    assert response.status_code == 200 and 'id="queue-bar"' in html and 'name="queue" value="%d"' % queue.pk in html
    assert entry(queue, a).reviewed_by == user


def test_the_queue_param_of_another_teams_queue_gives_no_queue_context(signed_in, setup, django_user_model):
    from rollouts.models import ReviewQueue, Team

    other = ReviewQueue.objects.create(name="theirs", team=Team.objects.create(name="blue"))
    a = setup["rollouts"][0]
    page = signed_in.get(queues.rollout_url(other.pk, a)).content.decode()
    assert 'id="queue-bar"' not in page and "theirs" not in page
