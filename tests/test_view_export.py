"""Downloads: NeMo Gym's three files, streamed, optionally restricted by the rollout table's filter."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run, new_attempt

S = Rollout.Status


def _rows(response) -> list[dict]:
    assert response.streaming
    text = b"".join(response.streaming_content).decode()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _url(run, kind, query=""):
    return reverse("run_export", args=[run.pk, kind]) + (f"?{query}" if query else "")


@pytest.fixture
def run(db):
    run = make_run(4, num_repeats=2, agent_name="my_agent")
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 0, 1), S.SUCCEEDED, 0.0)
    finish(key(run, 1, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1, 1), S.FAILED, kind="agent_timeout", error="timed out after remote_responses_timeout_s=5")
    finish(new_attempt(run, 1, 1), S.FAILED, kind="agent_invalid_response", error="bad shape", terminal=True)
    finish(key(run, 2, 0), S.FAILED, kind="seed_failed")
    finish(key(run, 2, 1), S.CANCELLED)  # kill-shaped: in no file
    return run


def test_it_requires_login(client, run):
    response = client.get(_url(run, "rollouts"))
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_an_unknown_kind_is_404(signed_in, run):
    assert signed_in.get(_url(run, "secrets")).status_code == 404
    assert signed_in.get(reverse("run_export", args=[999, "rollouts"])).status_code == 404


def test_rollouts_jsonl_holds_the_successes_in_nemo_gym_s_format(signed_in, run):
    response = signed_in.get(_url(run, "rollouts"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/jsonl")
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}_rollouts.jsonl"'
    rows = _rows(response)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in rows] == [
        (0, 0, 1.0),
        (0, 1, 0.0),
        (1, 0, 1.0),
    ]
    for row in rows:
        assert row["agent_ref"] == {"name": "my_agent"}
        assert "responses_create_params" in row and "response" in row


def test_the_failures_sidecar_has_one_row_per_failed_attempt(signed_in, run):
    response = signed_in.get(_url(run, "rollouts_failures"))
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}_rollouts_failures.jsonl"'
    rows = _rows(response)
    # NeMo Gym's row: gymweb's finer failure kind stays in the database, not in the file.
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [(1, 1), (1, 1), (2, 0)]
    assert all(
        "_gymweb_failure_kind" not in r and r["failure_kind"] is None and r["mask_sample"] is False for r in rows
    )
    for row in rows:
        assert row["reward"] == 0.0 and row["_ng_failure_class"] == "remote_agent_error"
        assert row["error"] and row["response"]["object"] == "response" and row["agent_ref"] == {"name": "my_agent"}
    assert [r.get("_ng_failure_terminal", False) for r in rows] == [False, True, False]


def test_materialized_inputs_list_every_key_once(signed_in, run):
    rows = _rows(signed_in.get(_url(run, "rollouts_materialized_inputs")))
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [(t, i) for t in range(4) for i in range(2)]
    assert all("reward" not in r for r in rows)


def test_the_table_filter_restricts_the_export(signed_in, run):
    assert [r["_ng_task_index"] for r in _rows(signed_in.get(_url(run, "rollouts", "reward_min=1")))] == [0, 1]
    assert [r["_ng_task_index"] for r in _rows(signed_in.get(_url(run, "rollouts", "task=0")))] == [0, 0]
    failures = _rows(signed_in.get(_url(run, "rollouts_failures", "kind=seed_failed")))
    assert [r["_ng_task_index"] for r in failures] == [2]
    assert _rows(signed_in.get(_url(run, "rollouts", "status=failed"))) == []


def test_the_run_page_offers_the_filtered_download(signed_in, run):
    body = signed_in.get(reverse("run", args=[run.pk]) + "?reward_min=1").content.decode()
    assert _url(run, "rollouts", "reward_min=1.0") in body


@pytest.mark.django_db(transaction=True)
def test_a_real_run_exports_rows_that_read_like_nemo_gym_s(
    client, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path
):
    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl
    from rollouts.workers.process import run_in_process

    client.force_login(django_user_model.objects.create_user("dave", password="x" * 12))
    with open(counter_tasks_path, "rb") as fh:
        run = runs.create_run(read_jsonl(fh), name="counter", agent_url=counter_agent_url, env_url=counter_env_url)
    runs.launch(run)
    run_in_process(run.pk)
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    rows = _rows(client.get(_url(run, "rollouts")))
    assert len(rows) == 5 and all(r["reward"] == 1.0 for r in rows)
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2, 3, 4]
    for row in rows:
        assert row["agent_ref"] == {"name": "remote_agent"} and row["_ng_rollout_index"] == 0
        kinds = [item["type"] for item in row["response"]["output"]]
        assert kinds[0] == "function_call" and kinds[-1] == "message" and "function_call_output" in kinds
    assert _rows(client.get(_url(run, "rollouts_failures"))) == []
