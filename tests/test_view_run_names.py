"""Run names: an import is named after its file's folder and file (the name field, which the page's
script fills from the folder the browser gives) or its file name numbered when taken; a run's name
can be changed from its page (POST, CSRF, 1 to 200 characters, shown escaped)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from rollouts.collection.run_names import file_label, import_name
from rollouts.models import Run

from .test_xss import EVIL, assert_inert

pytestmark = pytest.mark.django_db


def _upload(signed_in, shared_data, folder, **data):
    body = (shared_data / folder / "example_rollouts.jsonl").read_bytes()
    response = signed_in.post(
        reverse("import"), {"rollouts": SimpleUploadedFile("example_rollouts.jsonl", body), **data}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    return Run.objects.order_by("-id").first()


def test_imports_of_files_with_the_same_name_get_distinct_names(signed_in, shared_data):
    first = _upload(signed_in, shared_data, "tau2")
    second = _upload(signed_in, shared_data, "workplace_assistant")
    third = _upload(signed_in, shared_data, "mini_swe_agent_2")
    assert [first.name, second.name, third.name] == [
        "example_rollouts.jsonl",
        "example_rollouts.jsonl (2)",
        "example_rollouts.jsonl (3)",
    ]


def test_the_name_field_names_the_import_by_folder_and_file(signed_in, shared_data):
    run = _upload(signed_in, shared_data, "mini_swe_agent_2", name="  swebench/example_rollouts.jsonl ")
    assert run.name == "swebench/example_rollouts.jsonl"
    page = signed_in.get(reverse("import")).content.decode()
    assert 'name="name"' in page and "gymweb/import_name" in page


def test_a_relative_path_names_the_folder_and_the_file():
    assert file_label("data/swebench/example_rollouts.jsonl") == "swebench/example_rollouts.jsonl"
    assert file_label("example_rollouts.jsonl") == "example_rollouts.jsonl"
    assert import_name("", ["tau2/example_rollouts.jsonl"]) == "tau2/example_rollouts.jsonl"


def test_a_run_is_renamed_from_its_page(signed_in, shared_data):
    run = _upload(signed_in, shared_data, "tau2")
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert f'action="{reverse("run_rename", args=[run.pk])}"' in page and 'name="csrfmiddlewaretoken"' in page
    response = signed_in.post(reverse("run_rename", args=[run.pk]), {"name": f"  tau2 retail {EVIL}  "})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.name == f"tau2 retail {EVIL}"
    for url in (reverse("run", args=[run.pk]), reverse("runs"), reverse("compare")):
        html = signed_in.get(url).content.decode()
        assert_inert(html)
        assert "tau2 retail &lt;script&gt;" in html


@pytest.mark.parametrize("name", ["", "   ", "x" * 201])
def test_an_empty_or_too_long_name_is_refused(signed_in, shared_data, name):
    run = _upload(signed_in, shared_data, "tau2")
    response = signed_in.post(reverse("run_rename", args=[run.pk]), {"name": name}, follow=True)
    run.refresh_from_db()
    assert run.name == "example_rollouts.jsonl"
    assert "cannot be empty" in response.content.decode() or "at most 200 characters" in response.content.decode()


def test_renaming_needs_a_signed_in_user_a_post_and_the_csrf_token(signed_in, shared_data, user):
    run = _upload(signed_in, shared_data, "tau2")
    url = reverse("run_rename", args=[run.pk])
    assert Client().post(url, {"name": "x"}).status_code in (302, 403)
    assert signed_in.get(url).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(url, {"name": "x"}).status_code == 403
    run.refresh_from_db()
    assert run.name == "example_rollouts.jsonl"
