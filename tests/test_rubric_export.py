"""Rubric answers go out with the rows wherever labels do: the curated NeMo Gym files'
``gymweb_review.rubric`` and the SFT export's ``metadata.rubric``, each answer
``{"by", "at", "values": {field: number or choice}}``, every reviewer's, oldest first."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.models import Rollout
from rollouts.review import rubric

from .run_factories import ANSWER, finish, key, make_run

S = Rollout.Status


def rows(response) -> list[dict]:
    assert response.status_code == 200
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


@pytest.fixture
def run(db, user, django_user_model):
    run = make_run(2)
    finish(key(run, 0), S.SUCCEEDED, 1.0, output=ANSWER)
    finish(key(run, 1), S.SUCCEEDED, 0.0, output=ANSWER)
    rubric.set_rubric(rubric.parse_lines("correctness: 0..5\nstyle: poor | ok | good"), user)
    bob = django_user_model.objects.create_user(username="bob", password="x")
    rubric.save_answer(key(run, 0), user, {"correctness": "4", "style": "good"})
    rubric.save_answer(key(run, 0), bob, {"correctness": 2.5, "style": "ok"})
    return run


def test_the_curated_export_carries_every_reviewers_rubric_answers(signed_in, run):
    got = rows(signed_in.get(reverse("run_export", args=[run.pk, "rollouts"]) + "?review=1"))
    by_task = {r["_ng_task_index"]: r["gymweb_review"]["rubric"] for r in got}
    assert [(a["by"], a["values"]) for a in by_task[0]] == [
        ("alice", {"correctness": 4, "style": "good"}),
        ("bob", {"correctness": 2.5, "style": "ok"}),
    ]
    assert all(a["at"] for a in by_task[0]) and by_task[1] == []


def test_the_sft_metadata_carries_the_rubric_answers(signed_in, run):
    got = rows(signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?metadata=1"))
    meta = {r["metadata"]["task_index"]: r["metadata"] for r in got}
    assert [a["values"]["correctness"] for a in meta[0]["rubric"]] == [4, 2.5] and meta[1]["rubric"] == []


def test_without_review_the_files_carry_no_rubric(signed_in, run):
    body = b"".join(signed_in.get(reverse("run_export", args=[run.pk, "rollouts"])).streaming_content).decode()
    assert "correctness" not in body and "gymweb_review" not in body
