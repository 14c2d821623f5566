"""Prometheus metrics of the whole fleet, served by every web server at ``/metrics``.

Workers count what they do in memory (:func:`record_batch`, :func:`record_claimed`) and add the
counts to :class:`~rollouts.models.MetricTotal` rows at each heartbeat and when they stop
(:func:`flush`, the dispatcher's database thread), so a scrape of any web server covers every
worker on every machine. What is read fresh at scrape time (in flight per run, pending rollouts,
the broker's queue, worker heartbeats) comes straight from the database.

Counters (``_total``): ``gymweb_rollouts_started``, ``gymweb_rollouts_finished{outcome}``,
``gymweb_rollouts_failed{kind}``, ``gymweb_stored_items`` (its ``rate()`` is stored items per
second), ``gymweb_worker_heartbeats``. Histograms (seconds): ``gymweb_agent_call_seconds``,
``gymweb_tool_call_seconds``. Gauges: ``gymweb_rollouts_in_flight{run}``,
``gymweb_rollouts_pending``, ``gymweb_broker_queue_size``, ``gymweb_workers_live``,
``gymweb_worker_in_flight{worker}``, ``gymweb_worker_heartbeat_timestamp_seconds{worker}``.
"""

from __future__ import annotations

import bisect
import ipaddress
import logging
import math
import secrets
import threading
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

log = logging.getLogger("gymweb.metrics")

# Upper bounds (seconds) of the latency histograms' buckets; the last bucket is +Inf.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
HISTOGRAMS = {
    "gymweb_agent_call_seconds": "latency of each call to the agent's /v1/responses",
    "gymweb_tool_call_seconds": "latency of each tool call gymweb sent to the env",
}
COUNTERS = {
    "gymweb_rollouts_started": "rollout attempts claimed by a worker",
    "gymweb_rollouts_finished": "rollout attempts that ended with a result, by outcome (succeeded, failed)",
    "gymweb_rollouts_failed": "failed rollout attempts, by failure kind",
    "gymweb_stored_items": "trajectory items stored (rate() gives items per second)",
    "gymweb_worker_heartbeats": "worker heartbeats",
}
LIVE_WINDOW_S = 60.0  # a worker whose heartbeat is older than this is not counted as live

_lock = threading.Lock()
_pending: Counter[tuple[str, str]] = Counter()


def labels_text(**labels: Any) -> str:
    """Canonical label text: ``k=v`` pairs sorted by key, joined by commas (``,`` and ``=`` in
    values are replaced by ``_``)."""
    return ",".join(f"{k}={str(v).replace(',', '_').replace('=', '_')}" for k, v in sorted(labels.items()))


def _parse_labels(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair) if text else {}


def add(name: str, value: float = 1.0, **labels: Any) -> None:
    """Count ``value`` towards counter ``name`` (without ``_total``) in this process; written by
    the next :func:`flush`."""
    with _lock:
        _pending[(name, labels_text(**labels))] += value


