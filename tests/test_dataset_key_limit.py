"""A dataset with more rows than a run may have keys (GYMWEB_MAX_KEYS_PER_RUN) is refused while it
is read, before anything is stored: it could never run."""

from __future__ import annotations

import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts.collection.datasets import DatasetError, read_jsonl
from rollouts.models import Dataset, Run

from .run_factories import dataset_lines

pytestmark = pytest.mark.django_db


def test_reading_stops_at_the_first_row_past_the_limit():
    lines = dataset_lines(3) + ["{not even json"]  # never reached
    with pytest.raises(DatasetError) as refused:
        read_jsonl(io.BytesIO("\n".join(lines).encode()), source="big.jsonl", refuse_over=2)
    assert "big.jsonl, line 3: the dataset has more than 2 rows" in str(refused.value)
    assert "GYMWEB_MAX_KEYS_PER_RUN" in str(refused.value)


def test_the_new_run_form_refuses_it_and_stores_nothing(signed_in, settings):
    settings.GYMWEB_MAX_KEYS_PER_RUN = 2
    upload = SimpleUploadedFile("big.jsonl", ("\n".join(dataset_lines(3)) + "\n").encode())
    data = {
        "dataset_file": upload,
        "agent_url": "http://127.0.0.1:9102/",
        "env_url": "http://127.0.0.1:9101",
        "agent_name": "remote_agent",
        "concurrency": "8",
        "num_repeats": "1",
        "max_attempts": "3",
        "remote_responses_timeout_s": "60",
        "run_timeout_s": "120",
        "overrides": "",
    }
    response = signed_in.post(reverse("run_new"), data)
    assert response.status_code == 400
    assert "the dataset has more than 2 rows" in response.content.decode()
    assert Dataset.objects.count() == 0 and Run.objects.count() == 0


def _inserts(queries, table: str) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith(f'INSERT INTO "{table}"')]


def test_the_api_refuses_it_on_the_file_field_before_storing_anything(client, user, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from rollouts.tokens import create_token

    settings.GYMWEB_MAX_KEYS_PER_RUN = 2
    token = create_token(user, "tests")[1]
    upload = SimpleUploadedFile("big.jsonl", ("\n".join(dataset_lines(3)) + "\n").encode())
    with CaptureQueriesContext(connection) as queries:
        response = client.post("/api/v1/datasets", {"file": upload, "name": ""}, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400
    body = response.json()
    assert body["detail"].startswith("big.jsonl, line 3: the dataset has more than 2 rows")
    assert body["errors"] == {"file": [body["detail"]]}
    assert not _inserts(queries, "rollouts_dataset") and not _inserts(queries, "rollouts_datasetrow")
    assert Dataset.objects.count() == 0


def test_the_import_pages_dataset_offer_refuses_it_before_storing_anything(signed_in, settings):
    settings.GYMWEB_MAX_KEYS_PER_RUN = 2
    upload = SimpleUploadedFile("big.jsonl", ("\n".join(dataset_lines(3)) + "\n").encode())
    response = signed_in.post(reverse("import"), {"rollouts": upload})
    assert response.status_code == 400
    html = response.content.decode()
    assert "this is a dataset, not rollouts" in html
    assert "big.jsonl, line 3: the dataset has more than 2 rows" in html  # the offer's refusal, not a dataset
    assert Dataset.objects.count() == 0 and Run.objects.count() == 0
