"""A run's profile page (NeMo Gym's ``gym eval profile`` + gymweb's pass@k), its four files, the
env's /aggregate_metrics reply, and the run's charts (latency, failures by kind over time)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.evaluation.profile_report import write_run_profile
from rollouts.models import AgentCall, Rollout, Run

from .run_factories import finish, key, make_run, new_attempt
from .test_xss import EVIL, assert_inert

S = Rollout.Status
KINDS = ("reward_profiling", "agent_metrics", "repeat_level_metrics", "gymweb_pass_at_k")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def mixed(db):
    """4 tasks × 2 repeats: task 0 = 1.0, 1.0 · task 1 = 0.0, 0.5 · task 2 = failed, 0.5 ·
    task 3 = failed (twice), failed: no success row at all."""
    run = make_run(4, num_repeats=2, name="mixed")
    finish(key(run, 0, 0), S.SUCCEEDED, 1.0, tokens=100)
    finish(key(run, 0, 1), S.SUCCEEDED, 1.0, tokens=120)
    finish(key(run, 1, 0), S.SUCCEEDED, 0.0)
    finish(key(run, 1, 1), S.SUCCEEDED, 0.5)
    finish(key(run, 2, 0), S.FAILED, kind="agent_timeout")
    finish(key(run, 2, 1), S.SUCCEEDED, 0.5)
    finish(key(run, 3, 0), S.FAILED, kind="agent_timeout")
    finish(new_attempt(run, 3, 0), S.FAILED, kind="agent_http_error")
    finish(key(run, 3, 1), S.FAILED, kind="verify_failed")
    return run


def _url(run, **params):
    from urllib.parse import urlencode

    base = reverse("run_profile", args=[run.pk])
    return f"{base}?{urlencode(params)}" if params else base


def _task_order(response) -> list[int]:
    return [int(t) for t in re.findall(r'<tr id="task-(\d+)"', response.content.decode())]


def _task_row(response, task: int) -> str:
    html = response.content.decode()
    match = re.search(rf'<tr id="task-{task}".*?</tr>\s*(?=<tr id="task-|</tbody>)', html, re.S)
    assert match, f"no row for task {task}"
    return match.group(0)


# -- access ------------------------------------------------------------------------------------
def test_every_profile_page_requires_login(client, mixed):
    for url in (
        _url(mixed),
        reverse("run_profile_file", args=[mixed.pk, "agent_metrics"]),
        reverse("run_charts", args=[mixed.pk]),
    ):
        response = client.get(url)
        assert response.status_code == 302 and reverse("login") in response["Location"]


def test_an_unknown_run_or_file_kind_is_404(signed_in, mixed):
    assert signed_in.get(reverse("run_profile", args=[999])).status_code == 404
    assert signed_in.get(reverse("run_profile_file", args=[999, "agent_metrics"])).status_code == 404
    assert signed_in.get(reverse("run_profile_file", args=[mixed.pk, "rollouts"])).status_code == 404
    assert signed_in.get(reverse("run_profile_file", args=[mixed.pk, "..%2Fsettings"])).status_code == 404
    assert signed_in.get(reverse("run_charts", args=[999])).status_code == 404


# -- a real run ----------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::UserWarning")  # NeMo Gym's note on collapsed intervals (the page shows it)
@pytest.mark.django_db(transaction=True)
def test_a_run_collected_in_process_shows_every_task_with_mean_reward_one_and_pass_at_k(
    client, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path, tmp_path
):
    from rollouts.workers.process import run_in_process

    cache.clear()
    client.force_login(django_user_model.objects.create_user("erin", password="x" * 12))
    with counter_tasks_path.open("rb") as fh:
        run = runs.create_run(
            read_jsonl(fh), name="counter", agent_url=counter_agent_url, env_url=counter_env_url, num_repeats=3
        )
    runs.launch(run)
    run_in_process(run.pk)
    assert Rollout.objects.filter(run=run, status=S.SUCCEEDED).count() == 15

    response = client.get(_url(run))
    assert response.status_code == 200
    assert _task_order(response) == [0, 1, 2, 3, 4]
    for task in range(5):
        row = _task_row(response, task)
        assert f'href="{reverse("run", args=[run.pk])}?task={task}#rollouts"' in row
        cells = re.findall(r'<td class="num[^"]*">([^<]*)', row)
        assert cells[0] == "3"  # 3 success rows of 3 expected
        assert cells[1:6] == ["1.0", "1.0", "0.0", "1.0", "1.0"]  # mean, median, std, min, max
        assert "pass@k" in row and row.count(">1.0<") >= 3  # pass@1, pass@2, pass@3 in the details
        # compact rollout_infos: one chip per rollout, the numbers in its tooltip
        chips = re.findall(
            r'<span class="ri ok" title="rollout (\d) · reward 1.0 · input_tokens \d+ · output_tokens \d+ · total_tokens \d+',
            row,
        )
        assert chips == ["0", "1", "2"]
    html = response.content.decode()
    assert "5</strong> tasks" in html and "15</strong> of 15 rollouts have a success row" in html
    # agent-level metrics with the across-repeats figures and their 95% interval
    assert "across repeats" in html and "95% CI" in html and "remote_agent" in html
    agents = re.search(r'<table class="metrics">.*?</table>', html, re.S).group(0)
    reward_row = re.search(r'<tr class="key-row">.*?</tr>', agents, re.S).group(0)
    assert "reward" in reward_row and "[1.0, 1.0]" in reward_row  # identical repeats: the interval collapses
    assert any("input_tokens" in r for r in re.findall(r"<tr>.*?</tr>", agents, re.S))
    # gymweb's overall pass@k for k = 1..3 and the curve
    assert 'id="chart-pass-at-k"' in html and "pass@1[avg-of-k]" in html
    table = re.search(r'<table class="compact pass-table">.*?</table>', html, re.S).group(0)
    assert re.findall(r"<tr><td>(\d)</td><td class=\"num\">([^<]*)</td>", table) == [
        ("1", "1.0"),
        ("2", "1.0"),
        ("3", "1.0"),
    ]
    # the downloads are the files the profile command writes
    written = write_run_profile(run, tmp_path)
    assert len(written) == len(KINDS)
    for path, kind in zip(written, KINDS):
        assert client.get(reverse("run_profile_file", args=[run.pk, kind])).content == path.read_bytes()


# -- files -----------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_four_downloads_equal_write_run_profile_s_files(signed_in, mixed, tmp_path):
    paths = write_run_profile(mixed, tmp_path)
    assert len(paths) == len(KINDS)
    for kind, path in zip(KINDS, paths):
        response = signed_in.get(reverse("run_profile_file", args=[mixed.pk, kind]))
        assert response.status_code == 200
        assert response.content == path.read_bytes()
        assert response["Content-Disposition"] == f'attachment; filename="{path.name}"'
        assert response["X-Content-Type-Options"] == "nosniff"
    assert (
        json.loads(signed_in.get(reverse("run_profile_file", args=[mixed.pk, "gymweb_pass_at_k"])).content)["overall"][
            0
        ]["num_tasks"]
        == 4
    )


def test_the_page_links_the_four_files(signed_in, mixed):
    html = signed_in.get(_url(mixed)).content.decode()
    for kind in KINDS:
        assert reverse("run_profile_file", args=[mixed.pk, kind]) in html
    assert "rollouts_reward_profiling.jsonl" in html and "rollouts_gymweb_pass_at_k.json" in html


# -- tasks: rows, sorting, pages -------------------------------------------------------------------
def test_a_task_without_a_success_row_is_listed_with_its_pass_at_k_of_zero(signed_in, mixed):
    response = signed_in.get(_url(mixed))
    row = _task_row(response, 3)
    assert "no success row" in row and '<td class="num">0<span class="muted">/2</span>' in row
    assert "0.0" in row  # pass@1 with failures as 0
    row2 = _task_row(response, 2)
    cells = re.findall(r'<td class="num[^"]*">([^<]*)', row2)
    assert cells[1] == "0.5"  # NeMo Gym's mean over the one success
    assert "0.25" in row2  # gymweb's pass@1 counts the failed key as 0


def test_tasks_sort_by_mean_reward_both_ways_with_unprofiled_tasks_last(signed_in, mixed):
    assert _task_order(signed_in.get(_url(mixed))) == [0, 1, 2, 3]
    assert _task_order(signed_in.get(_url(mixed, sort="-task"))) == [3, 2, 1, 0]
    assert _task_order(signed_in.get(_url(mixed, sort="-reward"))) == [0, 2, 1, 3]
    assert _task_order(signed_in.get(_url(mixed, sort="reward"))) == [1, 2, 0, 3]
    assert _task_order(signed_in.get(_url(mixed, sort="bogus"))) == [0, 1, 2, 3]


def test_sort_links_toggle_the_direction(signed_in, mixed):
    html = signed_in.get(_url(mixed, sort="-reward")).content.decode()
    assert f'href="{_url(mixed, sort="reward")}"' in html  # clicking again sorts ascending
    assert f'href="{_url(mixed)}"' in html  # task order is the plain URL


def test_a_long_task_list_is_paged(signed_in, db):
    run = make_run(60)
    for t in range(60):
        finish(key(run, t), S.SUCCEEDED, t / 60)
    first = signed_in.get(_url(run))
    assert _task_order(first) == list(range(50)) and "page 1 of 2" in first.content.decode()
    assert _task_order(signed_in.get(_url(run, page=2))) == list(range(50, 60))
    assert _task_order(signed_in.get(_url(run, sort="-reward", page=2))) == list(range(9, -1, -1))


def test_an_htmx_request_gets_only_the_task_table(signed_in, mixed):
    response = signed_in.get(_url(mixed, sort="-reward"), HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="profile-tasks"') and "<html" not in html
    assert _task_order(response) == [0, 2, 1, 3]
    assert "HX-Request" in response["Vary"]


# -- cache -------------------------------------------------------------------------------------------
def test_the_profile_is_cached_until_another_attempt_finishes(signed_in, mixed, monkeypatch):
    from rollouts.web import profile_views

    calls = []
    real = profile_views.profile_run
    monkeypatch.setattr(profile_views, "profile_run", lambda run: calls.append(run.pk) or real(run))
    signed_in.get(_url(mixed))
    signed_in.get(_url(mixed, sort="-reward"))
    assert len(calls) == 1
    finish(new_attempt(mixed, 3, 1), S.SUCCEEDED, 1.0)
    response = signed_in.get(_url(mixed))
    assert len(calls) == 2
    assert "no success row" not in _task_row(response, 3)


def test_a_cached_profile_page_costs_a_handful_of_queries(signed_in, mixed, django_assert_max_num_queries):
    signed_in.get(_url(mixed))
    with django_assert_max_num_queries(8):
        assert signed_in.get(_url(mixed, sort="-reward")).status_code == 200


def test_without_a_cache_every_view_computes_afresh(signed_in, mixed, settings):
    settings.GYMWEB_SUMMARY_CACHE_S = 0
    assert signed_in.get(_url(mixed)).status_code == 200
    finish(new_attempt(mixed, 3, 1), S.SUCCEEDED, 1.0)
    assert "no success row" not in _task_row(signed_in.get(_url(mixed)), 3)


# -- notes, aggregate metrics --------------------------------------------------------------------------
def test_nemo_gym_s_note_about_missing_repeats_is_shown(signed_in, mixed):
    html = signed_in.get(_url(mixed)).content.decode()
    assert "missing rollouts for some tasks" in html


def test_the_env_s_aggregate_metrics_are_tables_with_groups_collapsed_and_raw_json(signed_in, mixed):
    Run.objects.filter(pk=mixed.pk).update(
        aggregate_metrics={
            "key_metrics": {"mean/reward": 0.625, "accuracy": 0.75},
            "agent_metrics": {"mean/reward": 0.625, "pass@1": 0.5},
            "group_level_metrics": [
                {"_ng_task_index": 0, "mean/reward": 1.0},
                {"_ng_task_index": 1, "mean/reward": 0.25},
            ],
        }
    )
    html = signed_in.get(_url(mixed)).content.decode()
    section = re.search(r'<section class="card profile-aggregate".*?</section>', html, re.S).group(0)
    assert "<h3>key_metrics</h3>" in section and "accuracy" in section and "0.75" in section
    assert "<h3>agent_metrics</h3>" in section and "pass@1" in section
    assert re.search(r"<details class=\"agg-groups\">\s*<summary>group_level_metrics", section)
    assert "(2 entries)" in section
    assert "raw JSON" in section and "&quot;key_metrics&quot;: {" in section


def test_an_aggregate_metrics_error_is_shown(signed_in, mixed):
    Run.objects.filter(pk=mixed.pk).update(
        aggregate_metrics_error="http://env/aggregate_metrics answered HTTP 500: boom"
    )
    html = signed_in.get(_url(mixed)).content.decode()
    assert "answered HTTP 500: boom" in html


# -- charts ----------------------------------------------------------------------------------------------
def test_the_run_page_links_the_profile_and_loads_its_charts(signed_in, mixed):
    html = signed_in.get(reverse("run", args=[mixed.pk])).content.decode()
    assert f'href="{_url(mixed)}"' in html
    assert f'href="{reverse("compare")}?a={mixed.pk}"' in html
    assert f'hx-get="{reverse("run_charts", args=[mixed.pk])}" hx-trigger="revealed, run-finished from:body"' in html


def test_failures_by_kind_over_time_count_every_failed_attempt(signed_in, mixed):
    html = signed_in.get(reverse("run_charts", args=[mixed.pk])).content.decode()
    chart = re.search(r'<figure class="chart" id="chart-failures-over-time">.*?</figure>', html, re.S).group(0)
    assert '<title id="chart-failures-over-time-title">Failed attempts by kind over time</title>' in chart
    legend = re.findall(r'<span class="mono">([^<]+)</span></li>', chart)
    assert legend == ["agent_timeout", "agent_http_error", "verify_failed"]
    totals = [int(t) for t in re.findall(r'<td class="num">(\d+)</td></tr>', chart)]
    assert sum(totals) == 4


def test_failures_spread_over_time_fall_into_round_buckets(signed_in, db):
    run = make_run(3, status=Run.Status.COMPLETED)
    start = run.started
    for t, minutes in enumerate((0, 5, 30)):
        r = finish(key(run, t), S.FAILED, kind="agent_timeout")
        Rollout.objects.filter(pk=r.pk).update(finished=start + timedelta(minutes=minutes))
    Run.objects.filter(pk=run.pk).update(finished=start + timedelta(minutes=30))
    html = signed_in.get(reverse("run_charts", args=[run.pk])).content.decode()
    assert "buckets of 2 min" in html
    chart = re.search(r'id="chart-failures-over-time">.*?</figure>', html, re.S).group(0)
    assert len(re.findall(r'<rect class="bar s0"', chart)) == 3


def test_the_latency_histogram_buckets_agent_calls_of_finished_attempts(signed_in, mixed):
    now = timezone.now()
    done = key(mixed, 0, 0)
    for i, latency in enumerate((150.0, 180.0, 450.0, 1200.0)):
        AgentCall.objects.create(rollout=done, index=i, started=now, latency_ms=latency)
    live = Rollout.objects.create(run=mixed, task=done.task, task_index=9, rollout_index=0, status=S.RUNNING)
    AgentCall.objects.create(rollout=live, index=0, started=now, latency_ms=99999.0)  # not finished: left out
    html = signed_in.get(reverse("run_charts", args=[mixed.pk])).content.decode()
    chart = re.search(r'id="chart-latency">.*?</figure>', html, re.S).group(0)
    rows = re.findall(r'<tr><td class="mono">([^<]+)</td><td class="num">(\d+)</td></tr>', chart)
    assert rows == [("100 ms–200 ms", "2"), ("200 ms–500 ms", "1"), ("500 ms–1 s", "0"), ("1 s–2 s", "1")]
    assert "4 calls of finished attempts" in html


def test_charts_of_a_run_without_data_say_so(signed_in, db):
    run = make_run(2)
    html = signed_in.get(reverse("run_charts", args=[run.pk])).content.decode()
    assert "No failed attempts." in html and "No agent calls of finished attempts yet." in html
    assert "<svg" not in html


def test_the_charts_of_a_live_run_refresh_themselves_and_stop_when_final(signed_in, db):
    live = make_run(1, status=Run.Status.RUNNING)
    assert (
        'hx-trigger="every 10s, run-finished from:body"'
        in signed_in.get(reverse("run_charts", args=[live.pk])).content.decode()
    )
    done = make_run(1)
    assert "hx-trigger" not in signed_in.get(reverse("run_charts", args=[done.pk])).content.decode()


# -- untrusted text ----------------------------------------------------------------------------------------
def test_the_profile_and_charts_are_inert_whatever_the_run_holds(signed_in, db):
    run = make_run(2, num_repeats=2, name=f"run {EVIL}", agent_name=EVIL[:200])
    for t in range(2):
        finish(key(run, t, 0), S.SUCCEEDED, 1.0)
        finish(key(run, t, 1), S.FAILED, kind=EVIL[:40])
    AgentCall.objects.create(rollout=key(run, 0, 0), index=0, started=timezone.now(), latency_ms=12.0)
    Run.objects.filter(pk=run.pk).update(
        aggregate_metrics={
            "key_metrics": {EVIL: EVIL},
            "agent_metrics": [{"agent_ref": {"name": EVIL}, EVIL: 1}],
            "group_level_metrics": [{EVIL: EVIL}],
            EVIL: EVIL,
        },
        aggregate_metrics_error=EVIL,
    )
    for url in (
        _url(run),
        _url(run, sort="-reward"),
        reverse("run_charts", args=[run.pk]),
        reverse("run", args=[run.pk]),
    ):
        response = signed_in.get(url)
        assert response.status_code == 200
        assert_inert(response.content.decode())
    html = signed_in.get(_url(run)).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text


def test_no_new_template_or_module_marks_data_safe():
    files = [
        REPO / "rollouts" / "web" / "analysis.py",
        REPO / "rollouts" / "web" / "profile_views.py",
        REPO / "rollouts" / "web" / "chart_views.py",
        REPO / "rollouts" / "web" / "compare_views.py",
        REPO / "rollouts" / "web" / "check_views.py",
        REPO / "rollouts" / "web" / "charts.py",
        *(REPO / "gymweb" / "templates" / "rollouts").glob("profile.html"),
        *(REPO / "gymweb" / "templates" / "rollouts").glob("compare.html"),
        *(REPO / "gymweb" / "templates" / "rollouts").glob("check_agent.html"),
    ]
    for pattern in ("profile_*.html", "compare_*.html", "check_*.html", "chart_*.html"):
        files += sorted((REPO / "gymweb" / "templates" / "rollouts" / "partials").glob(pattern))
    assert len(files) > 15
    for path in files:
        text = path.read_text()
        for bad in ("|safe", "mark_safe", "autoescape off", "safeseq", "SafeString", "format_html"):
            assert bad not in text, f"{path.name} uses {bad}"


def test_a_run_with_nothing_finished_shows_an_empty_profile(signed_in, db):
    run = make_run(3, status=Run.Status.RUNNING)
    response = signed_in.get(_url(run))
    assert response.status_code == 200
    html = response.content.decode()
    assert "No task has a finished rollout yet." in html and "No finished rollout yet." in html
    assert "Asked once the run completes." in html
    for kind in KINDS:
        assert signed_in.get(reverse("run_profile_file", args=[run.pk, kind])).status_code == 200


def test_an_imported_run_has_a_profile(signed_in, db):
    from rollouts.collection.importer import import_rollouts

    rows = [
        {
            "_ng_task_index": t,
            "_ng_rollout_index": r,
            "reward": float(r == 0),
            "agent_ref": {"name": "nemo"},
            "responses_create_params": {"input": f"task {t}"},
            "response": {"output": [], "usage": None},
        }
        for t in range(2)
        for r in range(2)
    ]
    import io

    summary = import_rollouts(
        io.BytesIO("\n".join(json.dumps(r) for r in rows).encode()), name="imported", source="rollouts.jsonl"
    )
    response = signed_in.get(_url(summary.run))
    assert response.status_code == 200
    assert _task_order(response) == [0, 1]
    assert "nemo" in response.content.decode()