def observe(name: str, seconds: float) -> None:
    """One observation of histogram ``name`` (seconds): its bucket, sum and count."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return
    index = bisect.bisect_left(BUCKETS, seconds)
    le = "+Inf" if index == len(BUCKETS) else repr(BUCKETS[index])
    with _lock:
        _pending[(name + "_bucket", labels_text(le=le))] += 1
        _pending[(name + "_sum", "")] += seconds
        _pending[(name + "_count", "")] += 1


def record_claimed(n: int) -> None:
    """``n`` rollout attempts were claimed."""
    if n:
        add("gymweb_rollouts_started", n)


def record_batch(batch: Any) -> None:
    """Count what a written dispatcher batch held: results (by outcome and failure kind), agent-call
    and tool-call latencies, stored items."""
    for _rollout_id, out in batch.finished:
        if out.ok:
            add("gymweb_rollouts_finished", outcome="succeeded")
        else:
            add("gymweb_rollouts_finished", outcome="failed")
            add("gymweb_rollouts_failed", kind=str(out.failure_kind or "unknown"))
    for call in batch.calls:
        if call.latency_ms is not None:
            observe("gymweb_agent_call_seconds", call.latency_ms / 1000.0)
    for item in batch.items:
        if item.origin == "gym" and item.latency_ms is not None:
            observe("gymweb_tool_call_seconds", item.latency_ms / 1000.0)
    if batch.items:
        add("gymweb_stored_items", len(batch.items))


def flush() -> None:
    """Add this process's counts to the ``MetricTotal`` rows in one transaction. On a database
    error the counts are kept for the next flush and the error is raised."""
    from rollouts.models import MetricTotal

    with _lock:
        deltas = dict(_pending)
        _pending.clear()
    if not deltas:
        return
    try:
        with transaction.atomic():
            # Rows in one order in every process: two workers flushing at once lock the same rows
            # in the same order and wait for each other instead of deadlocking (PostgreSQL).
            for (name, labels), delta in sorted(deltas.items()):
                rows = MetricTotal.objects.filter(name=name, labels=labels)
                if not rows.update(value=F("value") + delta):
                    MetricTotal.objects.bulk_create(
                        [MetricTotal(name=name, labels=labels, value=0.0)], ignore_conflicts=True
                    )
                    rows.update(value=F("value") + delta)
    except BaseException:
        with _lock:
            _pending.update(deltas)  # a Counter: added to what came in since
        raise


# -- the scrape ------------------------------------------------------------------------------------
class FleetCollector:
    """prometheus-client collector reading the database: the totals the workers pushed and the
    fleet's live state."""

    def collect(self) -> Iterable[Any]:
        from django_q.brokers import get_broker

        from rollouts.models import MetricTotal, Rollout, Run, Worker

        totals: dict[str, list[tuple[dict[str, str], float]]] = {}
        for name, labels, value in MetricTotal.objects.values_list("name", "labels", "value"):
            totals.setdefault(name, []).append((_parse_labels(labels), value))

        for name, doc in COUNTERS.items():
            rows = totals.get(name, [])
            label_names = sorted({k for labels, _ in rows for k in labels})
            family = CounterMetricFamily(name, doc, labels=label_names)
            if not rows and not label_names:
                family.add_metric([], 0.0)
            for labels, value in rows:
                family.add_metric([labels.get(k, "") for k in label_names], value)
            yield family

        for name, doc in HISTOGRAMS.items():
            per_bucket = {labels.get("le"): value for labels, value in totals.get(name + "_bucket", [])}
            running, buckets = 0.0, []
            for le in [repr(b) for b in BUCKETS] + ["+Inf"]:
                running += per_bucket.get(le, 0.0)
                buckets.append((le, running))
            total_sum = sum(v for _, v in totals.get(name + "_sum", []))
            yield HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total_sum)

        in_flight = GaugeMetricFamily("gymweb_rollouts_in_flight", "rollouts running now, by run", labels=["run"])
        for run_id, n in (
            Rollout.objects.filter(status=Rollout.Status.RUNNING, run__status=Run.Status.RUNNING)
            .values("run_id")
            .annotate(n=Count("id"))
            .values_list("run_id", "n")
        ):
            in_flight.add_metric([str(run_id)], n)
        yield in_flight
        pending = Rollout.objects.filter(status=Rollout.Status.PENDING, run__status=Run.Status.RUNNING).count()
        yield GaugeMetricFamily(
            "gymweb_rollouts_pending", "rollout attempts of running runs waiting for a worker", value=pending
        )
        try:
            queued = float(get_broker().queue_size() or 0)
        except Exception:  # an unreachable broker shows as NaN here and in /readyz
            queued = math.nan
        yield GaugeMetricFamily("gymweb_broker_queue_size", "django-q2 tasks waiting in the broker", value=queued)

        now = timezone.now()
        workers = list(Worker.objects.values_list("name", "last_seen", "inflight"))
        live = sum(1 for _, seen, _ in workers if seen >= now - timedelta(seconds=LIVE_WINDOW_S))
        yield GaugeMetricFamily(
            "gymweb_workers_live", f"workers with a heartbeat in the last {LIVE_WINDOW_S:g} s", value=live
        )
        beat = GaugeMetricFamily(
            "gymweb_worker_heartbeat_timestamp_seconds", "each worker's last heartbeat (Unix time)", labels=["worker"]
        )
        inflight = GaugeMetricFamily("gymweb_worker_in_flight", "rollouts in flight in each worker", labels=["worker"])
        for name, seen, n in workers:
            beat.add_metric([name], seen.timestamp())
            inflight.add_metric([name], n)
        yield beat
        yield inflight


def _client_allowed(request: HttpRequest) -> bool:
    token = settings.GYMWEB_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and secrets.compare_digest(header[7:].strip().encode(), token.encode()):
        return True
    allowed = settings.GYMWEB_METRICS_ALLOWED_IPS
    if allowed:
        try:
            address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        for entry in allowed:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                log.warning("GYMWEB_METRICS_ALLOWED_IPS: %r is not an address or CIDR range; ignored", entry)
    return False


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: Prometheus text format. Only with ``Authorization: Bearer
    <GYMWEB_METRICS_TOKEN>`` or from an address in ``GYMWEB_METRICS_ALLOWED_IPS``; otherwise 403
    without detail (neither set: always 403)."""
    if not _client_allowed(request):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
