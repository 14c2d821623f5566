"""A run's page: live progress and aggregates, the rollout table (filters, sort, pages, permalinks),
and the HTMX partials that keep it current."""

from __future__ import annotations

import math
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from rollouts.evaluation import run_summary
from rollouts.models import Rollout, Run, Worker

from .run_factories import finish, key, make_run, new_attempt

S = Rollout.Status


@pytest.fixture
def mixed_run(db):
    """5 tasks × 2 repeats = 10 keys, in every state a key can be in:

    (0,0) ok 1.0 · (0,1) ok 0.5 · (1,0) ok 0.0 · (1,1) failed twice (agent_timeout) ·
    (2,0) failed terminal · (2,1) failed then ok 1.0 · (3,0) running · (3,1) pending ·
    (4,0) cancelled · (4,1) ok 0.25
    """
    run = make_run(5, num_repeats=2, status=Run.Status.RUNNING, name="mixed")
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0, duration_ms=300, calls=4, tokens=100)
    finish(key(run, 0, 1), S.SUCCEEDED, 0.5, duration_ms=100, calls=2, tokens=10)
    finish(key(run, 1, 0), S.SUCCEEDED, 0.0, duration_ms=200, calls=3)
    finish(key(run, 1, 1), S.FAILED, kind="agent_timeout")
    finish(new_attempt(run, 1, 1), S.FAILED, kind="agent_timeout")
    finish(key(run, 2, 0), S.FAILED, kind="agent_invalid_response", terminal=True)
    finish(key(run, 2, 1), S.FAILED, kind="agent_http_error", tokens=20)
    finish(new_attempt(run, 2, 1), S.SUCCEEDED, 1.0, duration_ms=50, calls=1)
    Rollout.objects.filter(pk=key(run, 3, 0).pk).update(status=S.RUNNING)
    finish(key(run, 4, 0), S.CANCELLED)
    finish(key(run, 4, 1), S.SUCCEEDED, 0.25, duration_ms=400, calls=5)
    return run


def _url(run, **params):
    from urllib.parse import urlencode

    base = reverse("run", args=[run.pk])
    return f"{base}?{urlencode(params)}" if params else base


def _keys_in_table(response):
    """(task, rollout) keys of the table rows, in order."""
    return [
        tuple(map(int, m))
        for m in re.findall(r'class="rollout-link mono" href="[^"]*">(\d+):(\d+)</a>', response.content.decode())
    ]


# -- access ------------------------------------------------------------------------------------------
def test_it_requires_login(client, mixed_run):
    for url in (_url(mixed_run), reverse("run_live", args=[mixed_run.pk])):
        response = client.get(url)
        assert response.status_code == 302 and reverse("login") in response["Location"]


def test_an_unknown_run_is_404(signed_in):
    assert signed_in.get(reverse("run", args=[999])).status_code == 404
    assert signed_in.get(reverse("run_live", args=[999])).status_code == 404


# -- definitions and aggregates ----------------------------------------------------------------------
def test_progress_counts_a_key_done_when_its_latest_attempt_succeeded_or_failed(mixed_run):
    p = run_summary.run_summary(mixed_run).progress
    assert (p.total, p.done, p.succeeded, p.failed) == (10, 7, 5, 2)
    assert (p.pending, p.running, p.in_flight, p.killed_latest, p.failed_attempts) == (1, 1, 1, 1, 4)


def test_a_retried_key_is_not_done_while_its_new_attempt_waits(mixed_run):
    new_attempt(mixed_run, 2, 0)  # the terminal one, say after a manual resume
    p = run_summary.run_summary(mixed_run).progress
    assert (p.done, p.failed, p.pending) == (6, 1, 2)


def test_reward_aggregates_follow_nemo_gym_and_count_failures_as_zero_beside_it(mixed_run):
    r = run_summary.run_summary(mixed_run).reward
    rewards = [1.0, 0.5, 0.0, 1.0, 0.25]
    assert r.n == 5 and r.mean == pytest.approx(sum(rewards) / 5)
    assert (r.minimum, r.maximum, r.median) == (0.0, 1.0, 0.5)
    mean = sum(rewards) / 5
    assert r.std == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in rewards) / 4))  # ddof=1
    assert r.mean_with_failures == pytest.approx(sum(rewards) / 7) and r.n_with_failures == 7


