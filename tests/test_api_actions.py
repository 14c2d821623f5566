"""Every API action with a valid token: upload a dataset, launch a run (validated like the new-run
form), read status and aggregates, stream the files, cancel, retry, list rollouts with the run
page's filters, labels, notes, corrections, labels list, dataset from a selection; and what a
token may not reach."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from rollouts.collection import export
from rollouts.models import Dataset, Note, RewardCorrection, Rollout, RolloutLabel, Run
from rollouts.review import actions
from rollouts.tokens import create_token

from .run_factories import dataset_lines, finish, key, make_run

API = "/api/v1"
S = Rollout.Status


@pytest.fixture
def token(user):
    return create_token(user, "tests")[1]


@pytest.fixture
def api(client, token):
    """The test client with the token on every request."""

    class Api:
        def __getattr__(self, method):
            def call(url, data=None, **extra):
                kwargs = {"HTTP_AUTHORIZATION": f"Bearer {token}", **extra}
                if (
                    method in ("post", "delete")
                    and isinstance(data, dict)
                    and "files" not in extra
                    and not extra.get("multipart")
                ):
                    return getattr(client, method)(
                        API + url, json.dumps(data), content_type="application/json", **kwargs
                    )
                return getattr(client, method)(API + url, data, **kwargs)

            return call

    return Api()


@pytest.fixture
def run(db):
    run = make_run(4)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.SUCCEEDED, 0.0)
    finish(key(run, 2), S.FAILED, kind="agent_timeout", error="timed out after remote_responses_timeout_s=5")
    return run


def upload(client, token, text: str, name="tasks.jsonl"):
    return client.post(
        f"{API}/datasets",
        {"file": SimpleUploadedFile(name, text.encode()), "name": ""},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_it_uploads_a_dataset(client, token, user):
    response = upload(client, token, "\n".join(dataset_lines(3)) + "\n")
    assert response.status_code == 201
    body = response.json()
    assert body["num_rows"] == 3 and body["name"] == "tasks.jsonl"
    assert Dataset.objects.get(pk=body["id"]).created_by == user


def test_a_bad_dataset_names_its_line_and_stores_nothing(client, token, db):
    response = upload(client, token, dataset_lines(1)[0] + "\n{not json\n")
    assert response.status_code == 400 and "line 2" in response.json()["detail"]
    assert "file" in response.json()["errors"] and not Dataset.objects.exists()


def test_a_dataset_over_the_upload_limit_is_413(client, token, settings, db):
    settings.GYMWEB_MAX_UPLOAD_BYTES = 10
    response = upload(client, token, "\n".join(dataset_lines(3)))
    assert response.status_code == 413 and "GYMWEB_MAX_UPLOAD_BYTES" in response.json()["detail"]
    assert not Dataset.objects.exists()


def test_an_upload_without_a_file_says_so(client, token, db):
    response = client.post(f"{API}/datasets", {"name": "x"}, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400 and response.json()["errors"] == {"file": ["this field is required"]}


def test_it_launches_a_run_on_a_stored_dataset(client, token, api, user):
    dataset_id = upload(client, token, "\n".join(dataset_lines(3))).json()["id"]
    response = api.post(
        "/runs",
        {
            "dataset": dataset_id,
            "agent_url": "http://127.0.0.1:9102/",
            "env_url": "http://127.0.0.1:9101",
            "num_repeats": 2,
            "overrides": {"temperature": 0.5},
            "name": "from the API",
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert run.status == Run.Status.RUNNING and run.created_by == user and run.num_keys == 6
    assert run.agent_url == "http://127.0.0.1:9102" and run.overrides == {"temperature": 0.5}
    assert (
        body["status"] == "running" and body["progress"]["total"] == 6 and body["tasks_from"]["dataset"] == dataset_id
    )


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"agent_url": "ftp://x"}, "agent_url", "http"),
        ({"agent_url": "http://user:secret@127.0.0.1:9102"}, "agent_url", "credentials"),
        ({"env_url": "not a url"}, "env_url", ""),
        ({"dataset": 999}, "dataset", ""),
        ({"run_timeout_s": 10**9}, "run_timeout_s", "GYMWEB_MAX_RUN_TIMEOUT_S"),
        ({"overrides": {"input": 5}}, "overrides", "input"),
    ],
)
def test_a_run_is_checked_like_the_new_run_form(client, token, api, change, field, message):
    dataset_id = upload(client, token, dataset_lines(1)[0]).json()["id"]
    payload = {
        "dataset": dataset_id,
        "agent_url": "http://127.0.0.1:9102",
        "env_url": "http://127.0.0.1:9101",
        **change,
    }
    response = api.post("/runs", payload)
    assert response.status_code == 400, response.content
    body = response.json()
    assert field in body["errors"] and message in json.dumps(body["errors"][field])
    assert "secret" not in response.content.decode()
    assert not Run.objects.exists()


def test_the_target_host_policy_applies_to_api_runs(client, token, api, settings):
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["127.0.0.1"]
    dataset_id = upload(client, token, dataset_lines(1)[0]).json()["id"]
    response = api.post(
        "/runs", {"dataset": dataset_id, "agent_url": "http://10.0.0.1:9102", "env_url": "http://127.0.0.1:9101"}
    )
    assert response.status_code == 400 and "not allowed here" in response.json()["detail"]


def test_status_and_aggregates(api, user, run):
    actions.correct_reward(key(run, 1), 1.0, "right answer", user)
    body = api.get(f"/runs/{run.pk}").json()
    assert body["status"] == "completed" and body["final"] is True
    assert body["progress"]["done"] == 3 and body["progress"]["succeeded"] == 2
    agg = body["aggregates"]
    assert (
        agg["reward"]["mean"] == 0.5
        and agg["reward"]["n"] == 2
        and agg["reward"]["mean_with_failures"] == pytest.approx(1 / 3)
    )
    assert agg["reward_corrected"]["mean"] == 1.0 and agg["corrections"] == 1
    assert agg["failure_kinds"] == {"agent_timeout": 1}


def test_it_lists_runs_and_datasets(api, run):
    assert [r["id"] for r in api.get("/runs").json()] == [run.pk]
    assert api.get("/datasets").json() == []
    assert api.get("/datasets/999").status_code == 404


def test_it_streams_nemo_gym_files(api, run):
    response = api.get(f"/runs/{run.pk}/rollouts.jsonl")
    assert response.status_code == 200 and response["Content-Type"].startswith("application/jsonl")
    assert b"".join(response.streaming_content).decode() == "".join(line + "\n" for line in export.iter_successes(run))
    failures = b"".join(api.get(f"/runs/{run.pk}/rollouts_failures.jsonl").streaming_content).decode().splitlines()
    # NeMo Gym's failure row; gymweb's finer kind ("agent_timeout") stays in the database and the API's rollout list
    assert [json.loads(line)["error"] for line in failures] == ["timed out after remote_responses_timeout_s=5"]
    assert "_gymweb_failure_kind" not in failures[0]
    inputs = (
        b"".join(api.get(f"/runs/{run.pk}/rollouts_materialized_inputs.jsonl").streaming_content).decode().splitlines()
    )
    assert len(inputs) == 4


def test_files_take_the_filters_and_review_options(api, user, run):
    actions.set_label(key(run, 1), actions.find_label("bad", team_id=run.team_id), True, user)
    response = api.get(f"/runs/{run.pk}/rollouts.jsonl?label=bad&review=1&reward_source=corrected")
    rows = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [r["_ng_task_index"] for r in rows] == [1] and rows[0]["gymweb_review"]["labels"][0]["name"] == "bad"
    assert response["X-Gymweb-Reward-Source"] == "corrected"
    response = api.get(f"/runs/{run.pk}/sft.jsonl?reasoning=drop")
    sft = b"".join(response.streaming_content).decode().splitlines()
    # these successes hold no agent reply: no valid training example, each left out and counted
    assert sft == [] and response["X-Gymweb-Left-Out"] == "2"
    assert response["X-Gymweb-Left-Out-Reasons"] == "2 rollouts left out: no assistant turn"
    assert api.get(f"/runs/{run.pk}/sft.jsonl?reasoning=maybe").status_code == 400


def test_an_invalid_filter_value_is_a_400_naming_it(api, run):
    response = api.get(f"/runs/{run.pk}/rollouts.jsonl?status=bogus")
    assert response.status_code == 400 and "status" in response.json()["errors"]


def test_cancel_and_retry(api, run):
    running = make_run(2, status=Run.Status.RUNNING)
    body = api.post(f"/runs/{running.pk}/cancel").json()
    assert body["status"] == "cancelled" and body["progress"]["not_run"] == 2
    assert Rollout.objects.filter(run=running, status=S.CANCELLED).count() == 2
    retried = api.post(f"/runs/{running.pk}/retry").json()
    assert retried["retried"] == 2 and retried["run"]["status"] == "running"
    # The failed key of the completed run gets a second attempt; the never-run key runs again.
    assert api.post(f"/runs/{run.pk}/retry").json()["retried"] == 1


def test_an_imported_run_cannot_be_retried(api, run):
    Run.objects.filter(pk=run.pk).update(status=Run.Status.IMPORTED)
    response = api.post(f"/runs/{run.pk}/retry")
    assert response.status_code == 400 and "imported" in response.json()["detail"]


def test_it_lists_rollouts_with_the_run_page_s_filters(api, user, run):
    actions.set_label(key(run, 0), actions.find_label("good", team_id=run.team_id), True, user)
    actions.add_note(key(run, 0), "fine", user)
    actions.correct_reward(key(run, 1), 0.5, "partly right", user)
    page = api.get(f"/runs/{run.pk}/rollouts").json()
    assert page["count"] == 4 and [r["task_index"] for r in page["items"]] == [0, 1, 2, 3]
    first = page["items"][0]
    assert (
        first["labels"] == ["good"]
        and first["notes"] == 1
        and first["reward"] == 1.0
        and first["url"].startswith("http://testserver/")
    )
    assert page["items"][1]["corrected_reward"] == 0.5 and page["items"][2]["error"].startswith("timed out")
    assert [r["task_index"] for r in api.get(f"/runs/{run.pk}/rollouts?label=good").json()["items"]] == [0]
    assert [
        r["task_index"] for r in api.get(f"/runs/{run.pk}/rollouts?status=succeeded&sort=-reward").json()["items"]
    ] == [0, 1]
    assert [
        r["task_index"]
        for r in api.get(f"/runs/{run.pk}/rollouts?reward_min=0.4&reward_source=corrected").json()["items"]
    ] == [0, 1]
    assert [r["task_index"] for r in api.get(f"/runs/{run.pk}/rollouts?limit=2&offset=1").json()["items"]] == [1, 2]
    bad = api.get(f"/runs/{run.pk}/rollouts?label=not-a-label&sort=sideways")
    assert bad.status_code == 400 and "sort" in bad.json()["errors"]


def test_labels_notes_and_corrections(api, user, run):
    r = key(run, 1)
    body = api.post(f"/rollouts/{r.pk}/labels", {"label": "verifier-wrong"}).json()
    assert body["labels"] == ["verifier-wrong"] and body["label_uses"][0]["by"] == "alice"
    assert api.post(f"/rollouts/{r.pk}/labels", {"label": "nope"}).status_code == 400
    assert api.delete(f"/rollouts/{r.pk}/labels/verifier-wrong").json()["labels"] == []
    note = api.post(f"/rollouts/{r.pk}/notes", {"text": "the tool output was right"})
    assert note.status_code == 201 and note.json()["by"] == "alice" and Note.objects.get().created_by == user
    assert api.post(f"/rollouts/{r.pk}/notes", {"text": "x", "item": 40}).json()["errors"] == {
        "item": ["this rollout has no item #40"]
    }
    corrected = api.post(f"/rollouts/{r.pk}/correction", {"reward": 1.0, "reason": "verifier bug"}).json()
    assert corrected["correction"]["reward"] == 1.0 and corrected["reward"] == 0.0
    assert api.post(f"/rollouts/{r.pk}/correction", {"reward": 1.0, "reason": ""}).status_code == 400
    assert api.post(f"/rollouts/{key(run, 2).pk}/correction", {"reward": 1.0, "reason": "x"}).status_code == 400
    assert api.delete(f"/rollouts/{r.pk}/correction").json()["correction"] is None
    assert RewardCorrection.objects.count() == 2
    detail = api.get(f"/rollouts/{r.pk}").json()
    assert detail["note_list"][0]["text"] == "the tool output was right" and detail["corrected_reward"] is None


def test_the_label_set_can_grow(api, db):
    assert [lab["name"] for lab in api.get("/labels").json()][:2] == ["good", "bad"]
    assert api.post("/labels", {"name": "Truncated", "description": "hit max_steps"}).status_code == 201
    assert api.post("/labels", {"name": "truncated"}).status_code == 400
    assert "truncated" in [lab["name"] for lab in api.get("/labels").json()]


def test_dataset_from_a_selection(api, run):
    response = api.post(f"/runs/{run.pk}/selection/dataset?reward_max=0")
    assert response.status_code == 201
    body = response.json()
    # the failed rollout has no reward (its 0.0 is the file placeholder): only the verified 0.0 is chosen
    assert body["num_rows"] == 1 and body["source_run"] == run.pk and body["source_filters"] == "reward_max=0.0"
    assert api.post(f"/runs/{run.pk}/selection/dataset?reward_min=9").status_code == 400


def test_missing_things_are_404(api, run):
    assert api.get("/runs/999").status_code == 404
    assert api.get("/rollouts/999").status_code == 404
    assert api.post("/rollouts/999/labels", {"label": "good"}).status_code == 404
    assert not RolloutLabel.objects.exists()


def test_a_label_no_label_can_have_is_a_400_never_a_server_error(api, run):
    # PostgreSQL refuses a NUL in a query: the filter and the label actions must stop it first.
    listed = api.get(f"/runs/{run.pk}/rollouts?not_label=%00")
    assert listed.status_code == 400 and "not_label" in listed.json()["errors"]
    assert api.get(f"/runs/{run.pk}/rollouts.jsonl?label=%00").status_code == 400
    r = key(run, 0)
    assert api.delete(f"/rollouts/{r.pk}/labels/%00").status_code == 400
    added = api.post(f"/rollouts/{r.pk}/labels", {"label": "go\x00od"})
    assert added.status_code == 400 and "no label" in added.json()["detail"]
    assert not RolloutLabel.objects.exists()


def test_an_offset_past_any_table_is_refused_not_a_server_error(api, run):
    for url in (f"/runs/{run.pk}/rollouts", "/runs", "/datasets"):
        response = api.get(f"{url}?offset=99999999999999999999")
        assert response.status_code == 400 and response.json()["errors"] == {
            "offset": ["must be at most 1000000000000"]
        }
    assert api.get("/runs?offset=-1").status_code == 400


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"text": "a\\ud800b"}', "unpaired UTF-16 surrogate"),
        (b'{"text": NaN}', "NaN is not a JSON value"),
        (b'{"text": "x"', "not valid JSON"),
    ],
)
def test_a_body_that_is_not_strict_json_is_a_400_naming_why_and_stores_nothing(client, token, run, body, reason):
    response = client.post(
        f"{API}/rollouts/{key(run, 0).pk}/notes",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 400 and reason in response.json()["detail"]
    assert not Note.objects.exists()


@pytest.mark.parametrize("reward", [True, "1.0", None])
def test_a_corrected_reward_must_be_a_json_number(api, run, reward):
    response = api.post(f"/rollouts/{key(run, 1).pk}/correction", {"reward": reward, "reason": "x"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == "reward"
    assert not RewardCorrection.objects.exists()
    assert (
        api.post(f"/rollouts/{key(run, 1).pk}/correction", {"reward": 1, "reason": "x"}).json()["corrected_reward"]
        == 1.0
    )


def test_names_and_descriptions_too_long_to_store_are_refused_not_cut(client, token, api, run):
    assert api.post("/labels", {"name": "long", "description": "d" * 201}).json()["errors"] == {
        "description": ["the description has 201 characters; at most 200"]
    }
    assert api.post("/labels", {"name": "long", "description": "d" * 200}).status_code == 201
    response = client.post(
        f"{API}/datasets",
        {"file": SimpleUploadedFile("t.jsonl", "\n".join(dataset_lines(1)).encode()), "name": "n" * 201},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 400 and "name" in response.json()["errors"]
    assert api.post(f"/runs/{run.pk}/selection/dataset?name={'n' * 201}").status_code == 400
    assert not Dataset.objects.exists()


@pytest.mark.parametrize(
    "query", ["f.task.expected_count=%00", "f.verify.reward=a%00b", "f.task.expected_count=1%00..2"]
)
def test_a_field_filter_holding_a_nul_is_a_400_naming_it(api, run, query):
    # PostgreSQL refuses a NUL in a query; the form reports it as it does ``text=%00``.
    name = query.split("=", 1)[0]
    for path in ("rollouts", "rollouts.jsonl"):
        response = api.get(f"/runs/{run.pk}/{path}?{query}")
        assert response.status_code == 400, response.content
        assert response.json()["detail"] == f"{name}: Null characters are not allowed."
