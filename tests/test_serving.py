"""Serving in production: WhiteNoise serves the static files under gunicorn
and runserver without --insecure; ``check --deploy`` passes with the settings docs/production.md documents; DEBUG off
refuses the development key; sign-in works behind a TLS proxy; a 500 logs its traceback."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time

import httpx
import pytest
from django.templatetags.static import static
from django.test import Client

from .conftest import REPO, _worker_env, free_port

# Servers and commands in other processes, each importing Django and the settings anew.
pytestmark = pytest.mark.slow

PRODUCTION = (REPO / "docs" / "production.md").read_text()


def _asset_links(html: str) -> dict[str, str]:
    """The stylesheet and htmx script URLs a page links."""
    css = re.search(r'<link rel="stylesheet" href="([^"]+)"', html).group(1)
    js = re.search(r'<script src="([^"]+htmx[^"]+)"', html).group(1)
    return {"css": css, "htmx": js}


def _check_assets_served(base: str) -> None:
    page = httpx.get(base + "/accounts/login/", trust_env=False)
    assert page.status_code == 200
    links = _asset_links(page.text)
    # Hashed names (cached for good), not the bare ones.
    assert re.fullmatch(r"/static/gymweb/app\.[0-9a-f]{12}\.css", links["css"]), links
    assert re.fullmatch(r"/static/vendor/htmx-2\.0\.11\.min\.[0-9a-f]{12}\.js", links["htmx"]), links
    css = httpx.get(base + links["css"], headers={"Accept-Encoding": "gzip"}, trust_env=False)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert css.headers.get("content-encoding") == "gzip"  # compressed ahead of time by collectstatic
    assert ".topbar" in css.text
    assert "immutable" in css.headers.get("cache-control", "")
    htmx = httpx.get(base + links["htmx"], trust_env=False)
    assert htmx.status_code == 200 and "javascript" in htmx.headers["content-type"]
    assert "htmx" in htmx.text[:5000]


def test_gunicorn_with_debug_off_serves_the_stylesheet_and_htmx(gunicorn):
    _check_assets_served(gunicorn.start())


def test_runserver_without_insecure_serves_the_stylesheet_and_htmx(transactional_db, collected_static, tmp_path):
    port = free_port()
    env = _worker_env(
        {
            "GYMWEB_DEBUG": "0",
            "GYMWEB_SECRET_KEY": secrets.token_urlsafe(50),
            "GYMWEB_STATIC_ROOT": str(collected_static),
        }
    )
    log = (tmp_path / "runserver.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "runserver.log").read_text()
            try:
                httpx.get(base + "/accounts/login/", timeout=2, trust_env=False)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "runserver did not answer"
                time.sleep(0.2)
        _check_assets_served(base)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
        log.close()


# -- the development key -------------------------------------------------------------------------
def _import_wsgi(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("GYMWEB_SECRET_KEY", "GYMWEB_DEBUG")}
    return subprocess.run(
        [sys.executable, "-c", "import gymweb.wsgi"],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_with_debug_off_the_wsgi_app_refuses_to_start_on_the_development_key():
    result = _import_wsgi(GYMWEB_DEBUG="0")
    assert result.returncode != 0
    assert "GYMWEB_SECRET_KEY is not set and DEBUG is off" in result.stderr
    assert _import_wsgi(GYMWEB_DEBUG="0", GYMWEB_SECRET_KEY=secrets.token_urlsafe(50)).returncode == 0
    assert _import_wsgi(GYMWEB_DEBUG="1").returncode == 0  # local development


@pytest.mark.parametrize(
    "key", ["x", "k" * 60, "short-but-random-ish"], ids=["one character", "one distinct character", "20 characters"]
)
def test_with_debug_off_the_wsgi_app_refuses_a_weak_key(key):
    result = _import_wsgi(GYMWEB_DEBUG="0", GYMWEB_SECRET_KEY=key)
    assert result.returncode != 0
    assert "refusing to serve pages with DEBUG off on a key shorter than 32 characters" in result.stderr
    assert _import_wsgi(GYMWEB_DEBUG="1", GYMWEB_SECRET_KEY=key).returncode == 0  # local development


def test_gunicorn_does_not_boot_on_the_development_key(gunicorn):
    gunicorn.start(wait=False, GYMWEB_SECRET_KEY=None)
    proc = gunicorn.procs[-1]
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert "GYMWEB_SECRET_KEY is not set and DEBUG is off" in gunicorn.logs()


def test_commands_that_serve_no_pages_run_without_a_secret_key():
    base = {k: v for k, v in os.environ.items() if k not in ("GYMWEB_SECRET_KEY", "GYMWEB_DEBUG")}
    result = subprocess.run(
        [sys.executable, "manage.py", "collect", "--help"],
        cwd=REPO,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# -- check --deploy --------------------------------------------------------------------------------
def _readme_production_env() -> dict[str, str]:
    """The ``export NAME=value`` lines of docs/production.md's first command block."""
    block = PRODUCTION.split("```sh", 1)[1].split("```", 1)[0]
    env = {}
    for line in block.splitlines():
        match = re.match(r"export (\w+)=('[^']*'|\S+)", line.strip())
        if match:
            env[match.group(1)] = match.group(2).strip("'")
    return env