def test_one_success_has_std_zero_and_an_even_count_has_the_middle_mean_as_median(db):
    run = make_run(4)
    finish(key(run, 0), S.SUCCEEDED, 0.3)
    assert run_summary.run_summary(run).reward.std == 0.0
    finish(key(run, 1), S.SUCCEEDED, 0.5)
    finish(key(run, 2), S.SUCCEEDED, 0.9)
    finish(key(run, 3), S.SUCCEEDED, 1.0)
    assert run_summary.run_summary(run).reward.median == pytest.approx(0.7)


def test_the_histogram_bins_success_rewards_and_shows_failed_keys_apart(mixed_run):
    s = run_summary.run_summary(mixed_run)
    assert len(s.histogram) == run_summary.HISTOGRAM_BINS
    assert sum(b.count for b in s.histogram) == 5
    assert (
        s.histogram[0].count == 1
        and s.histogram[2].count == 1
        and s.histogram[5].count == 1
        and s.histogram[-1].count == 2
    )
    assert s.failed_bar_percent == 100.0  # 2 failed keys, as tall as the tallest bin


def test_continuous_rewards_take_the_sql_path_and_agree_with_the_exact_one(db, monkeypatch, settings):
    settings.GYMWEB_SUMMARY_CACHE_S = 0
    run = make_run(9)
    rewards = [0.11, 0.5, 0.93, 0.27, 0.5, 0.64, 0.08, 0.99, 0.35]
    for i, reward in enumerate(rewards):
        finish(key(run, i), S.SUCCEEDED, reward)
    exact = run_summary.run_summary(run)
    monkeypatch.setattr(run_summary, "DISTINCT_REWARDS_MAX", 3)
    sql = run_summary.run_summary(run)
    assert sql.reward.median == exact.reward.median == 0.5
    assert sql.reward.std == pytest.approx(exact.reward.std) and sql.reward.mean == pytest.approx(exact.reward.mean)
    assert (sql.reward.minimum, sql.reward.maximum) == (exact.reward.minimum, exact.reward.maximum) == (0.08, 0.99)
    assert [b.count for b in sql.histogram] == [b.count for b in exact.histogram]
    assert sum(b.count for b in sql.histogram) == 9


def test_failure_kinds_tokens_and_attempts_are_summed(mixed_run):
    s = run_summary.run_summary(mixed_run)
    assert s.failure_kinds == [
        {"failure_kind": "agent_timeout", "n": 2},
        {"failure_kind": "agent_http_error", "n": 1},
        {"failure_kind": "agent_invalid_response", "n": 1},
    ]
    assert s.terminal_failures == 1
    assert s.tokens["input_tokens"] == 130 and s.tokens["total_tokens"] == 150 + 15 + 30
    assert s.usage_reported == 3 and s.finished_attempts == 9


def test_the_page_shows_progress_aggregates_and_failures(signed_in, mixed_run):
    response = signed_in.get(_url(mixed_run))
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" in body and "mixed" in body
    assert re.search(r"<strong>7</strong> / 10 done", body)
    assert "1 in flight" in body and "1 pending" in body
    assert 'id="reward-mean">0.5500<' in body and 'id="reward-mean-all">0.3929<' in body
    assert "median 0.5000" in body and "std 0.4472" in body
    assert "agent_timeout" in body and "agent_invalid_response" in body and "1 terminal" in body
    assert 'id="run-status">running<' in body
    assert "rollouts/min" in body
    for kind in ("rollouts", "rollouts_failures", "rollouts_materialized_inputs"):
        assert reverse("run_export", args=[mixed_run.pk, kind]) in body
    assert reverse("run_cancel", args=[mixed_run.pk]) in body
    assert reverse("run_retry", args=[mixed_run.pk]) not in body  # offered once the run has ended


def test_the_page_of_a_run_with_no_rollouts_finished_yet_renders(signed_in, db):
    run = make_run(3, status=Run.Status.RUNNING)
    body = signed_in.get(_url(run)).content.decode()
    assert "No finished rollouts yet" in body and "No failures" in body and "<strong>0</strong> / 3 done" in body


