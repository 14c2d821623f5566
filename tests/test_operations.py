"""Operating gymweb: /healthz and /readyz for a load balancer, /metrics for Prometheus (the fleet's
counts through the database), log lines as JSON with GYMWEB_LOG_FORMAT=json."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Rollout, TrajectoryItem, Worker

from .conftest import _worker_env
from .servers import free_url

REPO = Path(__file__).resolve().parents[1]
TOKEN = "scrape-token-for-tests"


# -- /healthz, /readyz ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_healthz_answers_without_sign_in(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok\n"
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db
def test_readyz_is_503_without_a_worker_heartbeat_and_200_with_one(client):
    Worker.objects.all().delete()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "checks": {"database": "ok", "migrations": "ok", "broker": "ok", "worker": "failed"},
    }
    # a heartbeat older than a minute does not count
    Worker.objects.create(name="h:1:old", host="h", pid=1, last_seen=timezone.now() - timedelta(seconds=90))
    assert client.get("/readyz").status_code == 503
    Worker.objects.create(name="h:2:new", host="h", pid=2, last_seen=timezone.now())
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json()["ready"] is True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_with_the_database_down_healthz_is_200_and_readyz_503_without_detail(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYMWEB_")}
    # PostgreSQL where nothing listens: every connection is refused.
    env.update(
        DATABASE_URL=f"postgres://gymweb:pw-not-shown@127.0.0.1:{_free_port()}/gymweb",
        GYMWEB_SECRET_KEY=secrets.token_urlsafe(50),
        GYMWEB_DATA_DIR=str(tmp_path),
        GYMWEB_Q_NAME="gymweb-readyz-test",
    )
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "gymweb.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(base + "/healthz", timeout=5, trust_env=False)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "server.log").read_text()
                time.sleep(0.2)
        assert health.status_code == 200
        ready = httpx.get(base + "/readyz", timeout=30, trust_env=False)
        assert ready.status_code == 503
        assert ready.json() == {
            "ready": False,
            "checks": {"database": "failed", "migrations": "skipped", "broker": "failed", "worker": "skipped"},
        }
        assert "pw-not-shown" not in ready.text and "refused" not in ready.text.lower()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()
    assert "readyz: the database check failed" in (tmp_path / "server.log").read_text()


# -- /metrics -----------------------------------------------------------------------------------------
def _scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


@pytest.mark.django_db
def test_metrics_are_refused_without_the_token_or_an_allowed_address(client, settings):
    settings.GYMWEB_METRICS_TOKEN = ""
    settings.GYMWEB_METRICS_ALLOWED_IPS = []
    assert client.get("/metrics").status_code == 403  # nothing configured: off
    settings.GYMWEB_METRICS_TOKEN = TOKEN
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": TOKEN}):
        response = client.get("/metrics", **headers)
        assert response.status_code == 403 and response.content == b"forbidden\n"
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    settings.GYMWEB_METRICS_ALLOWED_IPS = ["10.0.0.0/8"]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_metrics_count_what_a_run_does(client, settings, counter_env_url, counter_agent_url, counter_tasks_path):
    from rollouts.workers.process import run_in_process

    settings.GYMWEB_METRICS_TOKEN = TOKEN
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    before = _scrape(client, **auth)
    assert ("gymweb_rollouts_started_total", ()) in before

    with counter_tasks_path.open("rb") as fh:
        parsed = read_jsonl(fh)
    good = runs.create_run(parsed, name="good", agent_url=counter_agent_url, env_url=counter_env_url, num_repeats=2)
    bad = runs.create_run(parsed, name="agent down", agent_url=free_url(), env_url=counter_env_url, num_repeats=1)
    for run in (good, bad):
        runs.launch(run)
        run_in_process(run.pk)
    assert Rollout.objects.filter(run=good, status=Rollout.Status.SUCCEEDED).count() == 10
    assert Rollout.objects.filter(run=bad, status=Rollout.Status.FAILED).count() == 5

    after = _scrape(client, **auth)

    def moved(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert moved("gymweb_rollouts_started_total") == 15
    assert moved("gymweb_rollouts_finished_total", outcome="succeeded") == 10
    assert moved("gymweb_rollouts_finished_total", outcome="failed") == 5
    assert moved("gymweb_rollouts_failed_total", kind="agent_unreachable") == 5
    stored = TrajectoryItem.objects.count()
    assert stored > 0 and moved("gymweb_stored_items_total") == stored
    calls = moved("gymweb_agent_call_seconds_count")
    assert calls >= 10 and moved("gymweb_agent_call_seconds_bucket", le="+Inf") == calls
    assert moved("gymweb_tool_call_seconds_count") > 0
    assert moved("gymweb_worker_heartbeats_total") >= 1
    assert after[("gymweb_rollouts_pending", ())] == 0
    assert ("gymweb_workers_live", ()) in after and ("gymweb_broker_queue_size", ()) in after


# -- logs ---------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_in_json_mode_every_log_line_is_one_json_object_and_failures_name_run_key_and_kind(
    tmp_path, counter_env_url, counter_tasks_path
):
    out = tmp_path / "rollouts.jsonl"
    env = _worker_env({"GYMWEB_LOG_FORMAT": "json", "GYMWEB_LOG_LEVEL": "INFO"})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymweb",
            "collect",
            "--agent-url",
            free_url(),
            "--env-url",
            counter_env_url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(out),
            "--no-progress",
            "--limit",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [line for line in proc.stderr.splitlines() if line.startswith("{")]
    assert logged, proc.stderr
    records = [json.loads(line) for line in logged]
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
    failed = [r for r in records if r["level"] == "WARNING" and "failed" in r["message"] and "failure_kind" in r]
    assert len(failed) == 2
    assert {(r["task_index"], r["failure_kind"]) for r in failed} == {
        (0, "agent_unreachable"),
        (1, "agent_unreachable"),
    }
    assert all(
        "Is your service running" not in line for line in logged
    )  # the error text (may quote payloads) is not logged
    assert any(r["logger"] == "gymweb.runs" and "completed" in r["message"] for r in records)


def test_text_lines_carry_time_level_and_logger(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYMWEB_")}
    env["GYMWEB_DATA_DIR"] = str(tmp_path)
    code = "import django, logging; django.setup(); logging.getLogger('gymweb.probe').warning('hello %s', 'there')"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "DJANGO_SETTINGS_MODULE": "gymweb.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = proc.stderr.strip().splitlines()[-1]
    date, clock, level, logger, *message = line.split(" ")
    assert len(date) == 10 and date[4] == "-" and ":" in clock
    assert (level, logger, " ".join(message)) == ("WARNING", "gymweb.probe", "hello there")
