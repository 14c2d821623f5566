"""/readyz with Redis down or hanging answers within a bounded time and names the dependency that
failed: the broker (django-q2 on Redis) makes the instance unready; the Redis cache is reported
but does not (pages work without it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest
from django.utils import timezone

from rollouts.models import Worker
from rollouts.operations import probes

# A probe without timeouts would wait on a hung Redis for ever; the bound only has to tell that from a
# probe that gives up, so it is generous: a loaded CI machine takes seconds to serve one request.
BOUND_S = probes.REDIS_TIMEOUT_S * 2 + 30.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def heartbeat(db):
    Worker.objects.create(name="h:1:w", host="h", pid=1, last_seen=timezone.now())


@pytest.fixture
def silent_redis():
    """A TCP listener that accepts connections and never answers (a hung Redis)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


def _timed_readyz(client):
    started = time.monotonic()
    response = client.get("/readyz")
    return response, time.monotonic() - started


def test_a_redis_broker_on_a_closed_port_is_named_and_answered_quickly(client, settings, heartbeat):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": f"redis://127.0.0.1:{_closed_port()}/0"}
    response, elapsed = _timed_readyz(client)
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "checks": {"database": "ok", "migrations": "ok", "broker": "failed", "worker": "ok"},
    }
    assert elapsed < BOUND_S


def test_a_hanging_redis_broker_costs_the_probe_about_its_timeout(client, settings, heartbeat, silent_redis):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": silent_redis}
    response, elapsed = _timed_readyz(client)
    assert response.status_code == 503 and response.json()["checks"]["broker"] == "failed"
    assert probes.REDIS_TIMEOUT_S * 0.9 <= elapsed < BOUND_S


def test_a_redis_cache_down_is_reported_but_the_instance_stays_ready(client, settings, heartbeat):
    url = f"redis://127.0.0.1:{_closed_port()}/1"
    settings.CACHES = {"default": {"BACKEND": "gymweb.cache.FailOpenRedisCache", "LOCATION": url}}
    response, elapsed = _timed_readyz(client)
    assert response.status_code == 200
    assert response.json()["checks"] == {
        "database": "ok",
        "migrations": "ok",
        "broker": "ok",
        "worker": "ok",
        "cache": "failed",
    }
    assert elapsed < BOUND_S


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
def test_a_redis_broker_that_answers_is_ok(client, settings, heartbeat, tmp_path):
    port = _closed_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                probes.redis_answers(url)
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": url}
        settings.CACHES = {"default": {"BACKEND": "gymweb.cache.FailOpenRedisCache", "LOCATION": url}}
        response = client.get("/readyz")
        assert response.status_code == 200
        assert response.json()["checks"]["broker"] == "ok" and response.json()["checks"]["cache"] == "ok"
    finally:
        proc.terminate()
        proc.wait(10)