def _tokens_card(body: str) -> str:
    start = body.index('<div class="label">tokens</div>')
    return body[start : body.index('<div class="grid two">', start)]


def test_the_tokens_card_says_not_reported_when_no_attempt_reported_usage(signed_in, db):
    run = make_run(3, status=Run.Status.RUNNING)
    finish(key(run, 0), S.SUCCEEDED, 1.0)  # no usage
    finish(key(run, 1), S.FAILED, kind="agent_timeout")
    card = _tokens_card(signed_in.get(_url(run)).content.decode())
    assert "None" not in card
    assert "not reported" in card and "none of 2 finished attempts reported usage" in card


def test_the_tokens_card_shows_reported_numbers_with_thousands_separators(signed_in, db):
    run = make_run(2)
    finish(key(run, 0), S.SUCCEEDED, 1.0, tokens=10_000)
    finish(key(run, 1), S.SUCCEEDED, 1.0)  # this one reported nothing
    card = _tokens_card(signed_in.get(_url(run)).content.decode())
    assert 'id="tokens-total">15,000<' in card
    assert "in 10,000 (cached 0) · out 5,000 (reasoning 1)" in card
    assert "usage reported by 1 of 2 attempts" in card and "None" not in card


# -- workers -----------------------------------------------------------------------------------------
def _worker(name: str, seconds_ago: float):
    from datetime import timedelta

    from django.utils import timezone

    from rollouts.models import Worker

    return Worker.objects.create(name=name, host="h", pid=1, last_seen=timezone.now() - timedelta(seconds=seconds_ago))


def _live(client, run) -> str:
    return client.get(reverse("run_live", args=[run.pk]), HTTP_HX_REQUEST="true").content.decode()


def test_a_running_run_with_pending_work_and_no_live_worker_says_how_to_start_one(signed_in, mixed_run, settings):
    settings.GYMWEB_LEASE_S = 30
    _worker("dead:1", seconds_ago=31)  # its heartbeat stopped: not live
    for body in (signed_in.get(_url(mixed_run)).content.decode(), _live(signed_in, mixed_run)):
        assert 'id="no-worker"' in body
        text = re.sub(r"<[^>]+>", "", body)
        assert "No worker is running: start one with python manage.py qcluster (see README)" in text
        assert "0 workers live" in text


def test_the_live_part_counts_live_workers_and_has_no_warning_while_one_is_live(signed_in, mixed_run, settings):
    settings.GYMWEB_LEASE_S = 30
    _worker("a:1", seconds_ago=1)
    _worker("b:2", seconds_ago=60)
    body = _live(signed_in, mixed_run)
    assert 'id="live-workers"' in body and "1 worker live" in body
    assert "No worker is running" not in body
    _worker("c:3", seconds_ago=2)
    assert "2 workers live" in _live(signed_in, mixed_run)


def test_no_worker_warning_when_nothing_waits_or_the_run_is_final(signed_in, db):
    done = make_run(1, status=Run.Status.RUNNING)
    finish(key(done, 0), S.SUCCEEDED, 1.0)  # running, nothing pending (about to complete)
    assert "No worker is running" not in _live(signed_in, done)
    final = make_run(2, status=Run.Status.COMPLETED)
    body = _live(signed_in, final)
    assert "No worker is running" not in body and "live-workers" not in body


