"""The run table shows a corrected reward with the env's beside it, and ``reward_source=corrected``
makes the reward bounds and the reward sort read the corrected reward where one is in force (the
env's elsewhere), alike in the table, the downloads and the API."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from rollouts.models import Rollout
from rollouts.review import actions
from rollouts.tokens import create_token

from .run_factories import ANSWER, finish, key, make_run

S = Rollout.Status


@pytest.fixture
def run(db, user):
    run = make_run(4)
    for task, reward in ((0, 1.0), (1, 0.0), (2, 0.8), (3, 0.2)):
        finish(key(run, task), S.SUCCEEDED, reward, output=ANSWER)
    actions.correct_reward(key(run, 0), 0.5, "half right", user)
    actions.correct_reward(key(run, 3), 0.9, "the verifier missed it", user)
    return run


def table_tasks(client, run, query="") -> list[int]:
    response = client.get(reverse("run", args=[run.pk]) + (f"?{query}" if query else ""))
    assert response.status_code == 200
    return [int(t) for t in re.findall(r'class="rollout-link mono" href="[^"]*">(\d+):0<', response.content.decode())]


def export_tasks(client, run, query) -> list[int]:
    response = client.get(reverse("run_export", args=[run.pk, "rollouts"]) + f"?{query}")
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()
    return [json.loads(line)["_ng_task_index"] for line in body.splitlines()]


def api_tasks(client, user, run, query) -> list[int]:
    token = create_token(user, "tests")[1]
    response = client.get(f"/api/v1/runs/{run.pk}/rollouts?{query}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content[:300]
    return [r["task_index"] for r in response.json()["items"]]


def test_the_table_shows_the_corrected_reward_with_the_env_s_beside_it(signed_in, run):
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    row0 = html[html.index(">0:0<") : html.index(">1:0<")]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", row0))
    assert "0.5000 (env 1.0000)" in text
    row2 = html[html.index(">2:0<") : html.index(">3:0<")]
    assert "(env" not in row2 and "0.8000" in row2  # no correction: the env's reward alone


def test_corrected_rewards_sort_the_table(signed_in, run):
    assert table_tasks(signed_in, run, "sort=reward") == [1, 3, 2, 0]
    assert table_tasks(signed_in, run, "sort=reward&reward_source=corrected") == [1, 0, 2, 3]
    assert table_tasks(signed_in, run, "sort=-reward&reward_source=corrected") == [3, 2, 0, 1]
    html = signed_in.get(reverse("run", args=[run.pk]) + "?sort=reward&reward_source=corrected").content.decode()
    assert "reward (corrected)" in html  # the column head says which reward sorts it


def test_corrected_rewards_filter_the_table_the_downloads_and_the_api_alike(signed_in, user, run):
    env = "reward_min=0.6&sort=-reward"
    corrected = env + "&reward_source=corrected"
    assert table_tasks(signed_in, run, env) == [0, 2]
    assert table_tasks(signed_in, run, corrected) == [3, 2]
    assert sorted(export_tasks(signed_in, run, corrected)) == [2, 3]
    assert api_tasks(signed_in, user, run, corrected) == [3, 2]
    assert api_tasks(signed_in, user, run, env) == [0, 2]


def test_reward_bounds_never_match_a_failed_rollout_s_placeholder_zero(signed_in, user, run):
    failed = make_run(2)
    finish(key(failed, 0), S.FAILED, kind="agent_http_error")
    finish(key(failed, 1), S.SUCCEEDED, 0.0, output=ANSWER)
    for source in ("", "&reward_source=corrected"):
        assert table_tasks(signed_in, failed, "reward_max=0" + source) == [1]
        assert api_tasks(signed_in, user, failed, "reward_max=0" + source) == [1]
        assert export_tasks(signed_in, failed, "reward_max=0" + source) == [1]
