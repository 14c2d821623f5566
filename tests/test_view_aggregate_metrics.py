"""The run page's ``rollouts_aggregate_metrics.json`` download (``profile_views.run_aggregate_metrics_file``)
and ``evaluation.run_aggregate_metrics`` behind it: the env's stored reply when there is one, else NeMo Gym's
default computation over the stored rows (for an imported NeMo Gym run: NeMo Gym's own file, byte
for byte)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.evaluation.aggregate_metrics import aggregate_metrics_bytes, build_aggregate_metrics
from rollouts.evaluation.outputs import OutputExists
from rollouts.evaluation.run_aggregate_metrics import (
    fetch_aggregate_metrics,
    run_aggregate_entries,
    run_aggregate_rows,
    write_run_aggregate_metrics,
)
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
    # named after the run's rollouts download (run-N_rollouts.jsonl), where gym eval compare looks for it
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}_rollouts_aggregate_metrics.json"'
    assert response.content == (folder / "rollouts_aggregate_metrics.json").read_bytes()
    assert "an imported run has no environment to ask" in response["X-Gymweb-Note"]


@pytest.mark.django_db
def test_a_stored_env_reply_is_served_as_stored_key_order_included(signed_in):
    run = make_run(2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    entry = {
        "agent_ref": {"name": "remote_agent"},
        "_ng_environment_server": "remote_agent_environment_server",
        "agent_metrics": {"zeta": 1, "alpha": 2},
        "key_metrics": {"zeta": 1},
        "group_level_metrics": [],
        "repeat_level_metrics": [],
    }
    Run.objects.filter(pk=run.pk).update(aggregate_metrics=entry)
    response = signed_in.get(reverse("run_aggregate_metrics", args=[run.pk]))
    assert response.content == aggregate_metrics_bytes([entry]) and "X-Gymweb-Note" not in response
    assert response.content.index(b'"zeta"') < response.content.index(b'"alpha"')


@pytest.mark.django_db
def test_a_bare_reply_stored_by_an_older_gymweb_becomes_its_runs_entry():
    run = make_run(1, agent_name="my_agent")
    Run.objects.filter(pk=run.pk).update(
        aggregate_metrics={"key_metrics": {"mean/reward": 1.0}, "agent_metrics": {"mean/reward": 1.0}}
    )
    run.refresh_from_db()
    (entry,), notes = run_aggregate_entries(run)
    assert notes == [] and entry == {
        "agent_ref": {"name": "my_agent"},
        "_ng_environment_server": "my_environment_server",
        "agent_metrics": {"mean/reward": 1.0},
        "key_metrics": {"mean/reward": 1.0},
        "group_level_metrics": [],
        "repeat_level_metrics": [],
    }


@pytest.mark.django_db
def test_a_run_without_successes_has_no_file(signed_in):
    run = make_run(2)
    finish(key(run, 0, 0), S.FAILED, kind="agent_timeout")
    assert signed_in.get(reverse("run_aggregate_metrics", args=[run.pk])).status_code == 404
    assert run_aggregate_entries(run)[0] == []


@pytest.mark.django_db
def test_a_run_without_successes_offers_no_download_that_would_be_a_404_and_says_why(signed_in):
    run = make_run(2)
    finish(key(run, 0, 0), S.FAILED, kind="agent_timeout")
    for page in (reverse("run", args=[run.pk]), reverse("run_profile", args=[run.pk])):
        html = signed_in.get(page).content.decode()
        assert reverse("run_aggregate_metrics", args=[run.pk]) not in html
    assert "the run has no successful rollouts" in signed_in.get(reverse("run", args=[run.pk])).content.decode()


@pytest.mark.django_db
def test_the_download_needs_a_signed_in_user(client):
    run = make_run(1)
    response = client.get(reverse("run_aggregate_metrics", args=[run.pk]))
    assert response.status_code == 302 and "login" in response["Location"]


@pytest.mark.django_db
def test_the_run_page_offers_the_file_once_the_run_is_final(signed_in):
    run = make_run(1)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert reverse("run_aggregate_metrics", args=[run.pk]) in page
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, finished=None)
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert reverse("run_aggregate_metrics", args=[run.pk]) not in page


@pytest.mark.django_db(transaction=True)
def test_the_env_reply_is_stored_with_its_key_order_and_written_beside_the_rollouts(
    tmp_path, counter_env_url, counter_agent_url
):
    run = make_run(3, num_repeats=2, env_url=counter_env_url)
    for t in range(3):
        for r in range(2):
            finish(key(run, t, r), S.SUCCEEDED, float((t + r) % 2))
    assert fetch_aggregate_metrics(run.pk) == f"stored aggregate metrics of run {run.pk}"
    run = Run.objects.get(pk=run.pk)  # read back from the database
    entry = run.aggregate_metrics
    assert list(entry) == [
        "agent_ref",
        "_ng_environment_server",
        "agent_metrics",
        "key_metrics",
        "group_level_metrics",
        "repeat_level_metrics",
    ]
    # The counter env answers NeMo Gym's default computation: the same bytes as computed here, key
    # order included (kept as JSON text: PostgreSQL's jsonb would sort the keys).
    local = build_aggregate_metrics(run_aggregate_rows(run)).entries
    assert aggregate_metrics_bytes([entry]) == aggregate_metrics_bytes(local)
    assert entry["agent_metrics"]["mean/reward"] == 0.5
    path, notes = write_run_aggregate_metrics(run, tmp_path / "rollouts.jsonl")
    assert path == tmp_path / "rollouts_aggregate_metrics.json" and notes == []
    assert path.read_bytes() == aggregate_metrics_bytes(local)
    with pytest.raises(OutputExists, match="--overwrite"):
        write_run_aggregate_metrics(run, tmp_path / "rollouts.jsonl")
    assert write_run_aggregate_metrics(run, tmp_path / "rollouts.jsonl", overwrite=True)[0] == path


@pytest.mark.django_db
def test_compare_reads_the_stored_entry_with_its_metric_order():
    from rollouts.evaluation.compare_sides import run_entries

    run = make_run(2, num_repeats=2)
    for t in range(2):
        for r in range(2):
            finish(key(run, t, r), S.SUCCEEDED, float(t == r))
    (entry,) = build_aggregate_metrics(run_aggregate_rows(run)).entries
    entry["agent_metrics"] = dict(reversed(list(entry["agent_metrics"].items())))  # an order jsonb would not keep
    Run.objects.filter(pk=run.pk).update(aggregate_metrics=entry)
    run = Run.objects.get(pk=run.pk)
    assert list(run_entries(run)[run.agent_name]["agent_metrics"]) == list(entry["agent_metrics"])
