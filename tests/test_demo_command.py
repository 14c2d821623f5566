"""``make demo``: it takes a port (``make demo PORT=8001``); the
example env and agent keep fixed ports; the demo user keeps its password and the web server its
secret key across restarts, so a signed-in browser stays signed in and earlier demo runs can be
retried; the new-run form is pre-filled with the example URLs; DEBUG stays off."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from .conftest import REPO, free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_make_demo_passes_the_port_and_the_example_ports():
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    out = subprocess.run(
        ["make", "-n", "demo", "PORT=8001"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    # No example ports unless given: the demo reuses the first demo's (9101 and 9102 at first).
    assert "gymweb demo --port 8001" in out and "--env-port" not in out and "--agent-port" not in out
    out = subprocess.run(
        ["make", "-n", "demo", "PORT=8001", "ENV_PORT=9301", "AGENT_PORT=9302"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--port 8001 --env-port 9301 --agent-port 9302" in out


class Demo:
    """``gymweb demo`` in a subprocess with its own data directory (SQLite), started outside the
    checkout; its output is read by a thread so the pipe never fills."""

    def __init__(self, var_dir, *args):
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "GYMWEB_REDIS_URL", "GYMWEB_SECRET_KEY", "GYMWEB_SQLITE_PATH", "GYMWEB_DEBUG")
        }
        env.update(GYMWEB_DATA_DIR=str(var_dir), PYTHONUNBUFFERED="1", GYMWEB_Q_WORKERS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gymweb", "demo", *args],
            cwd=var_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output)
            if match:
                return match
            assert self.proc.poll() is None, f"the demo stopped ({self.proc.returncode}):\n{self.output[-3000:]}"
            time.sleep(0.2)
        pytest.fail(f"the demo never printed {pattern!r}:\n{self.output[-3000:]}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _sign_in(base: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=base, trust_env=False, timeout=30)
    page = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    signed = client.post(
        "/accounts/login/", data={"username": "demo", "password": password, "csrfmiddlewaretoken": token, "next": "/"}
    )
    assert signed.status_code == 302, signed.text[:500]
    return client


def test_the_demo_on_a_chosen_port_keeps_its_ports_password_and_sessions_across_restarts(tmp_path):
    web, env_port, agent_port = free_port(), free_port(), free_port()
    ports = ["--port", str(web), "--env-port", str(env_port), "--agent-port", str(agent_port)]
    base = f"http://127.0.0.1:{web}"
    env_url, agent_url = f"http://127.0.0.1:{env_port}", f"http://127.0.0.1:{agent_port}"

    first = Demo(tmp_path, *ports, "--no-run")
    try:
        first.wait_for("gymweb is running")
        password = first.wait_for(r"sign in as  demo / (\S+)").group(1)
        assert f"example env {env_url}   example agent {agent_url}" in first.output
        browser = _sign_in(base, password)
        form = browser.get("/runs/new/").text
        # Pre-filled with the example services.
        assert f'name="agent_url" value="{agent_url}"' in form and f'name="env_url" value="{env_url}"' in form
        # The stylesheet is served (WhiteNoise, runserver without --insecure) and DEBUG is off.
        css = re.search(r'<link rel="stylesheet" href="([^"]+)"', form).group(1)
        assert re.fullmatch(r"/static/gymweb/app\.[0-9a-f]{12}\.css", css) and browser.get(css).status_code == 200
        assert (
            browser.get("/no-such-page/").status_code == 404 and "Traceback" not in browser.get("/no-such-page/").text
        )
    finally:
        first.stop()
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0  # owner-only
    key = (tmp_path / "secret_key").read_text()

    # Without the example ports the restart reuses the first demo's (remembered in the data dir).
    second = Demo(tmp_path, "--port", str(web), "--num-repeats", "1", "--exit-when-done", "--agent-latency-ms", "0")
    try:
        second.wait_for("gymweb is running")
        assert second.wait_for(r"sign in as  demo / (\S+)").group(1) == password
        assert f"example env {env_url}   example agent {agent_url}" in second.output
        # The browser of the first demo is still signed in (same key, same password hash).
        run_page = browser.get("/runs/1/")
        assert run_page.status_code == 200 and "demo: counter tasks, three fail on purpose" in run_page.text
        assert second.proc.wait(timeout=180) == 0, second.output[-3000:]
    finally:
        second.stop()
        browser.close()
    # Five tasks succeed, three fail on purpose (a tool answering an error, a wrong answer): reward 0.
    assert (
        "demo run completed: 7 succeeded, 1 failed (5 with reward 1.0, mean reward of the succeeded 0.71)"
        in second.output
    )
    assert "not the first demo's" not in second.output
    assert (tmp_path / "secret_key").read_text() == key

    # Other example ports: the demo says what moved, which runs point at the old address and how to retry them.
    moved_env = free_port()
    third = Demo(tmp_path, "--port", str(web), "--env-port", str(moved_env), "--no-run")
    try:
        third.wait_for("Ctrl-C stops everything")
    finally:
        third.stop()
    assert f"the example env moved from 127.0.0.1:{env_port} to 127.0.0.1:{moved_env}" in third.output
    assert "1 earlier run(s) point at the old address: #1 demo: counter tasks, three fail on purpose" in third.output
    assert f"gymweb demo --env-port {env_port} --agent-port {agent_port}" in third.output
    assert "example agent moved" not in third.output


def test_a_taken_example_port_is_a_clear_error_naming_the_flag(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = Demo(tmp_path, "--port", str(free_port()), "--env-port", str(port), "--agent-port", str(free_port()))
        assert demo.proc.wait(timeout=120) != 0
    assert f"127.0.0.1:{port} is already in use" in demo.output and f"--env-port {port + 1}" in demo.output
    assert not (tmp_path / "gymweb.sqlite3").exists()  # nothing touched


def test_the_demo_runs_on_a_nemo_gym_head_servers_environment(tmp_path, counter_env_url):
    from tests.nemo_fakes import ENV_NAME, FakeHeadServer

    head = FakeHeadServer(env_url=counter_env_url)
    ports = ["--port", str(free_port()), "--env-port", str(free_port()), "--agent-port", str(free_port())]
    demo = Demo(
        tmp_path, *ports, "--head-url", head.url, "--num-repeats", "1", "--exit-when-done", "--agent-latency-ms", "0"
    )
    try:
        demo.wait_for("gymweb is running")
        assert f"NeMo Gym    {ENV_NAME} at {counter_env_url} (head server {head.url})" in demo.output
        assert demo.proc.wait(timeout=180) == 0, demo.output[-3000:]
    finally:
        demo.stop()
        head.stop()
    assert (
        "demo run completed: 7 succeeded, 1 failed (5 with reward 1.0, mean reward of the succeeded 0.71)"
        in demo.output
    )
