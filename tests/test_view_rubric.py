"""The label set's rubric: defined on the Labels page (one field a line: a score range or
choices), filled in by each reviewer in the review panel, every answer checked against it; a bad
definition or answer is refused with an error naming the rubric field, and nothing is stored."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.models import Rollout, Rubric, RubricAnswer
from rollouts.review import rubric
from rollouts.review.actions import ReviewError

from .run_factories import finish, key, make_run

S = Rollout.Status
LINES = "correctness: 0..5  # did it solve the task\nstyle: poor | ok | good\ncomment-worthy?: yes | no"


@pytest.fixture
def rollout(db):
    run = make_run(1)
    return finish(key(run, 0), S.SUCCEEDED, 1.0)


@pytest.fixture(autouse=True)
def _staff(user):
    # the rubric is every team's: only staff set it (test_only_staff_may_change_the_rubric)
    user.is_staff = True
    user.save(update_fields=["is_staff"])


def save_rubric(client, text):
    return client.post(reverse("label_rubric"), {"rubric": text})


def answer(client, rollout, **values):
    body = {f"rubric_{k.replace('_', '-')}": v for k, v in values.items()}
    return client.post(reverse("review_rubric", args=[rollout.run_id, rollout.pk]), body, HTTP_HX_REQUEST="true")


def test_the_labels_page_saves_a_rubric_of_ranges_and_choices(signed_in):
    assert save_rubric(signed_in, LINES).status_code == 302
    definition = rubric.definition_of(rubric.current())
    assert [(f.name, f.min, f.max, f.choices, f.required) for f in definition.fields] == [
        ("correctness", 0, 5, None, True),
        ("style", None, None, ["poor", "ok", "good"], True),
        ("comment-worthy", None, None, ["yes", "no"], False),
    ]
    html = signed_in.get(reverse("labels")).content.decode()
    assert "correctness: 0..5  # did it solve the task" in html and 'id="rubric-fields"' in html


@pytest.mark.parametrize(
    "text, message",
    [
        ("correctness: 5..1", "rubric field 'correctness': min (5) must be below max (1)"),
        ("style: ok | ok", "rubric field 'style': the choices must differ"),
        ("correctness: 0..5\nno colon here", "rubric line 2 ('no colon here')"),
        ("Bad Name!: 0..1", "rubric field 'Bad Name!' (name): use 1–40 lower-case letters"),
        ("a: 0..1\na: x | y", "two fields are named 'a'"),
        ("x: 0..inf", "rubric field 'x': '0..inf' is neither a range of two finite numbers"),
        ("x: 0 - 5", "rubric field 'x': '0 - 5' is neither a range"),
        ("x: yes", "rubric field 'x': 'yes' is neither a range"),
    ],
)
def test_a_bad_rubric_is_refused_naming_the_field_and_the_old_one_stays(signed_in, text, message):
    save_rubric(signed_in, "old: 0..1")
    response = save_rubric(signed_in, text)
    assert response.status_code == 400
    assert message in response.content.decode().replace("&#x27;", "'")
    assert [f.name for f in rubric.definition_of(rubric.current()).fields] == ["old"]


def test_a_json_definition_is_validated_by_its_schema():
    with pytest.raises(ReviewError, match=r"rubric field 'score' \(maximum\): Extra inputs are not permitted"):
        rubric.parse_definition({"fields": [{"name": "score", "min": 0, "maximum": 3}]})
    with pytest.raises(ReviewError, match=r"rubric field 'score': give either a score range"):
        rubric.parse_definition({"fields": [{"name": "score", "min": 0, "max": 1, "choices": ["a"]}]})
    with pytest.raises(ReviewError, match=r"rubric field 'score': give 2 to 20 choices \(one choice asks nothing\)"):
        rubric.parse_definition({"fields": [{"name": "score", "choices": ["a"]}]})
    with pytest.raises(ReviewError, match=r"rubric field 'score': a score range needs both min and max"):
        rubric.parse_definition({"fields": [{"name": "score", "min": 0}]})


def test_the_review_panel_shows_the_rubric_form_only_when_there_is_one(signed_in, rollout):
    assert 'id="review-rubric"' not in signed_in.get(rollout.get_absolute_url()).content.decode()
    save_rubric(signed_in, LINES)
    html = signed_in.get(rollout.get_absolute_url()).content.decode()
    assert 'id="review-rubric"' in html
    assert (
        'name="rubric_correctness" step="any" min="0" max="5"' in html and '<option value="good">good</option>' in html
    )


@pytest.mark.parametrize(
    "values, message",
    [
        ({"correctness": "7", "style": "ok"}, "rubric field 'correctness': 7 is outside 0..5"),
        ({"correctness": "lots", "style": "ok"}, "rubric field 'correctness': 'lots' is not a number"),
        ({"correctness": "3", "style": "great"}, "rubric field 'style': 'great' is not one of poor | ok | good"),
        ({"correctness": "3"}, "rubric field 'style': required"),
    ],
)
def test_a_bad_answer_is_refused_naming_the_field_and_nothing_is_stored(signed_in, rollout, values, message):
    save_rubric(signed_in, LINES)
    response = answer(signed_in, rollout, **values)
    assert response.status_code == 400
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not RubricAnswer.objects.exists()


def test_answers_are_kept_per_reviewer_and_shown_filled_in(signed_in, client, rollout, django_user_model):
    save_rubric(signed_in, LINES)
    response = answer(signed_in, rollout, correctness="4", style="good")
    assert response.status_code == 200 and 'value="4"' in response.content.decode()
    answer(signed_in, rollout, correctness="2.5", style="ok", comment_worthy="yes")  # replaces alice's
    bob = django_user_model.objects.create_user(username="bob", password="x")
    client.force_login(bob)
    answer(client, rollout, correctness="1", style="poor")
    got = {a.user.username: json.loads(a.values_json) for a in RubricAnswer.objects.select_related("user")}
    assert got == {
        "alice": {"correctness": 2.5, "style": "ok", "comment-worthy": "yes"},
        "bob": {"correctness": 1, "style": "poor"},
    }
    html = client.get(rollout.get_absolute_url()).content.decode()
    assert 'id="rubric-answers"' in html and "alice:" in html and "bob:" in html


def test_answers_keep_the_rubric_they_were_given_against(signed_in, rollout):
    save_rubric(signed_in, "score: 0..1")
    answer(signed_in, rollout, score="1")
    first = Rubric.objects.get()
    save_rubric(signed_in, "score: 0..10")
    assert RubricAnswer.objects.get().rubric == first and Rubric.objects.count() == 2
    signed_in.post(reverse("label_rubric"), {"clear": "1"})
    assert rubric.current() is None
    assert answer(signed_in, rollout, score="1").status_code == 400  # no rubric: nothing to answer


def test_only_staff_may_change_the_rubric_and_the_page_says_who_can(signed_in, user):
    save_rubric(signed_in, LINES)
    user.is_staff = False
    user.save(update_fields=["is_staff"])
    refused = save_rubric(signed_in, "only: 0..1")
    assert refused.status_code == 403 and "only an admin (staff) may change the rubric" in refused.content.decode()
    assert [f.name for f in rubric.definition_of(rubric.current()).fields] == ["correctness", "style", "comment-worthy"]
    cleared = signed_in.post(reverse("label_rubric"), {"clear": "1"})
    assert cleared.status_code == 403 and rubric.definition_of(rubric.current()) is not None
    page = signed_in.get(reverse("labels")).content.decode()
    assert 'id="rubric-staff-only"' in page and 'class="rubric-edit"' not in page
