"""What the analysis pages (profile, charts, compare) share: a value as a table cell and a cache
of finished data keyed by the run's finished attempt counts.

Finished rows never change, so a view of them is cached under the run's succeeded and failed
attempt counts (``GYMWEB_SUMMARY_CACHE_S``, 0 turns caching off); while the run is running, under
the run alone for ``GYMWEB_LIVE_ANALYSIS_CACHE_S``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count

from rollouts.display import number
from rollouts.models import Rollout, Run

S = Rollout.Status
FINISHED = (S.SUCCEEDED, S.FAILED)


def cell_text(value: Any) -> str:
    """A value for a table cell: numbers like the trajectory page shows them, ``—`` for
    missing or NaN, other JSON compactly."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, (bool, int, float)):
        return number(value)
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(value)


def finished_counts(run: Run) -> tuple[int, int]:
    """(succeeded, failed) attempt rows: one grouped count on the (run, status) index. Finished
    rows never change and each new one raises a count, so the pair keys caches of finished data."""
    counts = dict(
        Rollout.objects.filter(run=run, status__in=FINISHED).values_list("status").annotate(n=Count("id")).order_by()
    )
    return counts.get(S.SUCCEEDED, 0), counts.get(S.FAILED, 0)


def run_cached(kind: str, run: Run, build):
    """``build()``, cached under the run and its finished counts (``GYMWEB_SUMMARY_CACHE_S``).
    While the run is running those counts change all the time (a team opening its profile during
    collection recomputed it on every view): then it is cached under the run alone for
    ``GYMWEB_LIVE_ANALYSIS_CACHE_S``, and the run's end (a new status) starts exact caching again."""
    ttl = float(settings.GYMWEB_SUMMARY_CACHE_S)
    if ttl <= 0:
        return build()
    created = run.created.timestamp() if run.created else 0
    live_ttl = float(settings.GYMWEB_LIVE_ANALYSIS_CACHE_S)
    if run.status == Run.Status.RUNNING and live_ttl > 0:
        key, ttl = f"gymweb:{kind}-live:v1:{run.pk}:{created}", live_ttl
    else:
        succeeded, failed = finished_counts(run)
        key = f"gymweb:{kind}:v1:{run.pk}:{created}:{succeeded}:{failed}"
    value = cache.get(key)
    if value is None:
        value = build()
        cache.set(key, value, ttl)
    return value
