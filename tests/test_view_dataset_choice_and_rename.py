"""Stored datasets told apart and renamed: the new-run form's dataset choice says where each came
from (the uploaded file, a selection of a run), when, its row count and its first task's prompt;
a small form beside it renames one (POST with CSRF; the owner or staff; the name escaped; the
name it came with kept, so re-uploading the same file still finds it)."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Dataset
from rollouts.web.forms import first_prompt

pytestmark = pytest.mark.django_db

NEW = reverse("run_new")
RENAME = reverse("dataset_rename")


def _rows(prompt: str, n: int = 2) -> list[str]:
    content = [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}]
    return [json.dumps({"responses_create_params": {"input": content}, "i": i}) for i in range(n)]


def test_each_choice_names_its_origin_row_count_and_first_prompt(signed_in, user):
    upload = runs.store_dataset(read_jsonl(_rows("add 1 then add 2 then get the count")), "example.jsonl", user)
    other = runs.store_dataset(read_jsonl(_rows("add 7 then get the count", 5)), "example.jsonl", user)
    run = runs.create_run(read_jsonl(_rows("x")), name="r", agent_url="http://a.example", env_url="http://e.example")
    Dataset.objects.filter(pk=other.pk).update(source_run=run)
    body = signed_in.get(NEW).content.decode()
    assert f"#{upload.pk} example.jsonl · 2 rows · file example.jsonl · " in body
    assert "“add 1 then add 2 then get the count”</option>" in body
    assert f"#{other.pk} example.jsonl · 5 rows · selection of run #{run.pk} · " in body
    assert "“add 7 then get the count”</option>" in body


def test_the_preview_is_one_line_cut_short_and_read_from_a_cut_row():
    long = "word " * 60
    row = json.dumps({"responses_create_params": {"input": [{"role": "user", "content": long + "\nsecond"}]}})
    preview = first_prompt(row)
    assert len(preview) == 80 and preview.endswith("…") and "\n" not in preview
    assert first_prompt(row[:120]).startswith("word word")  # the first 4,000 characters of a huge row
    assert first_prompt(json.dumps({"responses_create_params": {"input": "as a string"}})) == "as a string"
    assert first_prompt(json.dumps({"other": 1})) == "" and first_prompt(None) == ""


def test_a_dataset_renamed_keeps_its_origin_and_is_chosen_on_the_form(signed_in, user):
    dataset = runs.store_dataset(read_jsonl(_rows("add 1 then get the count")), "example.jsonl", user)
    page = signed_in.get(NEW).content.decode()
    assert f'action="{RENAME}"' in page and 'form="dataset-rename"' in page
    response = signed_in.post(RENAME, {"rename-dataset": dataset.pk, "rename-name": "  <b>counter</b> v2  "})
    assert response.status_code == 302 and response["Location"] == f"{NEW}?dataset={dataset.pk}"
    dataset.refresh_from_db()
    assert dataset.name == "<b>counter</b> v2" and dataset.source_name == "example.jsonl"
    body = signed_in.get(response["Location"]).content.decode()
    assert (
        f'<option value="{dataset.pk}" selected>#{dataset.pk} &lt;b&gt;counter&lt;/b&gt; v2 · 2 rows · '
        "file example.jsonl" in body
    )
    assert "<b>counter</b>" not in body
    # The same file uploaded again is still recognised by the name it came with.
    parsed = read_jsonl(_rows("add 1 then get the count"))
    again = runs.earlier_upload(parsed.sha256, "example.jsonl", len(parsed.rows), user, dataset.team_id)
    assert again is not None and again.pk == dataset.pk


def test_an_empty_name_is_refused_with_a_message(signed_in, user):
    dataset = runs.store_dataset(read_jsonl(_rows("p")), "a.jsonl", user)
    response = signed_in.post(RENAME, {"rename-dataset": dataset.pk, "rename-name": "   "}, follow=True)
    assert "The dataset was not renamed" in response.content.decode()
    dataset.refresh_from_db()
    assert dataset.name == "a.jsonl"


def test_only_its_owner_or_staff_renames_a_dataset(signed_in, django_user_model):
    bob = django_user_model.objects.create_user(username="bob", password="x")
    theirs = runs.store_dataset(read_jsonl(_rows("p")), "bobs.jsonl", bob)
    assert signed_in.post(RENAME, {"rename-dataset": theirs.pk, "rename-name": "mine"}).status_code == 403
    theirs.refresh_from_db()
    assert theirs.name == "bobs.jsonl"
    assert 'id="dataset-rename-box"' not in signed_in.get(NEW).content.decode()  # alice stored none
    staff = Client()
    staff.force_login(django_user_model.objects.create_user(username="sam", password="x", is_staff=True))
    assert staff.post(RENAME, {"rename-dataset": theirs.pk, "rename-name": "tidied"}).status_code == 302
    theirs.refresh_from_db()
    assert theirs.name == "tidied"


def test_renaming_needs_a_csrf_token_and_a_post(user):
    dataset = runs.store_dataset(read_jsonl(_rows("p")), "a.jsonl", user)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(RENAME, {"rename-dataset": dataset.pk, "rename-name": "x"}).status_code == 403
    assert strict.get(RENAME).status_code == 405
    dataset.refresh_from_db()
    assert dataset.name == "a.jsonl"
