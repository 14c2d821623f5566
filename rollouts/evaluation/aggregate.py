"""The env's optional ``/aggregate_metrics``, called once a run completes (DESIGN.md, "Aggregates").

NeMo Gym's envs answer ``POST {"verify_responses": [rows…]}`` with ``{group_level_metrics,
agent_metrics, key_metrics, …}``; gymweb stores whatever comes back on the run and shows it.
"""
from __future__ import annotations

import json
import logging

import httpx
from django.conf import settings

from rollouts.collection.export import iter_successes
from rollouts.models import Run

log = logging.getLogger("gymweb.aggregate")


def fetch_aggregate_metrics(run_id: int) -> str:
    """POST the run's success rows to ``{env}/aggregate_metrics`` and store the reply.

    Bounded: at most ``GYMWEB_AGGREGATE_MAX_ROWS`` rows and ``GYMWEB_AGGREGATE_TIMEOUT_S`` seconds.
    A 404/405 means the env does not serve the route (not an error); any other failure is kept in
    ``run.aggregate_metrics_error``. Returns a one-line summary. Never raises for the env's faults.
    """
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not run.env_url:
        return "no such run"
    limit = settings.GYMWEB_AGGREGATE_MAX_ROWS
    rows = []
    for line in iter_successes(run):
        if len(rows) >= limit:
            return _store(run, None, f"not called: more than {limit} successful rows (GYMWEB_AGGREGATE_MAX_ROWS)")
        rows.append(json.loads(line))
    if not rows:
        return _store(run, None, "not called: the run has no successful rows")
    url = f"{run.env_url}/aggregate_metrics"
    try:
        with httpx.Client(trust_env=False, timeout=settings.GYMWEB_AGGREGATE_TIMEOUT_S, follow_redirects=False) as client:
            response = client.post(url, content=json.dumps({"verify_responses": rows}), headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        return _store(run, None, f"could not call {url}: {exc.__class__.__name__}: {exc}")
    if response.status_code in (404, 405):
        return _store(run, None, "the environment does not serve /aggregate_metrics")
    if not response.is_success:
        return _store(run, None, f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
    try:
        data = response.json()
    except ValueError:
        return _store(run, None, f"{url} answered with a body that is not JSON: {response.text[:500]}")
    return _store(run, data, "")


def _store(run: Run, data, error: str) -> str:
    Run.objects.filter(pk=run.pk).update(aggregate_metrics=data, aggregate_metrics_error=error)
    return error or f"stored aggregate metrics of run {run.pk}"
