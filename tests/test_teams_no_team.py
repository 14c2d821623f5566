"""A signed-in user in no team (or a token of one team whose user has left it) cannot make a run,
dataset or queue: it would land in the ``default`` team, out of their sight and in other people's.
A 400 says so and nothing is stored; a superuser's rows still go to ``default``."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from rollouts.models import Dataset, ReviewQueue, Run, Team
from rollouts.tokens import create_token

from .conftest import COUNTER_TASKS
from .test_view_run_new import URL, _data

API = "/api/v1"
AGENT, ENV = "http://127.0.0.1:9102", "http://127.0.0.1:9101"


@pytest.fixture
def dave(db, django_user_model):
    Team.objects.create(name="vision")  # several teams: a new user joins none
    user = django_user_model.objects.create_user(username="dave", password="x")
    assert not user.teams.exists()
    return user


def _auth(user, **kw):
    return {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 't', **kw)[1]}"}


def _rows() -> list[dict]:
    return [json.loads(line) for line in COUNTER_TASKS.read_text().splitlines() if line.strip()][:2]


def _everything_refused(client, auth):
    body = {"rows": _rows(), "agent_url": AGENT, "env_url": ENV}
    run = client.post(f"{API}/runs", data=json.dumps(body), content_type="application/json", **auth)
    assert run.status_code == 400 and "you are in no team" in run.json()["detail"], run.content
    upload = io.BytesIO(COUNTER_TASKS.read_bytes())
    upload.name = "tasks.jsonl"
    dataset = client.post(f"{API}/datasets", {"file": upload}, **auth)
    assert dataset.status_code == 400 and "you are in no team" in dataset.json()["detail"], dataset.content
    queue = client.post(f"{API}/queues", data='{"name": "z"}', content_type="application/json", **auth)
    assert queue.status_code == 400 and "you are in no team" in queue.json()["detail"], queue.content
    assert not (Run.objects.exists() or Dataset.objects.exists() or ReviewQueue.objects.exists())


def test_a_user_in_no_team_is_refused_and_nothing_is_stored(client, dave):
    _everything_refused(client, _auth(dave))


def test_a_token_of_a_team_its_user_has_left_is_refused(client, dave):
    vision = Team.objects.get(name="vision")
    vision.members.add(dave)
    auth = _auth(dave, team=vision)
    call_command("team", "member", "remove", "vision", "dave", stdout=io.StringIO())
    _everything_refused(client, auth)


def test_the_new_run_page_says_so(client, dave):
    client.force_login(dave)
    response = client.post(URL, _data())
    assert response.status_code in (200, 400) and "you are in no team" in response.content.decode()
    assert not Run.objects.exists()


def test_a_superusers_rows_still_go_to_the_default_team(client, db, django_user_model):
    Team.objects.create(name="vision")
    root = django_user_model.objects.create_superuser(username="root", password="x")
    body = {"rows": _rows(), "agent_url": AGENT, "env_url": ENV}
    response = client.post(f"{API}/runs", data=json.dumps(body), content_type="application/json", **_auth(root))
    assert response.status_code == 201, response.content
    assert Run.objects.get().team.name == "default"
