"""Record the failures-sidecar rows NeMo Gym 0.7.0 writes when an env's ``/verify`` reply is refused.

Runs NeMo Gym's real servers (``gym env start``: head server, remote_agent, its legacy_agent
environment server, and ``scripts/refusing_verify_env.py`` as the resources server) and ``gym eval
run`` on one task per case in ``CASES``, with the NeMo Gym peer's scripted agent
(``../shared/nemo_gym_peer/scripted_agent.py``). Writes ``tests/data/verify_refusal_rows.json``: the
cases (the ``/verify`` reply each sends, byte for byte), the task rows, and every line of NeMo Gym's
``rollouts_failures.jsonl`` and ``rollouts_materialized_inputs.jsonl`` as written (``gym eval run``
exits 1: no rollout produced a result). Run it with the NeMo Gym peer built
(``../shared/nemo_gym_peer/setup.sh``) and nothing else on its fixed ports (the head on 11000, the
scripted agent on 9000):

    flock /tmp/ngpeer.lock /tmp/ngpeer/venv/bin/python scripts/record_verify_refusal_rows.py \
        [--peer /tmp/ngpeer] [--output tests/data/verify_refusal_rows.json]

The other servers listen on 19150-19199 (``--port-low``); every server binds 127.0.0.1.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_PEER = ROOT.parent / "shared" / "nemo_gym_peer"

# A Responses object NeMo Gym's NeMoGymResponse accepts, so the cases below fail on one field only.
_RESPONSE = {
    "id": "resp_1",
    "created_at": 0,
    "model": "m",
    "object": "response",
    "output": [],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}
_PARAMS = {"input": "add 1 then add 2 then get the count"}


def _json(value) -> dict:
    return {"status": 200, "content_type": "application/json", "body": json.dumps(value)}


# name -> the /verify reply (HTTP status, content type, body text sent byte for byte)
CASES = {
    "no reward": _json({"responses_create_params": _PARAMS, "response": _RESPONSE, "score": 1.0}),
    "a list reward": _json({"responses_create_params": _PARAMS, "response": _RESPONSE, "reward": [1]}),
    "not JSON": {"status": 200, "content_type": "text/plain", "body": "verification crashed"},
    "a JSON array": _json([1, 2, 3]),
}

CONFIG = """\
skip_venv_if_present: true
uv_venv_dir: {venvs}
port_range_low: {port_low_auto}
port_range_high: {port_high}

refusing_verify_resources_server:
  resources_servers:
    refusing_verify:
      entrypoint: app.py
      domain: agent
      verified: false
      description: /verify answers a reply NeMo Gym refuses
      host: 127.0.0.1
      port: {port_env}

remote_agent:
  responses_api_agents:
    remote_agent:
      entrypoint: app.py
      agent_base_url: http://127.0.0.1:{agent_port}
      resources_server:
        type: resources_servers
        name: refusing_verify_resources_server
      concurrency: 4
      remote_responses_timeout_secs: 60.0
      run_timeout_secs: 120.0
      max_steps: 10
      host: 127.0.0.1
      port: {port_agent}
