"""The new-run form: a dataset (upload or earlier), the two services, the knobs; a bad submission
stores nothing and says what is wrong."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Dataset, Rollout, Run, Task

from .run_factories import dataset_lines

URL = reverse("run_new")


def _upload(text: str, name: str = "tasks.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="application/jsonl")


def _good_jsonl(n: int = 3) -> str:
    return "\n".join(dataset_lines(n)) + "\n"


def _data(**changes):
    data = {
        "dataset_file": _upload(_good_jsonl()),
        "agent_url": "http://127.0.0.1:9102/",
        "env_url": "http://127.0.0.1:9101",
        "agent_name": "remote_agent",
        "concurrency": "8",
        "num_repeats": "2",
        "max_attempts": "3",
        "remote_responses_timeout_s": "60",
        "run_timeout_s": "120",
        "overrides": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def _nothing_stored():
    return Dataset.objects.count() == 0 and Run.objects.count() == 0 and Rollout.objects.count() == 0


def test_it_requires_login(client, db):
    response = client.get(URL)
    assert response.status_code == 302 and reverse("login") in response["Location"]
    response = client.post(URL, _data())
    assert response.status_code == 302 and reverse("login") in response["Location"]
    assert _nothing_stored()


def test_it_shows_the_form_with_the_defaults(signed_in):
    response = signed_in.get(URL)
    assert response.status_code == 200
    body = response.content.decode()
    for name in (
        "dataset_file",
        "dataset",
        "agent_url",
        "env_url",
        "concurrency",
        "max_steps",
        "num_repeats",
        "limit",
        "remote_responses_timeout_s",
        "run_timeout_s",
        "max_attempts",
        "agent_name",
        "env_max_in_flight",
        "overrides",
    ):
        assert f'name="{name}"' in body
    assert 'value="2100' in body and 'value="1800' in body and 'value="32"' in body
    assert 'enctype="multipart/form-data"' in body and "csrfmiddlewaretoken" in body


def test_it_starts_a_run_from_an_upload_and_redirects_to_its_page(signed_in, user):
    response = signed_in.post(URL, _data(name="my first run", max_steps="8", limit="2"))
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run", args=[run.pk])
    assert run.name == "my first run" and run.status == Run.Status.RUNNING and run.created_by == user
    assert run.agent_url == "http://127.0.0.1:9102"  # trailing slash dropped
    assert (run.concurrency, run.num_repeats, run.max_steps, run.limit, run.max_attempts) == (8, 2, 8, 2, 3)
    assert (run.remote_responses_timeout_s, run.run_timeout_s) == (60.0, 120.0)
    assert run.num_tasks == 2 and run.num_keys == 4
    assert Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).count() == 4
    dataset = Dataset.objects.get()
    assert run.dataset == dataset and dataset.num_rows == 3 and dataset.name == "tasks.jsonl"


def test_a_run_may_bound_its_calls_in_flight_to_the_env_and_its_page_says_so(signed_in):
    signed_in.post(URL, _data(env_max_in_flight="4"))
    run = Run.objects.get()
    assert run.env_max_in_flight == 4
    assert "at most 4 at once" in signed_in.get(reverse("run", args=[run.pk])).content.decode()
    signed_in.post(URL, _data(name="unbounded", env_max_in_flight=""))
    assert Run.objects.get(name="unbounded").env_max_in_flight == 0, "empty: the server's setting"


def test_a_run_without_a_name_is_named_after_its_dataset(signed_in):
    signed_in.post(URL, _data())
    assert Run.objects.get().name == "tasks.jsonl"


def test_it_reuses_an_earlier_dataset(signed_in):
    dataset = runs.store_dataset(read_jsonl(dataset_lines(4)), "earlier.jsonl")
    response = signed_in.post(URL, _data(dataset_file=None, dataset=str(dataset.pk), num_repeats="1"))
    run = Run.objects.get()
    assert response.status_code == 302
    assert run.dataset == dataset and run.num_keys == 4 and run.name == "earlier.jsonl"
    assert Dataset.objects.count() == 1  # reusing stores no copy


def test_earlier_datasets_read_apart_with_id_count_and_date(signed_in):
    from django.utils import timezone

    one = runs.store_dataset(read_jsonl(dataset_lines(1)), "good.jsonl")
    five = runs.store_dataset(read_jsonl(dataset_lines(5)), "good.jsonl")
    other = runs.store_dataset(read_jsonl(dataset_lines(1200)), "good.jsonl")
    body = signed_in.get(URL).content.decode()
    for dataset, count in ((one, "1 row"), (five, "5 rows"), (other, "1,200 rows")):
        when = timezone.localtime(dataset.created).strftime("%Y-%m-%d %H:%M")
        selected = " selected" if dataset == other else ""  # the one uploaded last is pre-selected
        assert (
            f'<option value="{dataset.pk}"{selected}>#{dataset.pk} good.jsonl · {count} · file good.jsonl · {when}'
            " · “task 0”</option>" in body
        )
    assert "1 rows" not in body


def test_uploading_the_same_file_again_reuses_the_stored_dataset(signed_in, user, django_user_model):
    signed_in.post(URL, _data(dataset_file=_upload(_good_jsonl(), "same.jsonl")))
    response = signed_in.post(URL, _data(dataset_file=_upload(_good_jsonl(), "same.jsonl")), follow=True)
    first, second = Run.objects.order_by("id")
    assert f"The file was uploaded before: dataset #{first.dataset_id} reused." in response.content.decode()
    assert Dataset.objects.count() == 1 and first.dataset == second.dataset
    assert second.num_keys == 6 and Rollout.objects.filter(run=second).count() == 6
    # another name, other bytes or another user: a dataset of its own
    signed_in.post(URL, _data(dataset_file=_upload(_good_jsonl(), "renamed.jsonl")))
    signed_in.post(URL, _data(dataset_file=_upload(_good_jsonl(4), "same.jsonl")))
    assert Dataset.objects.count() == 3
    signed_in.force_login(django_user_model.objects.create_user("bob", password="x" * 12))
    signed_in.post(URL, _data(dataset_file=_upload(_good_jsonl(), "same.jsonl")))
    assert (
        Dataset.objects.count() == 4
        and Dataset.objects.filter(name="same.jsonl", created_by__username="bob").count() == 1
    )


def test_it_merges_the_overrides_into_responses_create_params(signed_in):
    signed_in.post(URL, _data(overrides='{"temperature": 0.2, "model": "m"}'))
    run = Run.objects.get()
    assert run.overrides == {"temperature": 0.2, "model": "m"}
    row = json.loads(Task.objects.filter(run=run).first().row_json)
    assert row["responses_create_params"]["temperature"] == 0.2 and row["responses_create_params"]["input"] == "task 0"


def _errors(response, field):
    return response.context["form"].errors.get(field, [])


def test_it_rejects_a_url_with_credentials_without_echoing_the_password(signed_in):
    response = signed_in.post(URL, _data(agent_url="http://bob:hunter2secret@agents.example:9000"))
    assert response.status_code == 400
    assert any("credentials" in e for e in _errors(response, "agent_url"))
    assert b"hunter2secret" not in response.content
    assert _nothing_stored()


@pytest.mark.parametrize(
    "url, words",
    [
        ("ftp://127.0.0.1:9000", "http"),
        ("127.0.0.1:9000", "http"),
        ("http://127.0.0.1:9000/?x=1", "query"),
        ("http://127.0.0.1:9000/#top", "fragment"),
        ("", "required"),
    ],
)
def test_it_rejects_a_bad_env_url(signed_in, url, words):
    response = signed_in.post(URL, _data(env_url=url))
    assert response.status_code == 400
    assert any(words in e for e in _errors(response, "env_url")), _errors(response, "env_url")
    assert _nothing_stored()


def test_it_rejects_a_host_outside_the_allowed_target_hosts(signed_in, settings):
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["agents.internal", "127.0.0.1"]
    response = signed_in.post(URL, _data(agent_url="http://evil.example:9000"))
    assert any("not allowed" in e for e in _errors(response, "agent_url"))
    assert not _errors(response, "env_url")
    assert _nothing_stored()


@pytest.mark.parametrize(
    "text, words", [("{not json", "Not valid JSON"), ("[1, 2]", "JSON object"), ('"temperature"', "JSON object")]
)
def test_it_rejects_overrides_that_are_not_a_json_object(signed_in, text, words):
    response = signed_in.post(URL, _data(overrides=text))
    assert any(words in e for e in _errors(response, "overrides")), _errors(response, "overrides")
    assert _nothing_stored()


def test_it_reports_a_bad_jsonl_line_with_its_number(signed_in):
    lines = dataset_lines(4)
    lines[2] = '{"responses_create_params": {"input": "x"'
    response = signed_in.post(URL, _data(dataset_file=_upload("\n".join(lines), "broken.jsonl")))
    errors = _errors(response, "dataset_file")
    assert any("line 3" in e and "not valid JSON" in e and "broken.jsonl" in e for e in errors), errors
    assert "line 3" in response.content.decode()
    assert _nothing_stored()


def test_a_bad_jsonl_line_is_reported_with_one_line_number_and_its_column(signed_in):
    lines = dataset_lines(4)
    lines[2] = '  {"responses_create_params": {"input": "x"} "expected": 2}'
    response = signed_in.post(URL, _data(dataset_file=_upload("\n".join(lines), "broken.jsonl")))
    errors = _errors(response, "dataset_file")
    assert errors == ["broken.jsonl, line 3: not valid JSON (Expecting ',' delimiter at column 46)"], errors
    assert lines[2].index('"expected') == 45  # column 46, 1-based, in the line as written
    assert "line 1 column" not in response.content.decode() and "char " not in response.content.decode()


def test_it_reports_a_row_without_responses_create_params(signed_in):
    text = _good_jsonl(2) + '{"question": "no params"}\n'
    response = signed_in.post(URL, _data(dataset_file=_upload(text)))
    assert any("line 3" in e and "responses_create_params" in e for e in _errors(response, "dataset_file"))
    assert _nothing_stored()


def test_it_rejects_an_upload_over_the_size_limit_with_a_clear_message(signed_in, settings):
    settings.GYMWEB_MAX_UPLOAD_BYTES = 200
    response = signed_in.post(URL, _data(dataset_file=_upload(_good_jsonl(20))))
    errors = _errors(response, "dataset_file")
    assert any("larger than the upload limit of 200 bytes" in e and "GYMWEB_MAX_UPLOAD_BYTES" in e for e in errors), (
        errors
    )
    assert response.context["form"].data["agent_url"] == "http://127.0.0.1:9102/"  # the other fields still arrived
    assert _nothing_stored()


def test_it_rejects_a_rollout_timeout_over_the_server_maximum(signed_in, settings):
    settings.GYMWEB_MAX_RUN_TIMEOUT_S = 600
    response = signed_in.post(URL, _data(run_timeout_s="601"))
    assert any("600" in e and "GYMWEB_MAX_RUN_TIMEOUT_S" in e for e in _errors(response, "run_timeout_s"))
    assert _nothing_stored()


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"concurrency": "0"}, "concurrency"),
        ({"num_repeats": "0"}, "num_repeats"),
        ({"max_attempts": "zero"}, "max_attempts"),
        ({"remote_responses_timeout_s": "-1"}, "remote_responses_timeout_s"),
        ({"limit": "0"}, "limit"),
        ({"env_max_in_flight": "-2"}, "env_max_in_flight"),
    ],
)
def test_it_rejects_out_of_range_knobs(signed_in, changes, field):
    response = signed_in.post(URL, _data(**changes))
    assert _errors(response, field)
    assert _nothing_stored()


def test_it_needs_a_dataset_and_only_one(signed_in):
    response = signed_in.post(URL, _data(dataset_file=None))
    assert any("Upload a JSONL dataset" in e for e in _errors(response, "dataset_file"))
    dataset = runs.store_dataset(read_jsonl(dataset_lines(1)), "earlier.jsonl")
    response = signed_in.post(URL, _data(dataset=str(dataset.pk)))
    assert any("not both" in e for e in _errors(response, "dataset"))
    assert Run.objects.count() == 0 and Dataset.objects.count() == 1


def test_a_bad_field_with_a_good_upload_stores_no_dataset(signed_in):
    response = signed_in.post(URL, _data(overrides="[]", agent_url="not a url"))
    assert response.status_code == 400
    assert _errors(response, "overrides") and _errors(response, "agent_url")
    assert _nothing_stored()


def test_a_post_without_the_csrf_token_is_refused(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(URL, _data())
    assert response.status_code == 403
    assert _nothing_stored()
    page = client.get(URL)
    token = page.context["csrf_token"]
    response = client.post(URL, _data(csrfmiddlewaretoken=str(token)))
    assert response.status_code == 302 and Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_submitted_run_completes_against_the_example_services(
    client, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path
):
    from rollouts.workers.process import run_in_process

    client.force_login(django_user_model.objects.create_user("bob", password="x" * 12))
    response = client.post(
        URL,
        _data(
            dataset_file=_upload(counter_tasks_path.read_text(), "counter_tasks.jsonl"),
            agent_url=counter_agent_url,
            env_url=counter_env_url,
            num_repeats="1",
        ),
    )
    run = Run.objects.get()
    assert response.status_code == 302
    run_in_process(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert set(Rollout.objects.filter(run=run).values_list("status", "reward")) == {("succeeded", 1.0)}
    assert Rollout.objects.filter(run=run).count() == 5


# -- first use -------------------------------------------------------------------------------------
def test_the_form_is_pre_filled_with_the_instances_default_services(signed_in, settings):
    settings.GYMWEB_DEFAULT_AGENT_URL = "http://127.0.0.1:9102"
    settings.GYMWEB_DEFAULT_ENV_URL = "http://127.0.0.1:9101"
    html = signed_in.get(URL).content.decode()
    assert 'name="agent_url" value="http://127.0.0.1:9102"' in html
    assert 'name="env_url" value="http://127.0.0.1:9101"' in html


def test_without_defaults_the_service_fields_start_empty(signed_in, settings):
    settings.GYMWEB_DEFAULT_AGENT_URL = settings.GYMWEB_DEFAULT_ENV_URL = ""
    html = signed_in.get(URL).content.decode()
    assert 'name="agent_url" value=' not in html and 'name="env_url" value=' not in html


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9102/v1/responses",
        "http://127.0.0.1:9102/v1/responses/",
        "https://agents.example/team/v1/responses",
    ],
)
def test_an_agent_url_ending_in_v1_responses_gets_a_hint_that_gymweb_appends_it(signed_in, url):
    response = signed_in.post(URL, _data(agent_url=url))
    assert response.status_code == 400 and _nothing_stored()
    error = response.context["form"].errors["agent_url"][0]
    base = url.rstrip("/")[: -len("/v1/responses")]
    assert "gymweb appends /v1/responses itself" in error and f"Did you mean {base}?" in error


def test_an_empty_file_is_refused_with_its_name(signed_in):
    response = signed_in.post(URL, _data(dataset_file=SimpleUploadedFile("blank.jsonl", b"")))
    assert _errors(response, "dataset_file") == ["blank.jsonl: the file is empty (0 bytes)"]
    assert _nothing_stored()


def test_a_pretty_printed_json_array_is_refused_as_a_json_document_not_jsonl(signed_in):
    rows = [json.loads(line) for line in dataset_lines(3)]
    response = signed_in.post(URL, _data(dataset_file=_upload(json.dumps(rows, indent=2), "tasks.json")))
    assert _errors(response, "dataset_file") == [
        "tasks.json: this is a JSON array, not JSONL (one JSON object per line); "
        "convert it with: jq -c '.[]' tasks.json > tasks.jsonl"
    ]
    assert _nothing_stored()


def test_a_broken_first_line_of_a_large_file_keeps_the_lines_error(signed_in, monkeypatch):
    from rollouts.collection import datasets

    monkeypatch.setattr(datasets, "WHOLE_DOCUMENT_BYTES", 50)  # only small files are parsed whole
    rows = [json.loads(line) for line in dataset_lines(3)]
    response = signed_in.post(URL, _data(dataset_file=_upload(json.dumps(rows, indent=2), "tasks.json")))
    errors = _errors(response, "dataset_file")
    assert len(errors) == 1 and errors[0].startswith("tasks.json, line 1: not valid JSON"), errors
