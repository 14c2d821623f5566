"""What a team watching a running run shares (benchmarks/README.md, "A busy team"): an unchanged
poll of the live part gets 204; a running run's aggregates, its table's automatic refresh, its
profile and charts are reused for a few seconds; and every change shows once that time has passed,
at once for what is always read fresh (progress, workers, status), and at once when the run ends."""

from __future__ import annotations

import re
import types

import pytest
from django.core.cache import cache
from django.core.cache.backends import locmem
from django.urls import reverse

from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run

S = Rollout.Status


@pytest.fixture(autouse=True)
def _fresh_cache(settings):
    # Long enough that a slow machine never lets an entry expire between two requests of a test;
    # the tests move the cache's clock past them instead (``later``).
    settings.GYMWEB_LIVE_CACHE_S = 60
    settings.GYMWEB_LIVE_ANALYSIS_CACHE_S = 600
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def later(monkeypatch):
    """Move the cache's clock on by ``seconds`` (the local-memory cache reads ``time.time``)."""
    real = locmem.time.time
    shift = {"s": 0.0}
    monkeypatch.setattr(locmem, "time", types.SimpleNamespace(time=lambda: real() + shift["s"]))

    def move(seconds: float) -> None:
        shift["s"] += seconds

    return move


@pytest.fixture
def running(db):
    """4 keys, running: (0) ok 1.0, (1) ok 0.0, (2) and (3) pending."""
    run = make_run(4, status=Run.Status.RUNNING, name="live")
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.SUCCEEDED, 0.0)
    return run


def _live(client, run, seen=None):
    url = reverse("run_live", args=[run.pk]) + (f"?seen={seen}" if seen is not None else "")
    return client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-live")


def _seen(body: str) -> str:
    return re.search(r"\?seen=([^\"]+)\"", body).group(1)


def _text(body: str, element_id: str) -> str:
    return re.search(rf'id="{element_id}"[^>]*>([^<]*)<', body).group(1).strip()


def _worker(name: str):
    from django.utils import timezone

    from rollouts.models import Worker

    return Worker.objects.create(name=name, host="h", pid=1, last_seen=timezone.now())


# -- the live part's poll -----------------------------------------------------------------------
def test_an_unchanged_poll_gets_204_and_a_changed_one_the_new_state(signed_in, running):
    first = _live(signed_in, running)
    seen = _seen(first.content.decode())
    same = _live(signed_in, running, seen)
    assert same.status_code == 204 and same.content == b"" and "HX-Trigger" not in same
    assert "no-cache" in same["Cache-Control"]
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    changed = _live(signed_in, running, seen)
    assert changed.status_code == 200 and changed["HX-Trigger"] == "rollouts-changed"
    assert "<strong>3</strong> / 4 done" in changed.content.decode()
    assert _seen(changed.content.decode()) != seen


def test_a_worker_starting_or_stopping_is_a_change_even_when_no_rollout_changed(signed_in, running):
    body = _live(signed_in, running).content.decode()
    assert 'id="no-worker"' in body
    _worker("w:1")
    answer = _live(signed_in, running, _seen(body))
    assert answer.status_code == 200
    assert 'id="no-worker"' not in answer.content.decode() and "1 worker live" in answer.content.decode()


def test_a_run_that_ended_is_answered_whole_and_stops_the_polling(signed_in, running):
    seen = _seen(_live(signed_in, running).content.decode())
    Run.objects.filter(pk=running.pk).update(status=Run.Status.CANCELLED)
    answer = _live(signed_in, running, seen)
    assert answer.status_code == 200
    assert "every 2s" not in answer.content.decode() and 'id="run-status">cancelled<' in answer.content.decode()


# -- a running run's aggregates -----------------------------------------------------------------
def test_the_aggregates_of_a_running_run_show_a_change_within_the_live_cache_time(signed_in, running, later):
    assert _text(_live(signed_in, running).content.decode(), "reward-mean") == "0.5000"
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    body = _live(signed_in, running).content.decode()
    assert "<strong>3</strong> / 4 done" in body  # progress is read fresh
    # The reward statistics are the shared snapshot of up to GYMWEB_LIVE_CACHE_S ago, and they agree
    # with each other (the failures-as-0 mean over the snapshot's own done keys).
    assert _text(body, "reward-mean") == "0.5000" and _text(body, "reward-mean-all") == "0.5000"
    later(61)
    body = _live(signed_in, running).content.decode()
    assert _text(body, "reward-mean") == "0.6667" and _text(body, "reward-mean-all") == "0.6667"