"""


def tasks(example: Path) -> list[dict]:
    """One counter task per case, the case named in ``refusal_case`` (the env reads it in ``/verify``)."""
    rows = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    return [{**rows[n % len(rows)], "refusal_case": name} for n, name in enumerate(CASES)]


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().split("\n") if line] if path.exists() else []


def _wait(url: str, proc: subprocess.Popen, log: Path, seconds: int = 240) -> None:
    for _ in range(seconds * 2):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            pass
        if proc.poll() is not None:
            sys.exit(f"{proc.args[0]} died:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    sys.exit(f"{url} not ready after {seconds}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started here with start_new_session, and its process group."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def peer_env() -> dict[str, str]:
    """This process's environment for NeMo Gym's servers: Ray on one machine, no usage report."""
    return dict(
        os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled"
    )


def peer_work(prefix: str, server: str, app: str, cases: dict, venv: Path) -> tuple[Path, Path]:
    """A fresh work folder for ``gym env start``: ``resources_servers/<server>/app.py`` copied from
    ``scripts/<app>`` with ``cases.json``, and the peer's one venv linked for that server, the
    remote_agent and its legacy_agent environment server. Returns (work folder, server folder)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    server_dir = work / "resources_servers" / server
    server_dir.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / app, server_dir / "app.py")
    (server_dir / "requirements.txt").write_text("")
    (server_dir / "cases.json").write_text(json.dumps(cases))
    for d in (f"resources_servers/{server}", "responses_api_agents/remote_agent", "environment_servers/legacy_agent"):
        (work / "venvs" / d).mkdir(parents=True)
        (work / "venvs" / d / ".venv").symlink_to(venv)
    return work, server_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", type=Path, default=Path(os.environ.get("NGPEER_WORK", "/tmp/ngpeer")))
    parser.add_argument("--output", type=Path, default=ROOT / "tests/data/verify_refusal_rows.json")
    parser.add_argument("--agent-port", type=int, default=9000)
    parser.add_argument("--port-low", type=int, default=19150)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its logs) and print it")
    args = parser.parse_args()
    venv = args.peer / "venv"
    env = peer_env()
    work, server_dir = peer_work("ng-verify-refusals-", "refusing_verify", "refusing_verify_env.py", CASES, venv)
    low = args.port_low
    (work / "config.yaml").write_text(
        CONFIG.format(
            venvs=work / "venvs",
            port_env=low,
            port_agent=low + 1,
            port_low_auto=low + 2,
            port_high=low + 49,
            agent_port=args.agent_port,
        )
    )
    rows = tasks(args.peer / "counter/example.jsonl")
    (work / "input.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    agent_log, env_log = work / "agent.log", work / "gym_env.log"
    agent = subprocess.Popen(
        [venv / "bin/python", SHARED_PEER / "scripted_agent.py", "--port", str(args.agent_port)],
        stdout=agent_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack = None
    try:
        _wait(f"http://127.0.0.1:{args.agent_port}/health", agent, agent_log)
        stack = subprocess.Popen(
            [venv / "bin/gym", "env", "start", "--config", "config.yaml"],
            cwd=work,
            env=env,
            stdout=env_log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait("http://127.0.0.1:11000/readyz", stack, env_log)
        out = work / "results/rollouts.jsonl"
        eval_log = work / "eval.log"
        rc = subprocess.run(
            [
                venv / "bin/gym",
                "eval",
                "run",
                "--no-serve",
                "+agent_name=remote_agent",
                f"+input_jsonl_fpath={work / 'input.jsonl'}",
                f"+output_jsonl_fpath={out}",
                "+num_samples_in_parallel=4",
                "+route_failures_to_sidecar=true",
            ],
            cwd=work,
            env=env,
            stdout=eval_log.open("w"),
            stderr=subprocess.STDOUT,
        ).returncode
        failures = out.with_name("rollouts_failures.jsonl")
        if not failures.exists():
            sys.exit(f"gym eval run (rc {rc}) wrote no failures file:\n{eval_log.read_text()[-3000:]}")
        lines = _lines(failures)
        version = subprocess.run(
            [venv / "bin/python", "-c", "import importlib.metadata as m; print(m.version('nemo-gym'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        fixture = {
            "what": (
                f"NeMo Gym {version}'s rollouts_failures.jsonl lines for an env whose /verify reply its "
                "remote_agent refuses: `gym eval run +route_failures_to_sidecar=true` over gym env start "
                "(remote_agent, refusing_verify resources server, the peer's scripted agent); recorded with "
                "scripts/record_verify_refusal_rows.py"
            ),
            "eval_exit_code": rc,
            "cases": CASES,
            "tasks": rows,
            "failure_lines": lines,
            "materialized_lines": _lines(out.with_name("rollouts_materialized_inputs.jsonl")),
            "success_lines": _lines(out),
        }
        args.output.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        print(f"{len(lines)} failure rows (gym eval run rc {rc}) -> {args.output}")
    finally:
        if stack is not None:
            _stop(stack)
        _stop(agent)
        if args.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
