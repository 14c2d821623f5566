"""The web cache on Redis fails open: while Redis does not answer, the run page, its live poll and the
profile page render from the database, and the log says so once; when Redis answers again the cache is
used again."""

from __future__ import annotations

import logging

import pytest
from django.core.cache import cache
from django.urls import reverse

from rollouts.models import Rollout, Run

from .conftest import free_port
from .run_factories import finish, key, make_run

REDIS = "redis://127.0.0.1:6379/7"


def _cache(location: str) -> dict:
    return {
        "default": {"BACKEND": "gymweb.cache.FailOpenRedisCache", "LOCATION": location, "KEY_PREFIX": "gymweb-test"}
    }


@pytest.fixture
def run(db):
    run = make_run(2, status=Run.Status.RUNNING, name="cached")
    finish(key(run, 0, 0), Rollout.Status.SUCCEEDED, 1.0)
    return run


def _pages(run) -> list[str]:
    return [reverse("run", args=[run.pk]), reverse("run_live", args=[run.pk]), reverse("run_profile", args=[run.pk])]


def test_pages_render_while_redis_does_not_answer_and_the_log_says_so_once(signed_in, run, settings, caplog):
    settings.CACHES = _cache(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    pages = _pages(run)
    assert pages
    with caplog.at_level(logging.WARNING, logger="gymweb.cache"):
        for _ in range(2):
            for url in pages:
                response = signed_in.get(url)
                assert response.status_code == 200, url
    warnings = [r.getMessage() for r in caplog.records if r.name == "gymweb.cache"]
    assert len(warnings) == 1 and "not answering" in warnings[0]


def test_reads_are_misses_and_writes_are_dropped_while_redis_is_down(settings):
    settings.CACHES = _cache(f"redis://127.0.0.1:{free_port()}/0")
    assert cache.set("k", 1) is None
    assert cache.get("k", "miss") == "miss"
    assert cache.get_or_set("k", lambda: 42) == 42
    assert cache.add("k", 1) is False and cache.get_many(["k"]) == {}
    with pytest.raises(ValueError):
        cache.incr("k")


def test_with_redis_answering_the_cache_stores_and_serves(settings):
    settings.CACHES = _cache(REDIS)  # .ci/run starts Redis when it is not answering
    cache.set("k", {"v": 1}, 30)
    assert cache.get("k") == {"v": 1}
    cache.delete("k")