def test_the_live_part_takes_one_query_more_for_the_workers_however_many_there_are(signed_in, mixed_run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def count():
        with CaptureQueriesContext(connection) as ctx:
            _live(signed_in, mixed_run)
        return len(ctx.captured_queries)

    count()  # warms the cache of finished aggregates
    before = count()
    for i in range(20):
        _worker(f"w:{i}", seconds_ago=1)
    assert count() == before
    with CaptureQueriesContext(connection) as ctx:
        _live(signed_in, mixed_run)
    assert sum("rollouts_worker" in q["sql"] for q in ctx.captured_queries) == 1


# -- imported runs -----------------------------------------------------------------------------------
def test_an_imported_run_shows_its_agent_name_and_that_it_has_no_agent_url(signed_in, db):
    run = Run.objects.create(name="imp", status=Run.Status.IMPORTED, agent_name="my_agent")
    body = signed_in.get(_url(run)).content.decode()
    summary = body[body.index('<details class="card settings">') : body.index("</summary>")]
    assert "my_agent" in summary and "imported (no agent URL)" in summary
    assert "(no agent)" not in summary and "(no env)" not in summary


# -- live updates ---# -- live updates ------------------------------------------------------------------------------------
def test_the_live_part_polls_while_the_run_is_running(signed_in, mixed_run):
    body = signed_in.get(_url(mixed_run)).content.decode()
    live = re.search(r'<section id="run-live"[^>]*>', body).group(0)
    assert 'hx-trigger="every 2s"' in live and reverse("run_live", args=[mixed_run.pk]) in live
    response = signed_in.get(reverse("run_live", args=[mixed_run.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    partial = response.content.decode()
    assert "<html" not in partial and partial.lstrip().startswith('<section id="run-live"')
    assert 'hx-trigger="every 2s"' in partial


def test_the_live_part_of_a_final_run_has_no_trigger_so_polling_stops(signed_in, mixed_run):
    Run.objects.filter(pk=mixed_run.pk).update(status=Run.Status.COMPLETED)
    partial = signed_in.get(reverse("run_live", args=[mixed_run.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in partial.split(">", 1)[0] and "every 2s" not in partial
    assert 'id="run-status" title="2 of 7 finished rollouts failed">completed with failures<' in partial
    assert "every 2s" not in signed_in.get(_url(mixed_run)).content.decode()


def test_the_live_part_asks_for_a_table_refresh_only_when_rollouts_changed(signed_in, mixed_run):
    live = reverse("run_live", args=[mixed_run.pk])
    first = signed_in.get(live, HTTP_HX_REQUEST="true")
    seen = re.search(r"\?seen=([^\"]+)\"", first.content.decode()).group(1)
    same = signed_in.get(f"{live}?seen={seen}", HTTP_HX_REQUEST="true")
    assert "HX-Trigger" not in same
    finish(key(mixed_run, 3, 0), S.SUCCEEDED, 1.0)
    changed = signed_in.get(f"{live}?seen={seen}", HTTP_HX_REQUEST="true")
    assert changed["HX-Trigger"] == "rollouts-changed"
    assert "<strong>8</strong> / 10 done" in changed.content.decode()  # no stale aggregate
    assert "no-cache" in changed["Cache-Control"]


def test_an_htmx_request_gets_the_rollout_table_partial_and_responses_vary_on_it(signed_in, mixed_run):
    full = signed_in.get(_url(mixed_run))
    partial = signed_in.get(_url(mixed_run, status="failed"), HTTP_HX_REQUEST="true")
    assert "HX-Request" in full["Vary"] and "HX-Request" in partial["Vary"]
    body = partial.content.decode()
    assert body.lstrip().startswith('<section id="rollouts"') and "<html" not in body and 'id="run-live"' not in body
    assert 'hx-trigger="rollouts-changed from:body"' in body
    assert len(_keys_in_table(partial)) == 4


def test_a_history_restore_gets_the_full_page(signed_in, mixed_run):
    response = signed_in.get(
        _url(mixed_run, status="failed"), HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true"
    )
    body = response.content.decode()
    assert "<html" in body and 'id="run-live"' in body and 'id="rollouts"' in body


# -- the rollout table ---------------------------------------------------------------------------
def test_the_table_lists_every_attempt_in_task_order_by_default(signed_in, mixed_run):
    keys = _keys_in_table(signed_in.get(_url(mixed_run)))
    assert keys == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 1), (2, 0), (2, 1), (2, 1), (3, 0), (3, 1), (4, 0), (4, 1)]


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"status": "failed"}, [(1, 1), (1, 1), (2, 0), (2, 1)]),
        ({"status": "succeeded"}, [(0, 0), (0, 1), (1, 0), (2, 1), (4, 1)]),
        ({"kind": "agent_timeout"}, [(1, 1), (1, 1)]),
        ({"reward_min": "1"}, [(0, 0), (2, 1)]),
        ({"reward_min": "0.1", "reward_max": "0.6"}, [(0, 1), (4, 1)]),
        # a failed attempt's stored 0.0 is the file's placeholder, not a reward: bounds skip it
        ({"reward_max": "0"}, [(1, 0)]),
        ({"reward_min": "0", "reward_max": "0.3"}, [(1, 0), (4, 1)]),
        ({"task": "2"}, [(2, 0), (2, 1), (2, 1)]),
        ({"status": "succeeded", "sort": "-reward"}, [(0, 0), (2, 1), (0, 1), (4, 1), (1, 0)]),
        ({"status": "succeeded", "sort": "duration"}, [(2, 1), (0, 1), (1, 0), (0, 0), (4, 1)]),
        ({"status": "succeeded", "sort": "-calls"}, [(4, 1), (0, 0), (1, 0), (0, 1), (2, 1)]),
    ],
)
def test_the_table_filters_and_sorts_from_the_querystring(signed_in, mixed_run, params, expected):
    response = signed_in.get(_url(mixed_run, **params))
    assert _keys_in_table(response) == expected


def test_rows_link_to_the_rollout_page_keeping_the_filter(signed_in, mixed_run):
    body = signed_in.get(_url(mixed_run, status="failed", sort="-reward")).content.decode()
    first = Rollout.objects.filter(run=mixed_run, status=S.FAILED).order_by("-reward", "-id").first()
    link = reverse("rollout", args=[mixed_run.pk, first.pk]) + "?status=failed&amp;sort=-reward"
    assert f'href="{link}"' in body


def test_the_filter_form_keeps_its_values_and_offers_the_run_s_failure_kinds(signed_in, mixed_run):
    body = signed_in.get(_url(mixed_run, kind="agent_timeout", reward_min="0")).content.decode()
    assert '<option value="agent_timeout" selected>' in body
    assert '<option value="agent_http_error">' in body
    assert 'name="reward_min" value="0.0"' in body or 'name="reward_min" value="0"' in body


def test_an_invalid_filter_value_is_reported_and_no_rows_are_shown(signed_in, mixed_run):
    response = signed_in.get(_url(mixed_run, reward_min="lots", status="failed"))
    assert response.status_code == 200
    assert "reward_min" in response.content.decode() and "Enter a number" in response.content.decode()
    # Rows filtered by the other filters alone would pass for the filtered ones.
    assert _keys_in_table(response) == []
    assert len(_keys_in_table(signed_in.get(_url(mixed_run, status="failed")))) == 4


def test_a_filter_on_a_name_that_is_no_field_is_reported_and_no_rows_are_shown(signed_in, mixed_run):
    response = signed_in.get(_url(mixed_run, **{"f.bogus": "1"}))
    assert response.status_code == 200
    assert "is not a field" in response.content.decode()
    assert _keys_in_table(response) == []


def test_the_table_is_paginated_and_pages_keep_the_filter(signed_in, db):
    run = make_run(120, status=Run.Status.COMPLETED)
    for r in Rollout.objects.filter(run=run, task_index__lt=110):
        finish(r, S.SUCCEEDED, 1.0)
    first = signed_in.get(_url(run, status="succeeded"))
    assert len(_keys_in_table(first)) == 50
    body = first.content.decode()
    assert "page 1 of 3" in body and "?status=succeeded&amp;page=2" in body
    third = signed_in.get(_url(run, status="succeeded", page="3"))
    assert _keys_in_table(third) == [(t, 0) for t in range(100, 110)]
    assert signed_in.get(_url(run, page="99")).status_code == 200  # past the end: the last page


def test_sort_links_toggle_direction_and_keep_the_filter(signed_in, mixed_run):
    body = signed_in.get(_url(mixed_run, status="failed", sort="-reward")).content.decode()
    assert 'href="/runs/%d/?status=failed&amp;sort=reward"' % mixed_run.pk in body
    assert 'href="/runs/%d/?status=failed&amp;sort=-duration"' % mixed_run.pk in body


# -- untrusted text ------------------------------------------------------------------------------
def test_text_from_agents_and_envs_is_escaped(signed_in, db):
    evil = '<script>alert(1)</script><img src=x hx-get="/runs/new/" hx-trigger="load">'
    run = make_run(2, name=evil, agent_url="http://127.0.0.1:1/<b>x</b>")
    finish(key(run, 0), S.FAILED, kind="agent_bad_json", error=evil)
    Rollout.objects.filter(pk=key(run, 0).pk).update(failure_kind='x"><script>k</script>')
    body = signed_in.get(_url(run)).content.decode()
    assert (
        "<script>alert(1)" not in body
        and "<script>k" not in body
        and "<img src=x" not in body
        and "<b>x</b>" not in body
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


# -- speed -----------------------------------------------------------------------------------------
def test_the_page_takes_a_fixed_number_of_queries_however_many_rollouts(signed_in, db):
    small, big = make_run(3), make_run(200)
    for run in (small, big):
        for i, r in enumerate(Rollout.objects.filter(run=run)):
            finish(r, S.SUCCEEDED if i % 3 else S.FAILED, (i % 10) / 10, kind="agent_timeout")
    counts = []
    for run in (small, big):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as ctx:
            assert signed_in.get(_url(run)).status_code == 200
        counts.append(len(ctx.captured_queries))
    # 21: the retryable keys of a final run with failures; 22: the run's task and verify fields (a sample, cached);
    # 23: the workers that served the run (one grouped query)
    assert counts[0] == counts[1] and counts[1] <= 23


# -- workers serving the run -------------------------------------------------------------------------
def test_the_live_part_lists_the_workers_serving_the_run_with_their_share(signed_in, db, settings):
    settings.GYMWEB_LEASE_S = 30
    run = make_run(6, status=Run.Status.RUNNING)
    Worker.objects.create(name="m1:11:aa", host="m1", pid=11, last_seen=timezone.now())
    # "m2:22:bb" has no Worker row any more (its machine was lost): listed from its rollouts, gone
    for i, (worker, status) in enumerate(
        [
            ("m1:11:aa", S.SUCCEEDED),
            ("m1:11:aa", S.SUCCEEDED),
            ("m1:11:aa", S.RUNNING),
            ("m2:22:bb", S.FAILED),
            ("m2:22:bb", S.INTERRUPTED),
            ("", S.PENDING),
        ]
    ):
        Rollout.objects.filter(pk=key(run, i).pk).update(status=status, worker=worker)
    body = _live(signed_in, run)
    start = body.index('id="run-workers"')
    section = body[start : body.index("</details>", start)]
    rows = [re.sub(r"<[^>]+>|\s+", " ", r).split() for r in re.findall(r"<tr>(.*?)</tr>", section, re.S)[1:]]
    assert rows == [
        ["m1:11:aa", "m1", "1", "2", "67%", "live"],
        ["m2:22:bb", "m2", "0", "1", "33%", "gone"],
    ]
    assert "2 worker processes served this run" in re.sub(r"<[^>]+>", "", section)
    assert "share: the part of this run's ended rollouts that each worker process ran" in section.replace("&#x27;", "'")


def test_a_run_no_worker_touched_shows_no_workers_table(signed_in, mixed_run):
    assert 'id="run-workers"' not in _live(signed_in, mixed_run)


def test_worker_names_are_escaped(signed_in, db):
    run = make_run(1, status=Run.Status.RUNNING)
    Rollout.objects.filter(pk=key(run, 0).pk).update(status=S.RUNNING, worker="<b>x</b>:1:a")
    body = _live(signed_in, run)
    assert "<b>x</b>" not in body and "&lt;b&gt;x&lt;/b&gt;:1:a" in body


@pytest.mark.parametrize(
    "params, field, words",
    [
        ({"reward_min": "1", "reward_max": "0"}, "reward_min", "above reward_max"),
        ({"reward_min": "nan"}, "reward_min", "Enter a number"),
        ({"reward_max": "1e400"}, "reward_max", "Enter a number"),
    ],
)
def test_an_impossible_reward_range_is_reported_not_shown_as_no_rollouts(signed_in, mixed_run, params, field, words):
    response = signed_in.get(_url(mixed_run, **params))
    assert response.status_code == 200
    body = response.content.decode()
    assert f"{field}: {words}" in body
    assert "No rollouts match these filters." not in body
