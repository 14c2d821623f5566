"""Download names: every download is named after its run, a filtered one after its filter
too, so downloads never overwrite each other in a downloads folder; the run page shows the active
filter next to the filtered download links."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from rollouts.models import Rollout
from rollouts.review.query import RolloutFilterForm, export_filename

from .run_factories import finish, key, make_run

S = Rollout.Status


@pytest.fixture
def run(db):
    run = make_run(3)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.SUCCEEDED, 0.5)
    finish(key(run, 2), S.FAILED, kind="agent_timeout")
    return run


def _disposition(client, run, kind, query=""):
    response = client.get(reverse("run_export", args=[run.pk, kind]) + (f"?{query}" if query else ""))
    assert response.status_code == 200
    return response["Content-Disposition"]


def test_every_download_is_named_after_its_run(signed_in, run):
    n = run.pk
    assert _disposition(signed_in, run, "rollouts") == f'attachment; filename="run-{n}_rollouts.jsonl"'
    assert (
        _disposition(signed_in, run, "rollouts_failures") == f'attachment; filename="run-{n}_rollouts_failures.jsonl"'
    )
    assert _disposition(signed_in, run, "rollouts_materialized_inputs") == (
        f'attachment; filename="run-{n}_rollouts_materialized_inputs.jsonl"'
    )


def test_a_filtered_download_is_named_after_its_filter(signed_in, run):
    n = run.pk
    assert (
        _disposition(signed_in, run, "rollouts", "reward_min=1")
        == f'attachment; filename="run-{n}_rollouts_reward-ge-1.jsonl"'
    )
    assert _disposition(signed_in, run, "rollouts_failures", "status=failed&kind=agent_timeout") == (
        f'attachment; filename="run-{n}_rollouts_failures_status-failed_kind-agent_timeout.jsonl"'
    )
    assert _disposition(signed_in, run, "rollouts", "reward_min=-0.5&reward_max=0.25&task=2") == (
        f'attachment; filename="run-{n}_rollouts_reward-ge-minus0.5_reward-le-0.25_task-2.jsonl"'
    )
    # The materialised inputs are every key's whatever the filter, and named so.
    assert _disposition(signed_in, run, "rollouts_materialized_inputs", "reward_min=1") == (
        f'attachment; filename="run-{n}_rollouts_materialized_inputs.jsonl"'
    )
    # A sort is not a filter.
    assert _disposition(signed_in, run, "rollouts", "sort=-reward") == f'attachment; filename="run-{n}_rollouts.jsonl"'


def test_a_filter_value_that_is_unsafe_in_a_file_name_is_replaced():
    filt = RolloutFilterForm({"kind": 'a/b\\c"d\x00é'}, kinds=['a/b\\c"d\x00é'])
    assert export_filename(7, "rollouts_failures", filt) == "run-7_rollouts_failures_kind-a_b_c_d__.jsonl"


def test_the_run_page_names_its_downloads_and_shows_the_active_filter_next_to_them(signed_in, run):
    n = run.pk
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert f'download="run-{n}_rollouts.jsonl">run-{n}_rollouts.jsonl</a>' in html
    assert f">run-{n}_rollouts_materialized_inputs.jsonl</a>" in html
    assert 'id="filtered-downloads"' not in html
    html = signed_in.get(reverse("run", args=[run.pk]) + "?reward_min=1&status=succeeded").content.decode()
    block = re.search(r'<span class="muted" id="filtered-downloads">(.*?)</span>', html, re.S).group(1)
    assert '<strong class="filter-description">status succeeded · reward ≥ 1</strong>' in block
    assert (
        f'download="run-{n}_rollouts_status-succeeded_reward-ge-1.jsonl">run-{n}_rollouts_status-succeeded_reward-ge-1.jsonl</a>'
        in block
    )
    assert f">run-{n}_rollouts_failures_status-succeeded_reward-ge-1.jsonl</a>" in block
