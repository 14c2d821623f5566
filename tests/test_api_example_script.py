"""gymweb/examples/api_client.py against a live gymweb: it uploads the counter tasks, launches a run on the
example env and agent, waits while a real worker runs it, and downloads rollouts.jsonl through the
API."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rollouts.models import Run
from rollouts.tokens import create_token

from .conftest import REPO, _worker_env

pytestmark = pytest.mark.timeout(240)


def test_the_example_script_launches_waits_and_downloads(
    live_server, workers, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path, tmp_path
):
    user = django_user_model.objects.create_user(username="script", password="x")
    _row, token = create_token(user, "example")
    workers.start(workers=1)
    output = tmp_path / "out" / "rollouts.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymweb.examples.api_client",
            "--url",
            live_server.url,
            "--dataset",
            str(counter_tasks_path),
            "--agent-url",
            counter_agent_url,
            "--env-url",
            counter_env_url,
            "--output",
            str(output),
            "--poll-s",
            "0.2",
            "--timeout-s",
            "180",
            "--name",
            "from the example",
        ],
        cwd=REPO,
        env=_worker_env({"GYMWEB_TOKEN": token}),
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrote 5 rows" in proc.stdout
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 5 and all(r["reward"] == 1.0 for r in rows)
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2, 3, 4]
    run = Run.objects.get(name="from the example")
    assert run.status == Run.Status.COMPLETED and run.created_by == user


def test_the_example_script_says_what_the_api_refused(live_server, db, counter_tasks_path, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gymweb.examples.api_client",
            "--url",
            live_server.url,
            "--token",
            "gw_wrong",
            "--dataset",
            str(counter_tasks_path),
            "--agent-url",
            "http://127.0.0.1:1",
            "--env-url",
            "http://127.0.0.1:2",
            "--output",
            str(tmp_path / "r.jsonl"),
        ],
        cwd=REPO,
        env=_worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "HTTP 401: Unauthorized" in proc.stderr
    assert not (tmp_path / "r.jsonl").exists()
