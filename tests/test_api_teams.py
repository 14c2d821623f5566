"""The API puts a new run or dataset in the token user's team; a user in several teams names one
with ``team`` (a team of theirs: another team's id is refused with 400 and nothing is stored)."""

from __future__ import annotations

import io
import json

import pytest

from rollouts.models import Dataset, Run, Team
from rollouts.tokens import create_token

from .conftest import COUNTER_TASKS

API = "/api/v1"
AGENT, ENV = "http://127.0.0.1:9102", "http://127.0.0.1:9101"


@pytest.fixture
def teams(db, django_user_model):
    red, blue, green = (Team.objects.create(name=n) for n in ("red", "blue", "green"))
    alice = django_user_model.objects.create_user(username="alice", password="x")
    red.members.add(alice)
    blue.members.add(alice)
    _row, token = create_token(alice, "t")
    return {"red": red, "blue": blue, "green": green, "auth": {"HTTP_AUTHORIZATION": f"Bearer {token}"}}


def rows(n: int = 2) -> list[dict]:
    return [json.loads(line) for line in COUNTER_TASKS.read_text().splitlines() if line.strip()][:n]


def post_run(client, teams, **extra):
    body = {"rows": rows(), "agent_url": AGENT, "env_url": ENV, **extra}
    return client.post(f"{API}/runs", data=json.dumps(body), content_type="application/json", **teams["auth"])


def test_a_run_goes_to_the_users_first_team_or_the_one_named(client, teams):
    first = post_run(client, teams)
    assert first.status_code == 201, first.content
    run = Run.objects.get(pk=first.json()["id"])
    assert run.team == teams["red"] and run.dataset.team == teams["red"]
    named = post_run(client, teams, team=teams["blue"].pk)
    assert named.status_code == 201, named.content
    run = Run.objects.get(pk=named.json()["id"])
    assert run.team == teams["blue"] and run.dataset.team == teams["blue"]


def test_a_team_the_user_is_not_in_is_refused_and_nothing_is_stored(client, teams):
    response = post_run(client, teams, team=teams["green"].pk)
    assert response.status_code == 400 and "team" in response.json()["errors"]
    yours = f"yours: {teams['red'].pk} (red), {teams['blue'].pk} (blue)"
    assert response.json()["detail"] == f"team: team {teams['green'].pk}: not one of your teams; {yours}"
    assert not Run.objects.exists() and not Dataset.objects.exists()


def test_a_user_of_one_team_naming_another_is_refused_not_ignored(client, teams, django_user_model):
    bob = django_user_model.objects.create_user(username="bob", password="x")
    teams["green"].members.add(bob)
    _row, token = create_token(bob, "t")
    body = {"rows": rows(), "agent_url": AGENT, "env_url": ENV, "team": teams["red"].pk}
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.post(f"{API}/runs", data=json.dumps(body), content_type="application/json", **auth)
    assert response.status_code == 400 and "team" in response.json()["errors"]
    assert response.json()["detail"].endswith(f"not one of your teams; yours: {teams['green'].pk} (green)")
    assert not Run.objects.exists()
    body["team"] = teams["green"].pk  # their own team, named: taken
    ok = client.post(f"{API}/runs", data=json.dumps(body), content_type="application/json", **auth)
    assert ok.status_code == 201 and Run.objects.get().team == teams["green"]


def test_a_dataset_upload_goes_to_the_named_team_and_another_teams_is_refused(client, teams):
    def upload(**form):
        f = io.BytesIO(COUNTER_TASKS.read_bytes())
        f.name = "tasks.jsonl"
        return client.post(f"{API}/datasets", {"file": f, **form}, **teams["auth"])

    response = upload(team=teams["blue"].pk)
    assert response.status_code == 201, response.content
    assert Dataset.objects.get(pk=response.json()["id"]).team == teams["blue"]
    refused = upload(team=teams["green"].pk)
    assert refused.status_code == 400 and "team" in refused.json()["errors"]
    assert f"yours: {teams['red'].pk} (red), {teams['blue'].pk} (blue)" in refused.json()["detail"]
    assert Dataset.objects.count() == 1


def test_a_dataset_upload_with_an_empty_team_field_goes_to_the_users_first_team(client, teams):
    # Swagger UI's Try it out sends `team=` when its box is left empty: that is "not given".
    f = io.BytesIO(COUNTER_TASKS.read_bytes())
    f.name = "tasks.jsonl"
    response = client.post(f"{API}/datasets", {"file": f, "team": ""}, **teams["auth"])
    assert response.status_code == 201, response.content
    assert Dataset.objects.get(pk=response.json()["id"]).team == teams["red"]


def test_the_openapi_document_prefills_no_team_0_and_no_placeholder_override(client, teams):
    doc = client.get(f"{API}/openapi.json").json()
    upload = doc["paths"][f"{API}/datasets"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    team = upload["properties"]["team"]
    assert team["examples"] == [""] and "team" not in upload.get("required", [])
    launch = doc["paths"][f"{API}/runs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert launch["properties"]["overrides"]["examples"] == [{"temperature": 0.7}]
