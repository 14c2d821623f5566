"""Every list and stream route of the API answers a bad query parameter with a 400 whose body is the
API's error shape (``detail`` naming the parameter and why, ``errors`` per parameter), never
django-ninja's 422 nor a silent clamp; and the OpenAPI document declares those answers and the
``f.<field>`` filters."""

from __future__ import annotations

import pytest

from rollouts.tokens import create_token

from .run_factories import make_run

API = "/api/v1"


@pytest.fixture
def get(client, user):
    _row, token = create_token(user, "t")
    return lambda url: client.get(API + url, HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, name, words",
    [
        ("/runs/{run}/rollouts?offset=-5", "offset", "must be at least 0"),
        ("/runs/{run}/rollouts?limit=0", "limit", "must be at least 1"),
        ("/runs/{run}/rollouts?limit=-1", "limit", "must be at least 1"),
        ("/runs/{run}/rollouts?reward_min=abc", "reward_min", "valid number"),
        ("/runs/{run}/rollouts?task=x", "task", "valid integer"),
        ("/runs/{run}/rollouts?f.verify.score=1..0", "f.verify.score", "the low end 1 is above the high end 0"),
        ("/runs/{run}/rollouts?f.bogus=1", "f.bogus", "is not a field"),
        ("/runs/{run}/rollouts?f.=1", "f.", "is not a field"),
        ("/runs?limit=0", "limit", "must be at least 1"),
        ("/runs?offset=-1", "offset", "must be at least 0"),
        ("/datasets?limit=-1", "limit", "must be at least 1"),
        ("/datasets?offset=-5", "offset", "must be at least 0"),
        ("/runs/{run}/results?after=-1", "after", "must be at least 0"),
        ("/runs/{run}/results?wait=maybe", "wait", "valid boolean"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it_and_why(get, url, name, words):
    run = make_run()
    response = get(url.format(run=run.pk))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["detail"].startswith(f"{name}: ") and words in body["detail"]
    assert list(body["errors"]) == [name] and words in body["errors"][name][0]


@pytest.mark.django_db
def test_limit_and_offset_in_range_are_answered_as_asked(get):
    run = make_run(3)
    page = get(f"/runs/{run.pk}/rollouts?limit=1&offset=2").json()
    assert (page["limit"], page["offset"], len(page["items"])) == (1, 2, 1)
    assert len(get("/runs?limit=1000").json()) == 1


@pytest.mark.django_db
def test_a_limit_past_the_largest_page_answers_a_full_page_and_says_its_size(get):
    run = make_run(3)
    page = get(f"/runs/{run.pk}/rollouts?limit=5000").json()
    assert (page["limit"], len(page["items"])) == (1000, 3)
    assert len(get("/runs?limit=100000").json()) == 1
    assert get("/datasets?limit=100000").status_code == 200


@pytest.mark.django_db
def test_the_openapi_document_declares_the_error_answers_and_the_field_filters(client):
    schema = client.get(f"{API}/openapi.json").json()
    paths = schema["paths"]
    rollouts = paths["/api/v1/runs/{run_id}/rollouts"]["get"]
    for code in ("400", "401", "404"):
        assert rollouts["responses"][code]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }, code
    assert "limit" in rollouts["responses"]["400"]["description"]
    names = {p["name"]: p for p in rollouts["parameters"]}
    assert names["limit"]["schema"]["minimum"] == 1 and "more than 1000 gives 1000" in names["limit"]["description"]
    pattern = names["f.<field>"]
    assert pattern["schema"]["type"] == "object" and "f.verify.score=0.5..1" in pattern["description"]
    assert "f.<field>" in {p["name"] for p in paths["/api/v1/runs/{run_id}/rollouts.jsonl"]["get"]["parameters"]}
    assert "400" in paths["/api/v1/runs/{run_id}/results"]["get"]["responses"]
    assert "400" in paths["/api/v1/runs"]["get"]["responses"] and "400" in paths["/api/v1/datasets"]["get"]["responses"]
    for path, ops in paths.items():
        for method, op in ops.items():
            if method in ("post", "put", "patch", "delete"):
                assert "403" in op["responses"] and "401" in op["responses"], (method, path)
    assert set(schema["components"]["schemas"]["Error"]["properties"]) >= {"detail", "errors"}
