"""Probes for a load balancer or an orchestrator: ``/healthz`` and ``/readyz``, without sign-in.

``/healthz``: the process answers (200, touches nothing else). ``/readyz``: 200 when the database
answers, every migration is applied, the broker answers and at least one worker sent a heartbeat
in the last minute; else 503. The body names each check and whether it passed, never why (errors
go to the server's log). A Redis broker or cache is pinged with a ``REDIS_TIMEOUT_S`` socket
timeout and no retries, so a Redis that is down or hangs costs the probe at most that much per
Redis. The Redis cache (``GYMWEB_CACHE_URL``) is reported but does not make the instance unready:
pages work without it (it fails open).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger("gymweb.probes")

WORKER_WINDOW_S = 60.0
REDIS_TIMEOUT_S = 1.0
_migrated = False  # once every migration is applied, this process's code needs no new one


@never_cache
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """``GET /healthz``: 200 ``ok`` while the process answers."""
    return HttpResponse("ok\n", content_type="text/plain")


def _database() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0] == 1


def _migrations() -> bool:
    global _migrated
    if not _migrated:
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connection)
        _migrated = not executor.migration_plan(executor.loader.graph.leaf_nodes())
    return _migrated


def redis_answers(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> bool:
    """Whether the Redis at ``url`` answers PING within ``timeout_s`` seconds (connect and reply
    each), without retries. Raises ``redis.RedisError`` when it does not."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    finally:
        client.close()


def _broker() -> bool:
    url = settings.Q_CLUSTER.get("redis")
    if isinstance(url, str) and url:
        return redis_answers(url)
    from django_q.brokers import get_broker

    return bool(get_broker().ping())


def _redis_cache_url() -> str | None:
    cache = settings.CACHES.get("default", {})
    if cache.get("BACKEND", "").endswith("RedisCache") and isinstance(cache.get("LOCATION"), str):
        return str(cache["LOCATION"])
    return None


def _cache() -> bool:
    url = _redis_cache_url()
    return redis_answers(url) if url else True


def _worker() -> bool:
    from rollouts.models import Worker

    return Worker.objects.filter(last_seen__gte=timezone.now() - timedelta(seconds=WORKER_WINDOW_S)).exists()


CHECKS = {"database": _database, "migrations": _migrations, "broker": _broker, "worker": _worker}
# Checks reported but not required for readiness (the cache fails open).
OPTIONAL = {"cache": _cache}
INDEPENDENT = {"database", "broker", "cache"}  # need no database


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """``GET /readyz``: ``{"ready": bool, "checks": {"database": "ok"|"failed", ...}}``, 200 or 503.
    Without a database the checks that need it are not tried (``"skipped"``). ``"cache"`` is there
    only with a Redis cache, and does not count toward ``ready``."""
    results: dict[str, str] = {}
    checks = dict(CHECKS)
    if _redis_cache_url():
        checks.update(OPTIONAL)
    for name, check in checks.items():
        if name not in INDEPENDENT and results.get("database") != "ok":
            results[name] = "skipped"
            continue
        try:
            results[name] = "ok" if check() else "failed"
        except Exception as exc:
            log.warning("readyz: the %s check failed: %s: %s", name, exc.__class__.__name__, exc)
            results[name] = "failed"
    ready = all(value == "ok" for name, value in results.items() if name not in OPTIONAL)
    return JsonResponse({"ready": ready, "checks": results}, status=200 if ready else 503)
