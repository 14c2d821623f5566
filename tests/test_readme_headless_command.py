"""The README's headless command works as written: its block (the example env and agent on
127.0.0.1, then ``collect``) runs in a shell whose environment does not allow local targets, so the
block itself must turn them on (docs/production.md, "Which hosts a run may reach"). Only the ports and the
output folder are moved, since other test runs share the machine, and the README's
``.venv/bin/...`` commands run with this test run's interpreter (wherever its environment lives)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from .conftest import REPO, _worker_env
from .servers import free_url


def headless_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Headless collection", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_the_block_turns_local_targets_on_before_collect():
    block = headless_block()
    assert block.index("export GYMWEB_ALLOW_LOCAL_TARGETS=1") < block.index("gymweb collect")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_readme_headless_command_collects_the_counter_tasks(tmp_path):
    env_port, agent_port = (free_url().rsplit(":", 1)[1] for _ in range(2))
    block = headless_block().replace("9101", env_port).replace("9102", agent_port)
    block = block.replace("results/rollouts.jsonl", str(tmp_path / "results" / "rollouts.jsonl"))
    block = block.replace(".venv/bin/python", shlex.quote(sys.executable))
    # wait for the two services as a user would, then run the rest; stop the services at the end
    lines = block.splitlines()
    wait = (
        f"for p in {env_port} {agent_port}; do for i in $(seq 1 100); do "
        "(exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done; done"
    )
    collect_at = next(i for i, line in enumerate(lines) if "gymweb collect" in line)
    script = "\n".join(
        ["set -e", "trap 'kill $(jobs -p) 2>/dev/null' EXIT", *lines[:collect_at], wait, *lines[collect_at:]]
    )
    env = _worker_env()
    env.pop("GYMWEB_ALLOW_LOCAL_TARGETS", None)
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "results" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(r["reward"] == 1.0 for r in rows)
    assert (tmp_path / "results" / "rollouts_failures.jsonl").read_text() == ""