def test_the_aggregates_are_exact_as_soon_as_the_run_ends(signed_in, running):
    _live(signed_in, running)
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    finish(key(running, 3), S.FAILED, kind="agent_timeout")
    Run.objects.filter(pk=running.pk).update(status=Run.Status.COMPLETED)
    body = signed_in.get(reverse("run", args=[running.pk])).content.decode()
    assert _text(body, "reward-mean") == "0.6667" and _text(body, "reward-mean-all") == "0.5000"


def test_with_the_live_cache_off_every_poll_is_exact(signed_in, running, settings):
    settings.GYMWEB_LIVE_CACHE_S = 0
    _live(signed_in, running)
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    assert _text(_live(signed_in, running).content.decode(), "reward-mean") == "0.6667"


# -- the rollout table's automatic refresh --------------------------------------------------------
def _table(client, run, target: str, **params):
    from urllib.parse import urlencode

    url = reverse("run", args=[run.pk]) + (f"?{urlencode(params)}" if params else "")
    return client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET=target).content.decode()


def _statuses(body: str) -> list[str]:
    table = body[body.index('id="rollout-table"') :]
    return re.findall(r'<span class="badge (pending|running|succeeded|failed|cancelled|interrupted)"', table)


def test_the_table_refresh_of_a_running_run_is_shared_for_the_live_cache_time(signed_in, running, later):
    before = _statuses(_table(signed_in, running, "rollout-table"))
    assert before.count("succeeded") == 2
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    assert _statuses(_table(signed_in, running, "rollout-table")) == before  # the shared rendering
    # The user's own filter, sort or page change is rendered fresh.
    assert _statuses(_table(signed_in, running, "rollouts")).count("succeeded") == 3
    # Another query string is another rendering.
    assert _statuses(_table(signed_in, running, "rollout-table", status="succeeded")).count("succeeded") == 3
    later(61)
    assert _statuses(_table(signed_in, running, "rollout-table")).count("succeeded") == 3


def test_the_run_page_of_a_running_run_shows_the_shared_table_and_of_a_final_run_a_fresh_one(signed_in, running, later):
    page = reverse("run", args=[running.pk])
    assert _statuses(signed_in.get(page).content.decode()).count("succeeded") == 2
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    body = signed_in.get(page).content.decode()
    assert "<strong>3</strong> / 4 done" in body  # the live part is fresh
    assert _statuses(body).count("succeeded") == 2  # the table is the shared one
    assert "&lt;div" not in body and body.count('id="rollout-table"') == 1  # inserted as markup
    later(61)
    assert _statuses(signed_in.get(page).content.decode()).count("succeeded") == 3
    finish(key(running, 3), S.SUCCEEDED, 1.0)
    Run.objects.filter(pk=running.pk).update(status=Run.Status.COMPLETED)
    assert _statuses(signed_in.get(page).content.decode()).count("succeeded") == 4


def test_the_table_refresh_gets_the_table_alone_and_a_filter_change_the_whole_section(signed_in, running):
    refresh = _table(signed_in, running, "rollout-table", status="succeeded")
    assert refresh.lstrip().startswith('<div id="rollout-table"') and 'class="filters"' not in refresh
    assert 'hx-select="#rollout-table"' in refresh and "status=succeeded" in refresh  # refreshes itself the same way
    section = _table(signed_in, running, "rollouts", status="succeeded")
    assert section.lstrip().startswith('<section id="rollouts"') and 'class="filters"' in section


def test_the_table_refresh_after_the_run_ends_is_fresh(signed_in, running):
    _table(signed_in, running, "rollout-table")
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    finish(key(running, 3), S.SUCCEEDED, 1.0)
    Run.objects.filter(pk=running.pk).update(status=Run.Status.COMPLETED)
    assert _statuses(_table(signed_in, running, "rollout-table")).count("succeeded") == 4


# -- profile and charts of a running run -----------------------------------------------------------
def _profile_tasks(client, run) -> int:
    body = client.get(reverse("run_profile", args=[run.pk])).content.decode()
    return len(re.findall(r'<tr id="task-(\d+)"', body))


def test_the_profile_of_a_running_run_shows_a_change_within_its_cache_time_and_at_once_when_it_ends(
    signed_in, running, later
):
    assert _profile_tasks(signed_in, running) == 2  # tasks with a success so far
    finish(key(running, 2), S.SUCCEEDED, 1.0)
    assert _profile_tasks(signed_in, running) == 2
    later(601)
    assert _profile_tasks(signed_in, running) == 3
    finish(key(running, 3), S.SUCCEEDED, 1.0)
    Run.objects.filter(pk=running.pk).update(status=Run.Status.COMPLETED)
    assert _profile_tasks(signed_in, running) == 4
