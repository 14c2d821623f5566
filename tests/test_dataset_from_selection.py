"""Dataset from a selection: the tasks of a filtered list become a new dataset, a new run is
launched from it with another agent URL in two clicks, and the new run records where its tasks
came from."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from rollouts.models import Dataset, Rollout, Run
from rollouts.review import actions

from .run_factories import finish, key, make_run

S = Rollout.Status


@pytest.fixture
def run(db):
    run = make_run(
        4, num_repeats=2, agent_name="old_agent", env_url="http://127.0.0.1:9101", concurrency=7, max_attempts=2
    )
    for t in range(4):
        finish(key(run, t, 0), S.SUCCEEDED, 1.0 if t % 2 == 0 else 0.0)
        finish(key(run, t, 1), S.SUCCEEDED, 0.0 if t == 2 else 1.0)
    return run


def test_the_tasks_of_the_filtered_list_become_a_dataset_once_each(signed_in, user, run):
    # reward 0: task 1 (both repeats), task 2 (the second), task 3 (the first)
    response = signed_in.post(reverse("selection_dataset", args=[run.pk]), {"reward_max": "0"})
    dataset = Dataset.objects.get(source_run=run)
    assert response.status_code == 302 and response["Location"] == reverse("dataset_new_run", args=[dataset.pk])
    assert dataset.num_rows == 3 and dataset.created_by == user and dataset.source_filters == "reward_max=0.0"
    rows = [json.loads(t) for t in dataset.rows.order_by("line").values_list("data_json", flat=True)]
    assert [r["_ng_task_index"] for r in rows] == [1, 2, 3]  # kept: results line up with the source run's
    assert [r["expected"] for r in rows] == [1, 2, 3] and all("agent_ref" not in r for r in rows)
    assert rows[0]["responses_create_params"] == {"input": "task 1"}


def test_a_task_s_own_agent_ref_is_kept(signed_in, run):
    task = run.tasks.get(task_index=1)
    row = json.loads(task.row_json)
    row["agent_ref"] = {"name": "special_agent"}
    task.row_json = json.dumps(row)
    task.save()
    signed_in.post(reverse("selection_dataset", args=[run.pk]), {"task": "1"})
    data = json.loads(Dataset.objects.get(source_run=run).rows.get().data_json)
    assert data["agent_ref"] == {"name": "special_agent"}


def test_a_list_filtered_by_label_works_too(signed_in, user, run):
    actions.set_label(key(run, 3, 1), actions.find_label("verifier-wrong", team_id=run.team_id), True, user)
    signed_in.post(reverse("selection_dataset", args=[run.pk]), {"label": "verifier-wrong"})
    dataset = Dataset.objects.get(source_run=run)
    assert dataset.num_rows == 1 and dataset.source_filters == "label=verifier-wrong"


@pytest.mark.parametrize("data", [{"reward_max": "zero"}, {"label": "\x00"}, {"task": "1", "status": "done"}])
def test_a_bad_filter_value_makes_no_dataset_of_a_bigger_list(signed_in, run, data):
    response = signed_in.post(reverse("selection_dataset", args=[run.pk]), data, follow=True)
    assert response.status_code == 200 and not Dataset.objects.filter(source_run=run).exists()
    assert "No dataset made: bad filter" in response.content.decode()


def test_an_empty_selection_stores_nothing_and_says_why(signed_in, run):
    response = signed_in.post(reverse("selection_dataset", args=[run.pk]), {"reward_min": "5"}, follow=True)
    assert not Dataset.objects.filter(source_run=run).exists()
    assert "no rollout matches this filter" in response.content.decode()


def test_two_clicks_launch_a_run_on_the_failed_tasks_with_another_agent(signed_in, run):
    # Click 1: "Dataset from these tasks" on the filtered run page.
    response = signed_in.post(reverse("selection_dataset", args=[run.pk]), {"reward_max": "0"}, follow=True)
    form = response.context["form"]
    dataset = Dataset.objects.get(source_run=run)
    html = response.content.decode()
    assert 'id="from-dataset"' in html and f"run #{run.pk}" in html
    assert form.initial["dataset"] == dataset.pk and form.initial["env_url"] == run.env_url
    assert form.initial["concurrency"] == 7 and form.initial["agent_name"] == "old_agent"
    # Click 2: "Start run" with another agent URL (the form posts to the ordinary new-run view).
    data = {name: ("" if value is None else value) for name, value in form.initial.items()}
    data["agent_url"] = "http://127.0.0.1:9200"
    response = signed_in.post(reverse("run_new"), data)
    new_run = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[new_run.pk])
    assert new_run.agent_url == "http://127.0.0.1:9200" and new_run.dataset == dataset
    assert new_run.num_tasks == 3 and new_run.num_keys == 6  # the source run's two repeats
    assert sorted(new_run.tasks.values_list("task_index", flat=True)) == [1, 2, 3]
    # It records where its tasks came from.
    page = signed_in.get(reverse("run", args=[new_run.pk])).content.decode()
    assert 'id="tasks-from"' in page and f'href="{reverse("run", args=[run.pk])}?reward_max=0.0"' in page


def test_the_new_run_goes_through_the_new_run_form_s_checks(signed_in, run, settings):
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["127.0.0.1"]
    signed_in.post(reverse("selection_dataset", args=[run.pk]), {"reward_max": "0"})
    dataset = Dataset.objects.get(source_run=run)
    response = signed_in.get(reverse("dataset_new_run", args=[dataset.pk]))
    data = {n: ("" if v is None else v) for n, v in response.context["form"].initial.items()}
    data["agent_url"] = "http://elsewhere.example:9200"
    response = signed_in.post(reverse("run_new"), data)
    assert response.status_code == 400 and "not allowed here" in response.content.decode()
    assert Run.objects.count() == 1


def test_permission_failures(client, user, run):
    response = client.post(reverse("selection_dataset", args=[run.pk]), {})
    assert response.status_code == 302 and reverse("login") in response["Location"]
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(reverse("selection_dataset", args=[run.pk]), {}).status_code == 403
    assert not Dataset.objects.filter(source_run=run).exists()
    assert reverse("login") in client.get(reverse("dataset_new_run", args=[1]))["Location"]
