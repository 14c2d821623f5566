"""The API's review queues and rubric: list, create, add rollouts (by id or a run's filtered
list), next unreviewed, progress; the rubric and its answers, validated with the field named; and
another team's queue is 404. All in the OpenAPI document."""

from __future__ import annotations

import json

import pytest

from rollouts.models import QueueEntry, ReviewQueue, Rollout, RubricAnswer, Team
from rollouts.review import queues
from rollouts.tokens import create_token

from .run_factories import finish, key, make_run

API = "/api/v1"
S = Rollout.Status


@pytest.fixture
def api(client, user):
    token = create_token(user, "tests")[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    class Api:
        def get(self, url):
            return client.get(API + url, **auth)

        def send(self, method, url, body=None):
            data = json.dumps(body) if body is not None else ""
            return getattr(client, method)(API + url, data, content_type="application/json", **auth)

    return Api()


@pytest.fixture
def runs(db):
    first, second = make_run(3, name="first"), make_run(2, name="second")
    for t, reward in enumerate([1.0, 0.0, 1.0]):
        finish(key(first, t), S.SUCCEEDED, reward)
    for t in range(2):
        finish(key(second, t), S.SUCCEEDED, 1.0)
    return first, second


def test_create_list_add_next_and_progress(api, user, runs):
    first, second = runs
    made = api.send("post", "/queues", {"name": "to check"})
    assert made.status_code == 201 and made.json()["team"] == "default"
    qid = made.json()["id"]
    added = api.send("post", f"/queues/{qid}/rollouts", {"run": first.pk, "filter": "reward_min=1"})
    assert added.json() == {"added": 2, "already": 0}
    added = api.send("post", f"/queues/{qid}/rollouts", {"rollouts": [key(second, 1).pk, key(first, 0).pk]})
    assert added.json() == {"added": 1, "already": 1}
    assert [(q["name"], q["reviewed"], q["total"]) for q in api.get("/queues").json()] == [("to check", 0, 3)]
    step = api.send("post", f"/queues/{qid}/next").json()
    assert step["rollout"] == key(first, 0).pk and step["left"] == 3 and step["url"].endswith(f"?queue={qid}")
    step = api.send("post", f"/queues/{qid}/next", {"done": key(first, 0).pk}).json()
    assert step["rollout"] == key(first, 2).pk and step["left"] == 2
    progress = api.get(f"/queues/{qid}/progress").json()
    assert progress == {
        "reviewed": 1,
        "total": 3,
        "assignees": [{"user": "alice", "reviewed": 1, "total": 2}, {"user": None, "reviewed": 0, "total": 1}],
    }


def test_bad_adds_are_400_naming_the_field_and_add_nothing(api, runs):
    first, _ = runs
    qid = api.send("post", "/queues", {"name": "q"}).json()["id"]
    both = api.send("post", f"/queues/{qid}/rollouts", {"run": first.pk, "rollouts": [1]})
    assert both.status_code == 400 and "rollouts" in both.json()["errors"]
    bad = api.send("post", f"/queues/{qid}/rollouts", {"run": first.pk, "filter": "reward_min=lots"})
    assert bad.status_code == 400 and "reward_min" in bad.json()["errors"]
    missing = api.send("post", f"/queues/{qid}/rollouts", {"rollouts": [key(first, 0).pk, 99999]})
    assert missing.status_code == 400 and "99999" in missing.json()["detail"]
    assert not QueueEntry.objects.exists()


def test_another_teams_queue_is_404(api, user, db):
    blue = Team.objects.create(name="blue")
    theirs = ReviewQueue.objects.create(name="blue secrets", team=blue)
    assert api.get(f"/queues/{theirs.pk}/progress").status_code == 404
    assert api.send("post", f"/queues/{theirs.pk}/next").status_code == 404
    assert api.send("post", f"/queues/{theirs.pk}/rollouts", {"rollouts": [1]}).status_code == 404
    assert "blue secrets" not in api.get("/queues").content.decode()
    assert api.send("post", "/queues", {"name": "x", "team": blue.pk}).status_code == 400


def test_next_gives_nothing_once_the_rest_is_someone_elses(api, user, runs, django_user_model):
    first, _ = runs
    bob = django_user_model.objects.create_user(username="bob", password="x")
    queue = queues.create_queue("q", user)
    queues.add_rollouts(queue, Rollout.objects.filter(pk=key(first, 0).pk))
    queues.assign(queue, bob)
    assert api.send("post", f"/queues/{queue.pk}/next").json() == {
        "entry": None,
        "rollout": None,
        "run": None,
        "url": None,
        "left": 1,
    }


def test_only_staff_may_set_the_rubric_through_the_api(api, user):
    refused = api.send("put", "/rubric", {"fields": [{"name": "x", "min": 0, "max": 1}]})
    assert refused.status_code == 403 and "only an admin (staff)" in refused.json()["detail"]
    assert api.get("/rubric").json() == {"fields": []}


def test_the_rubric_and_its_answers(api, runs, user):
    first, _ = runs
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    fields = [{"name": "correctness", "min": 0, "max": 5}, {"name": "style", "choices": ["poor", "good"]}]
    assert api.send("put", "/rubric", {"fields": fields}).status_code == 200
    assert [f["name"] for f in api.get("/rubric").json()["fields"]] == ["correctness", "style"]
    bad = api.send("put", "/rubric", {"fields": [{"name": "x", "min": 3, "max": 1}]})
    assert bad.status_code == 400 and bad.json()["detail"] == "rubric field 'x': min (3) must be below max (1)"
    url = f"/rollouts/{key(first, 0).pk}/rubric"
    wrong = api.send("put", url, {"values": {"correctness": 9, "style": "good"}})
    assert wrong.status_code == 400 and wrong.json()["errors"] == {
        "correctness": ["rubric field 'correctness': 9 is outside 0..5"]
    }
    unknown = api.send("put", url, {"values": {"correctness": 1, "style": "good", "tone": "calm"}})
    assert unknown.status_code == 400 and "tone" in unknown.json()["errors"]
    assert not RubricAnswer.objects.exists()
    ok = api.send("put", url, {"values": {"correctness": 4, "style": "good"}})
    assert (
        ok.status_code == 200
        and ok.json()["values"] == {"correctness": 4, "style": "good"}
        and ok.json()["by"] == "alice"
    )


def test_the_openapi_document_lists_the_queue_and_rubric_routes(client, db):
    paths = client.get(f"{API}/openapi.json").json()["paths"]
    for path in (
        "/api/v1/queues",
        "/api/v1/queues/{queue_id}/rollouts",
        "/api/v1/queues/{queue_id}/next",
        "/api/v1/queues/{queue_id}/progress",
        "/api/v1/rubric",
        "/api/v1/rollouts/{rollout_id}/rubric",
    ):
        assert path in paths, path
    assert "404" in paths["/api/v1/queues/{queue_id}/next"]["post"]["responses"]
    assert paths["/api/v1/queues"]["get"]["operationId"] == "rollouts_review_api_list_queues"


def test_ids_past_64_bits_are_refused_as_input_not_a_server_error(api, runs):
    first, _ = runs
    queue = ReviewQueue.objects.create(name="q", team=first.team)
    assert api.send("post", f"/queues/{queue.pk}/rollouts", {"rollouts": [2**63]}).status_code in (400, 422)
    assert api.send("post", f"/queues/{queue.pk}/next", {"done": 2**63}).status_code in (400, 422)
    assert not QueueEntry.objects.exists()


def test_an_unknown_filter_name_is_refused_not_read_as_the_whole_run(api, runs):
    first, _ = runs
    queue = ReviewQueue.objects.create(name="q", team=first.team)
    response = api.send("post", f"/queues/{queue.pk}/rollouts", {"run": first.pk, "filter": "reward_mn=1"})
    assert response.status_code == 400 and "unknown filter 'reward_mn'" in response.json()["detail"]
    assert not QueueEntry.objects.exists()
    ok = api.send("post", f"/queues/{queue.pk}/rollouts", {"run": first.pk, "filter": "reward_min=1&cols=task.x"})
    assert ok.status_code == 200, ok.json()
