"""Probes for a load balancer or an orchestrator: ``/healthz`` and ``/readyz``, without sign-in.

``/healthz``: the process answers (200, touches nothing else). ``/readyz``: 200 when the database
answers, every migration is applied, the broker answers and at least one worker sent a heartbeat
in the last minute; else 503. The body names each check and whether it passed, never why (errors
go to the server's log).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger("gymweb.probes")

WORKER_WINDOW_S = 60.0
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


def _broker() -> bool:
    from django_q.brokers import get_broker

    return bool(get_broker().ping())


def _worker() -> bool:
    from rollouts.models import Worker

    return Worker.objects.filter(last_seen__gte=timezone.now() - timedelta(seconds=WORKER_WINDOW_S)).exists()


CHECKS = {"database": _database, "migrations": _migrations, "broker": _broker, "worker": _worker}


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """``GET /readyz``: ``{"ready": bool, "checks": {"database": "ok"|"failed", ...}}``, 200 or 503.
    Without a database the checks that need it are not tried (``"skipped"``)."""
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        if name != "database" and name != "broker" and results.get("database") != "ok":
            results[name] = "skipped"
            continue
        try:
            results[name] = "ok" if check() else "failed"
        except Exception as exc:
            log.warning("readyz: the %s check failed: %s: %s", name, exc.__class__.__name__, exc)
            results[name] = "failed"
    ready = all(value == "ok" for value in results.values())
    return JsonResponse({"ready": ready, "checks": results}, status=200 if ready else 503)
