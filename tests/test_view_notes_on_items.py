"""A note on a trajectory item shows on that item (escaped, with its author and time, and a
delete button for its author or a staff user), a note can be added from the item itself, and the
page still reads all of the rollout's notes in one query."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from rollouts.models import Note
from rollouts.review import actions

from .test_view_rollout_detail import make_rollout, make_run, make_task, msg, page

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def rollout(db):
    run = make_run()
    items = [(i, msg(f"reply number {i}"), {}) for i in range(6)]
    return make_rollout(run, make_task(run), calls=[{} for _ in range(6)], items=items)


def notes_block(html: str, seq: int) -> str:
    """The notes block rendered under item ``#seq``."""
    found = re.search(rf'<div class="item-notes" data-item="{seq}">(.*?)\n</div>', html, re.S)
    return found.group(1) if found else ""


def test_a_note_on_item_3_shows_on_item_3_and_not_on_item_2(signed_in, user, rollout):
    actions.add_note(rollout, "the agent gave up here", user, item=3)
    actions.add_note(rollout, "a note on the whole rollout", user)
    html = page(signed_in, rollout)
    assert "the agent gave up here" in notes_block(html, 3) and "alice" in notes_block(html, 3)
    assert "the agent gave up here" not in notes_block(html, 2)
    assert "a note on the whole rollout" not in "".join(notes_block(html, i) for i in range(6))


def test_a_note_s_markup_is_escaped_on_its_item(signed_in, user, rollout):
    actions.add_note(rollout, XSS, user, item=1)
    block = notes_block(page(signed_in, rollout), 1)
    assert "<script>" not in block and "<img" not in block and "&lt;script&gt;" in block


def test_only_the_author_or_staff_see_a_delete_button_on_the_item(client, django_user_model, user, rollout):
    note = actions.add_note(rollout, "mine", user, item=2)
    delete = reverse("review_note_delete", args=[rollout.run_id, rollout.pk, note.pk])
    bob = django_user_model.objects.create_user(username="bob", password="x")
    boss = django_user_model.objects.create_user(username="boss", password="x", is_staff=True)
    for who, sees in ((user, True), (bob, False), (boss, True)):
        client.force_login(who)
        assert (delete in notes_block(page(client, rollout), 2)) is sees, who.username
    client.force_login(bob)
    assert client.post(delete, {"next": rollout.get_absolute_url()}).status_code == 302
    assert Note.objects.filter(pk=note.pk).exists()  # refused: bob is not the author
    client.force_login(boss)
    client.post(delete, {"next": rollout.get_absolute_url()})
    assert not Note.objects.filter(pk=note.pk).exists()


def test_the_item_s_own_form_adds_a_note_on_that_item(signed_in, user, rollout):
    # one form per page (review.js copies it under the item whose "note on this item" was pressed)
    html = page(signed_in, rollout)
    form = re.search(r'<template id="item-note-form">.*?</template>', html, re.S)
    assert form and 'name="item"' in form.group(0) and 'name="note"' in form.group(0)
    response = signed_in.post(
        reverse("review_note", args=[rollout.run_id, rollout.pk]),
        {"note": "look at this reply", "item": "4", "next": rollout.get_absolute_url()},
    )
    assert response.status_code == 302
    assert Note.objects.get(rollout=rollout).item_seq == 4
    assert "look at this reply" in notes_block(page(signed_in, rollout), 4)


def test_notes_on_many_items_cost_no_extra_query(signed_in, user, rollout, django_assert_max_num_queries):
    for seq in range(6):
        actions.add_note(rollout, f"note {seq}", user, item=seq)
    # as tests/test_view_rollout_detail.py's ceiling: the notes are the review panel's one query
    with django_assert_max_num_queries(14):
        html = page(signed_in, rollout)
    assert all(f"note {seq}" in notes_block(html, seq) for seq in range(6))