def _check_deploy(env: dict[str, str], static_root) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GYMWEB_") or k in ("GYMWEB_DATA_DIR",)}
    base.pop("DATABASE_URL", None)
    base.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the tests' own (for Playwright); never in production
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env={**base, "GYMWEB_STATIC_ROOT": str(static_root), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_with_the_settings_the_readme_documents(collected_static):
    env = _readme_production_env()
    for name in (
        "GYMWEB_SECRET_KEY",
        "GYMWEB_ALLOWED_HOSTS",
        "GYMWEB_CSRF_TRUSTED_ORIGINS",
        "GYMWEB_SECURE_PROXY_SSL_HEADER",
        "GYMWEB_SSL_REDIRECT",
        "GYMWEB_SECURE_COOKIES",
        "GYMWEB_HSTS_SECONDS",
    ):
        assert name in env, f"docs/production.md's block does not set {name}"
    assert env["GYMWEB_SECRET_KEY"] == "…"  # a placeholder: the page says how to make one
    env["GYMWEB_SECRET_KEY"] = secrets.token_urlsafe(50)
    env.pop("DATABASE_URL", None)  # the page names a database host; the checks need none
    result = _check_deploy(env, collected_static)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_fails_without_them(collected_static, tmp_path):
    result = _check_deploy({}, collected_static)
    assert result.returncode != 0
    for check in ("gymweb.E001", "security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in result.stderr + result.stdout
    # No collected static files: a warning that says what to run.
    missing = _check_deploy(
        dict(_readme_production_env(), GYMWEB_SECRET_KEY=secrets.token_urlsafe(50)), tmp_path / "none"
    )
    assert "gymweb.W001" in missing.stderr and "collectstatic" in missing.stderr


# -- behind a TLS proxy ------------------------------------------------------------------------------
def _sign_in_through_proxy(base: str) -> httpx.Response:
    """Sign in as a browser does through an https proxy that forwards to ``base`` over http."""
    headers = {"Host": "gymweb.example.com", "X-Forwarded-Proto": "https"}
    # (a sign-in hashes the password with the production hasher: seconds of CPU on a busy machine)
    with httpx.Client(base_url=base, headers=headers, trust_env=False, timeout=60) as client:
        page = client.get("/accounts/login/")
        assert page.status_code == 200, page.text[:500]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        return client.post(
            "/accounts/login/",
            data={"username": "alice", "password": "correct horse battery", "csrfmiddlewaretoken": token, "next": "/"},
            headers={"Origin": "https://gymweb.example.com", "Referer": "https://gymweb.example.com/accounts/login/"},
        )


def test_sign_in_behind_a_tls_proxy_works_with_the_proxy_header_setting(gunicorn, user):
    # The proxy is on another machine: gunicorn itself trusts X-Forwarded-Proto only from
    # --forwarded-allow-ips (default 127.0.0.1), so here it is Django's setting that must see it.
    elsewhere = ("--forwarded-allow-ips", "192.0.2.10")
    # (Secure cookies stay off here: this client reaches the server over http, as the proxy does,
    # and would not send them back.) The https redirect sees the proxy's header: no loop.
    proxied = gunicorn.start(
        GYMWEB_ALLOWED_HOSTS="gymweb.example.com",
        GYMWEB_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
        GYMWEB_SSL_REDIRECT="1",
        args=elsewhere,
    )
    response = _sign_in_through_proxy(proxied)
    assert response.status_code == 302 and response.headers["location"] == "/", response.text[:500]
    assert "sessionid=" in response.headers["set-cookie"]

    # Without the setting Django thinks the request was http and refuses the https origin: the
    # friendly CSRF page, not Django's bare one.
    plain = gunicorn.start(GYMWEB_ALLOWED_HOSTS="gymweb.example.com", args=elsewhere)
    refused = _sign_in_through_proxy(plain)
    assert refused.status_code == 403
    assert "This form had expired" in refused.text and "DEBUG" not in refused.text


# -- a 500 with DEBUG off ----------------------------------------------------------------------------
def test_a_500_with_debug_off_logs_its_traceback(signed_in, settings, monkeypatch):
    from rollouts.evaluation import run_summary

    settings.DEBUG = False
    stream = io.StringIO()
    handlers = [h for h in logging.getLogger("django").handlers if isinstance(h, logging.StreamHandler)]
    assert handlers, "Django's logger has no console handler"
    for handler in handlers:
        monkeypatch.setattr(handler, "stream", stream)

    def boom(*args, **kwargs):
        raise RuntimeError("boom in the runs list")

    monkeypatch.setattr(run_summary, "progress_for_runs", boom)
    signed_in.raise_request_exception = False
    response = signed_in.get("/")
    assert response.status_code == 500
    assert "Server error" in response.content.decode()
    log = stream.getvalue()
    assert "Internal Server Error: /" in log
    assert "Traceback (most recent call last)" in log and "RuntimeError: boom in the runs list" in log


def test_static_names_are_hashed_and_served_by_whitenoise_in_process(manifest_static):
    css = static("gymweb/app.css")
    assert re.fullmatch(r"/static/gymweb/app\.[0-9a-f]{12}\.css", css)
    response = Client().get(css, HTTP_ACCEPT_ENCODING="br")
    assert response.status_code == 200 and response["Content-Encoding"] == "br"


# -- gymweb serve and open results streams ---------------------------------------------------------------
def test_gymweb_serve_answers_healthz_while_a_results_stream_is_open(gunicorn, user):
    import threading

    from rollouts.models import Run
    from rollouts.tokens import create_token

    from .conftest import COUNTER_TASKS

    _row, token = create_token(user, "trainer")
    auth = {"Authorization": f"Bearer {token}"}
    base = gunicorn.start(workers=1, serve=True)
    assert "Using worker: gthread" in gunicorn.logs()
    rows = [json.loads(line) for line in COUNTER_TASKS.read_text().splitlines() if line.strip()][:2]
    # No worker runs and nothing answers at the agent's address: the run stays running.
    body = {"rows": rows, "agent_url": "http://127.0.0.1:9", "env_url": "http://127.0.0.1:9"}
    created = httpx.post(f"{base}/api/v1/runs", json=body, headers=auth, timeout=30, trust_env=False)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    opened = threading.Event()
    stop = threading.Event()

    def hold_stream():
        url = f"{base}/api/v1/runs/{run_id}/results?after=0"
        with httpx.stream("GET", url, headers=auth, timeout=None, trust_env=False) as response:
            assert response.status_code == 200
            opened.set()
            for _ in response.iter_bytes():
                if stop.is_set():
                    return

    holder = threading.Thread(target=hold_stream, daemon=True)
    holder.start()
    try:
        assert opened.wait(30), gunicorn.logs()[-2000:]
        health = httpx.get(f"{base}/healthz", timeout=30, trust_env=False)
        assert health.status_code == 200
        assert Run.objects.get(pk=run_id).status == Run.Status.RUNNING  # the stream is still open
        assert holder.is_alive()
    finally:
        stop.set()
