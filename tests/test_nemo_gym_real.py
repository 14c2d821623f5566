"""Against the real NeMo Gym 0.7.0 (``gym env start``): runs only when ``GYMWEB_NEMO_GYM_BIN`` names
NeMo Gym's ``gym`` (its own Python >= 3.13 venv), skipped otherwise; never in CI.

``GYMWEB_NEMO_GYM_EXTRA_CONFIG`` (optional): a machine-local config merged after the counter config,
e.g. ``skip_venv_if_present: true`` + ``uv_venv_dir`` with pre-made per-server venvs, a ``head_server``
port. The head server's port (11000 unless that file says) must be free.

    GYMWEB_NEMO_GYM_BIN=~/nemo-gym/bin/gym .venv/bin/python -m pytest -q tests/test_nemo_gym_real.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from rollouts.models import Run
from rollouts.nemo.config import load_files
from tests.conftest import REPO, _worker_env, wait_for

GYM = os.environ.get("GYMWEB_NEMO_GYM_BIN", "")
EXTRA = os.environ.get("GYMWEB_NEMO_GYM_EXTRA_CONFIG", "")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not GYM, reason="GYMWEB_NEMO_GYM_BIN does not name NeMo Gym's gym executable"),
]


def test_collect_by_agent_name_against_a_real_gym_env_start(tmp_path, counter_agent_url, counter_tasks_path):
    config = tmp_path / "counter_remote.yaml"
    config.write_text(
        (REPO / "gymweb/examples/nemo_gym/counter_remote.yaml")
        .read_text()
        .replace("http://127.0.0.1:9102", counter_agent_url)
    )
    files = [str(config)] + ([EXTRA] if EXTRA else [])
    head_url = load_files(files).head_server_url() or "http://127.0.0.1:11000"
    out = (tmp_path / "env_start.out").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "manage.py"),
            "env",
            "start",
            *files,
            "--gym",
            GYM,
            "--log",
            str(tmp_path / "gym.log"),
        ],
        cwd=REPO,
        env=_worker_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: "Ctrl-C stops NeMo Gym" in (tmp_path / "env_start.out").read_text() or proc.poll() is not None,
            timeout=600,
            interval=1,
            what="gym env start ready",
        )
        printed = (tmp_path / "env_start.out").read_text()
        assert proc.poll() is None, printed + (tmp_path / "gym.log").read_text()[-3000:]
        results = tmp_path / "results" / "rollouts.jsonl"
        call_command(
            "collect",
            "--config",
            str(config),
            "--head-url",
            head_url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(results),
            "--no-progress",
        )
        rewards = [json.loads(line)["reward"] for line in results.read_text().splitlines()]
        assert rewards == [1.0] * 5
        run = Run.objects.get()
        assert run.head_url == head_url and run.env_name == "example_session_state_mgmt_resources_server"
        # NeMo Gym's own remote_agent server as the agent URL: caught before the run, naming the URL meant
        remote_agent = json.loads(
            subprocess.run(["curl", "-s", f"{head_url}/server_instances"], capture_output=True, text=True).stdout
        )
        agent_server = next(r["url"] for r in remote_agent if r["process_name"] == "remote_agent")
        with pytest.raises(CommandError, match=f"instead: {counter_agent_url}"):
            call_command(
                "collect",
                "--agent-url",
                agent_server,
                "--config",
                str(config),
                "--head-url",
                head_url,
                "--input",
                str(counter_tasks_path),
                "--output",
                str(tmp_path / "miswired.jsonl"),
                "--no-progress",
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        finally:
            out.close()
    assert "stopped NeMo Gym" in (tmp_path / "env_start.out").read_text()
