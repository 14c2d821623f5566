"""A run's page and the runs list tell the outcome as it is: the badge names a completed run with
failures or whose every key failed, the Retry button is offered only where it would run something and
is named for what it runs, and rates are shown only over windows that exist."""

from __future__ import annotations

import re
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from rollouts.collection import runs
from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run

S = Rollout.Status


def _page(client, run) -> str:
    return client.get(reverse("run", args=[run.pk])).content.decode()


def _badge(html: str) -> str:
    match = re.search(r'id="run-status"[^>]*>([^<]+)<', html)
    assert match, "no status badge"
    return match.group(1).strip()


def _retry(html: str):
    match = re.search(r'id="retry-run">([^<]+)<', html)
    return match.group(1).strip() if match else None


def test_a_completed_run_whose_every_key_failed_reads_all_failed_on_its_page_and_in_the_list(signed_in, db):
    run = make_run(2)
    finish(key(run, 0), S.FAILED, kind="agent_timeout")
    finish(key(run, 1), S.FAILED, kind="agent_http_error")
    assert _badge(_page(signed_in, run)) == "all failed"
    assert ">all failed<" in signed_in.get(reverse("runs")).content.decode()


def test_a_completed_run_with_some_failed_keys_reads_completed_with_failures(signed_in, db):
    run = make_run(2)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.FAILED, kind="agent_timeout")
    assert _badge(_page(signed_in, run)) == "completed with failures"


def test_a_completed_run_without_failures_reads_completed(signed_in, db):
    run = make_run(1)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    assert _badge(_page(signed_in, run)) == "completed"


def test_retry_is_not_offered_when_every_failure_is_terminal(signed_in, db):
    run = make_run(2)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.FAILED, kind="agent_invalid_response", terminal=True)
    assert _retry(_page(signed_in, run)) is None


def test_retry_is_named_for_the_failed_and_the_not_run_keys_it_runs(signed_in, db):
    run = make_run(4)
    finish(key(run, 0), S.FAILED, kind="agent_timeout")
    finish(key(run, 1), S.FAILED, kind="agent_invalid_response", terminal=True)
    finish(key(run, 2), S.CANCELLED)
    finish(key(run, 3), S.CANCELLED)
    assert _retry(_page(signed_in, run)) == "Retry 1 failed and run 2 not run"


def test_a_cancelled_run_without_failures_offers_to_run_what_was_not_run(signed_in, db):
    run = make_run(2, status=Run.Status.CANCELLED)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.CANCELLED)
    assert _retry(_page(signed_in, run)) == "Run the 1 not run"


def test_a_run_under_a_minute_old_shows_no_last_minute_rate_and_says_what_its_rate_is_over(signed_in, db):
    run = make_run(3, status=Run.Status.RUNNING)
    Run.objects.filter(pk=run.pk).update(started=timezone.now() - timedelta(seconds=20))
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    html = _page(signed_in, run)
    assert "last minute" not in html
    assert re.search(r"rollouts/min over its first 2\d s", html)


def test_a_run_older_than_a_minute_shows_both_rates(signed_in, db):
    run = make_run(3, status=Run.Status.RUNNING)  # started two minutes ago
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    html = _page(signed_in, run)
    assert "rollouts/min (last minute)" in html and "rollouts/min overall" in html


def test_runs_slash_leads_to_the_runs_list(signed_in, db):
    response = signed_in.get("/runs/?page=2")
    assert response.status_code == 302 and response["Location"] == reverse("runs") + "?page=2"


def test_a_long_run_name_wraps_between_its_parts_and_stays_escaped(signed_in, db):
    make_run(1, name="swebench/<b>x</b>_tasks.jsonl")
    html = signed_in.get(reverse("runs")).content.decode()
    assert "swebench/<wbr>&lt;b&gt;x&lt;/<wbr>b&gt;_<wbr>tasks.<wbr>jsonl" in html
    assert "<b>x</b>" not in html


def test_a_cancelled_placeholder_that_a_later_attempt_replaced_leaves_the_table_and_review(signed_in, db):
    from .run_factories import new_attempt

    run = make_run(2)
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1, 0), S.CANCELLED)
    retried = new_attempt(run, 1, 0)
    finish(retried, S.SUCCEEDED, 0.5)
    html = _page(signed_in, run)
    table = html.split('id="rollout-table"', 1)[1]
    assert table.count('class="rollout-link mono"') == 2  # one row per key: the placeholder is gone
    assert "cancelled" not in table
    # It stays under its key: the retried rollout's page lists it among the key's attempts.
    page = signed_in.get(reverse("rollout", args=[run.pk, retried.pk])).content.decode()
    assert page.count('class="attempt') == 2 and "cancelled" in page


def test_the_new_run_form_pre_selects_the_dataset_uploaded_last(signed_in, db):
    from rollouts.collection.datasets import read_jsonl

    from .run_factories import dataset_lines

    older = runs.store_dataset(read_jsonl(dataset_lines(2)), "older.jsonl")
    newer = runs.store_dataset(read_jsonl(dataset_lines(3)), "newer.jsonl")
    html = signed_in.get(reverse("run_new")).content.decode()
    assert re.search(rf'<option value="{newer.pk}"[^>]*selected', html)
    assert not re.search(rf'<option value="{older.pk}"[^>]*selected', html)
