"""The run page's ``rollouts_aggregate_metrics.json`` download (``analysis_views.run_aggregate_metrics_file``)
and ``evaluation.aggregate`` behind it: the env's stored reply when there is one, else NeMo Gym's
default computation over the stored rows (for an imported NeMo Gym run: NeMo Gym's own file, byte
for byte)."""
from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.evaluation.aggregate import fetch_aggregate_metrics, run_aggregate_entries, run_aggregate_rows, write_run_aggregate_metrics
from rollouts.evaluation.aggregate_metrics import aggregate_metrics_bytes, build_aggregate_metrics
from rollouts.evaluation.outputs import OutputExists
from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run

S = Rollout.Status


def _import(folder, with_failures=True):
    failures = (folder / "rollouts_failures.jsonl").open("rb") if with_failures else None
    try:
        with (folder / "rollouts.jsonl").open("rb") as fh:
            return import_rollouts(fh, failures=failures).run
    finally:
        if failures:
            failures.close()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["runA", "runB"])
def test_an_imported_nemo_gym_run_downloads_nemo_gyms_own_file_byte_for_byte(signed_in, shared_data, name):
    folder = shared_data / "eval_0.7.0" / name
    run = _import(folder)
    response = signed_in.get(reverse("run_aggregate_metrics", args=[run.pk]))
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="rollouts_aggregate_metrics.json"'
    assert response.content == (folder / "rollouts_aggregate_metrics.json").read_bytes()
    assert "an imported run has no environment to ask" in response["X-Gymweb-Note"]


@pytest.mark.django_db
def test_a_stored_env_reply_is_served_as_stored(signed_in):
    run = make_run(2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    text = '[\n  {\n    "agent_ref": {\n      "name": "remote_agent"\n    },\n    "key_metrics": {\n      "zeta": 1,\n      "alpha": 2\n    }\n  }\n]'
    Run.objects.filter(pk=run.pk).update(aggregate_metrics_file=text)
    response = signed_in.get(reverse("run_aggregate_metrics", args=[run.pk]))
    assert response.content == text.encode() and "X-Gymweb-Note" not in response


@pytest.mark.django_db
def test_a_run_without_successes_has_no_file(signed_in):
    run = make_run(2)
    finish(key(run, 0, 0), S.FAILED, kind="agent_timeout")
    assert signed_in.get(reverse("run_aggregate_metrics", args=[run.pk])).status_code == 404
    assert run_aggregate_entries(run)[0] == []


@pytest.mark.django_db
def test_the_download_needs_a_signed_in_user(client):
    run = make_run(1)
    response = client.get(reverse("run_aggregate_metrics", args=[run.pk]))
    assert response.status_code == 302 and "login" in response["Location"]


@pytest.mark.django_db
def test_the_run_page_offers_the_file_once_the_run_is_final(signed_in):
    run = make_run(1)
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert reverse("run_aggregate_metrics", args=[run.pk]) in page
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, finished=None)
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert reverse("run_aggregate_metrics", args=[run.pk]) not in page


@pytest.mark.django_db(transaction=True)
def test_the_env_reply_is_stored_with_its_key_order_and_written_beside_the_rollouts(tmp_path, counter_env_url, counter_agent_url):
    run = make_run(3, num_repeats=2, env_url=counter_env_url)
    for t in range(3):
        for r in range(2):
            finish(key(run, t, r), S.SUCCEEDED, float((t + r) % 2))
    assert fetch_aggregate_metrics(run.pk) == f"stored aggregate metrics of run {run.pk}"
    run.refresh_from_db()
    (entry,) = json.loads(run.aggregate_metrics_file)
    assert list(entry) == ["agent_ref", "_ng_environment_server", "agent_metrics", "key_metrics", "group_level_metrics",
                           "repeat_level_metrics"]
    # The counter env answers NeMo Gym's default computation: the same bytes as computed here, key
    # order included (kept as text: PostgreSQL's jsonb would sort the keys of a JSONField).
    local = build_aggregate_metrics(run_aggregate_rows(run)).entries
    assert run.aggregate_metrics_file == aggregate_metrics_bytes(local).decode()
    assert run.aggregate_metrics["agent_metrics"]["mean/reward"] == 0.5
    path, notes = write_run_aggregate_metrics(run, tmp_path / "rollouts.jsonl")
    assert path == tmp_path / "rollouts_aggregate_metrics.json" and notes == []
    assert path.read_text() == run.aggregate_metrics_file
    with pytest.raises(OutputExists, match="--overwrite"):
        write_run_aggregate_metrics(run, tmp_path / "rollouts.jsonl")
    assert write_run_aggregate_metrics(run, tmp_path / "rollouts.jsonl", overwrite=True)[0] == path


@pytest.mark.django_db
def test_compare_reads_the_stored_file_so_its_metric_order_survives_the_database():
    from rollouts.evaluation.compare import run_entries

    run = make_run(2, num_repeats=2)
    for t in range(2):
        for r in range(2):
            finish(key(run, t, r), S.SUCCEEDED, float(t == r))
    (entry,) = build_aggregate_metrics(run_aggregate_rows(run)).entries
    entry["agent_metrics"] = dict(reversed(list(entry["agent_metrics"].items())))  # an order jsonb would not keep
    Run.objects.filter(pk=run.pk).update(aggregate_metrics_file=aggregate_metrics_bytes([entry]).decode(),
                                         aggregate_metrics={"agent_metrics": {}, "group_level_metrics": [], "repeat_level_metrics": []})
    run.refresh_from_db()
    assert list(run_entries(run)[run.agent_name]["agent_metrics"]) == list(entry["agent_metrics"])
