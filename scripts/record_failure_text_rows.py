"""Record the failures-sidecar rows NeMo Gym 0.7.0 writes when the env or the agent service fails.

Runs NeMo Gym's real servers (``gym env start``: head server, two remote_agents with their
legacy_agent environment servers, and ``scripts/failing_services.py`` as the resources server) and
``gym eval run``, with ``scripts/failing_services.py agent`` as the agent service: one task per case
in ``CASES`` (``/seed_session``, ``/verify`` or the agent's ``/v1/responses`` answering an HTTP error,
a redirect, a body that is not JSON, a JSON array, an invalid Responses object, or too late), then
one task through a remote_agent whose agent service is not running (``unreachable_remote_agent``),
then one task whose env stops listening once it has answered ``/seed_session`` (so ``/verify``
cannot reach it), then one task after that (the env not listening at all).
Writes ``tests/data/failure_text_rows.json``: the cases, the settings, the task rows, the ports, and
every line of NeMo Gym's ``rollouts_failures.jsonl`` as written. Run it with the NeMo Gym peer built
(``../shared/nemo_gym_peer/setup.sh``) and nothing else on NeMo Gym's head port (11000):

    flock /tmp/ngpeer.lock /tmp/ngpeer/venv/bin/python scripts/record_failure_text_rows.py \\
        [--peer /tmp/ngpeer] [--output tests/data/failure_text_rows.json] [--port-low 21100]

Every server binds 127.0.0.1, on ``--port-low`` and up.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from record_verify_refusal_rows import _lines, _stop, _wait, peer_env, peer_work

ROOT = Path(__file__).resolve().parents[1]

# the bounds the recording runs with (gymweb's test runs with the same)
REMOTE_RESPONSES_TIMEOUT_S = 3.0
RUN_TIMEOUT_S = 20.0


def _case(party: str, status: int, content_type: str, body: str, **extra) -> dict:
    return {"party": party, "status": status, "content_type": content_type, "body": body, **extra}


# name -> how that party answers (HTTP status, content type, body sent byte for byte, extra headers, delay)
CASES = {
    "seed 500": _case("seed_session", 500, "text/plain", "seed crashed"),
    "seed 404": _case("seed_session", 404, "application/json", '{"detail":"Not Found"}'),
    "seed hangs": _case("seed_session", 200, "application/json", "{}", sleep_s=60),
    "verify 500": _case("verify", 500, "text/plain", "verify crashed"),
    "verify 404": _case("verify", 404, "application/json", '{"detail":"Not Found"}'),
    "agent 500": _case("agent", 500, "text/plain", "agent crashed: " + "x" * 600),
    "agent 404": _case("agent", 404, "application/json", '{"detail":"Not Found"}'),
    "agent redirect": _case("agent", 307, "text/plain", "moved", headers={"Location": "/v2/responses"}),
    "agent not JSON": _case("agent", 200, "text/plain", "I am not JSON"),
    "agent JSON array": _case("agent", 200, "application/json", "[1, 2, 3]"),
    "agent invalid object": _case("agent", 200, "application/json", '{"id": "resp_1", "output": "nope"}'),
    "agent too slow": _case("agent", 200, "application/json", "{}", sleep_s=10),
    # run alone, after the others: the env stops listening once it has answered /seed_session
    "verify unreachable": _case(
        "seed_session", 200, "application/json", "{}", headers={"Connection": "close"}, go_dark=True
    ),
}
ALONE = ("verify unreachable",)

CONFIG = """\
skip_venv_if_present: true
uv_venv_dir: {venvs}
port_range_low: {port_low_auto}
port_range_high: {port_high}

failing_resources_server:
  resources_servers:
    failing_env:
      entrypoint: app.py
      domain: agent
      verified: false
      description: /seed_session and /verify answer what a task's case says
      host: 127.0.0.1
      port: {port_env}

remote_agent:
  responses_api_agents:
    remote_agent:
      entrypoint: app.py
      agent_base_url: http://127.0.0.1:{agent_port}
      resources_server:
        type: resources_servers
        name: failing_resources_server
      concurrency: 16
      remote_responses_timeout_secs: {responses_timeout}
      run_timeout_secs: {run_timeout}
      max_steps: 10
      host: 127.0.0.1
      port: {port_agent}

unreachable_remote_agent:
  responses_api_agents:
    remote_agent:
      entrypoint: app.py
      agent_base_url: http://127.0.0.1:{dead_port}
      resources_server:
        type: resources_servers
        name: failing_resources_server
      concurrency: 16
      remote_responses_timeout_secs: {responses_timeout}
      run_timeout_secs: {run_timeout}
      max_steps: 10
      host: 127.0.0.1
      port: {port_agent2}
"""


def task(name: str, n: int) -> dict:
    """One task naming its case for the env (``failure_case``) and the agent (``metadata``)."""
    return {
        "responses_create_params": {
            "input": [{"content": f"task {n}: {name}", "role": "user"}],
            "metadata": {"failure_case": name},
        },
        "failure_case": name,
    }


def _free_port(low: int, high: int) -> int:
    for port in range(low, high):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    sys.exit(f"no free port in {low}-{high}")


def _eval(venv: Path, work: Path, env: dict, agent: str, rows: list[dict], name: str) -> tuple[int, list[str]]:
    (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = work / name / "rollouts.jsonl"
    log = work / f"{name}.log"
    rc = subprocess.run(
        [
            venv / "bin/gym",
            "eval",
            "run",
            "--no-serve",
            f"+agent_name={agent}",
            f"+input_jsonl_fpath={work / f'{name}.jsonl'}",
            f"+output_jsonl_fpath={out}",
            "+num_samples_in_parallel=16",
            "+route_failures_to_sidecar=true",
        ],
        cwd=work,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    ).returncode
    failures = out.with_name("rollouts_failures.jsonl")
    if not failures.exists():
        sys.exit(f"gym eval run (rc {rc}) wrote no failures file:\n{log.read_text()[-3000:]}")
    if _lines(out):
        sys.exit(f"gym eval run {name} wrote successes: {_lines(out)[:2]}")
    return rc, _lines(failures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", type=Path, default=Path(os.environ.get("NGPEER_WORK", "/tmp/ngpeer")))
    parser.add_argument("--output", type=Path, default=ROOT / "tests/data/failure_text_rows.json")
    parser.add_argument("--port-low", type=int, default=21100)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its logs) and print it")
    args = parser.parse_args()
    venv = args.peer / "venv"
    env = peer_env()
    work, server_dir = peer_work("ng-failure-text-", "failing_env", "failing_services.py", CASES, venv)
    (work / "cases.json").write_text(json.dumps(CASES))
    low = args.port_low
    ports = {"env": low, "remote_agent": low + 1, "unreachable_remote_agent": low + 2, "agent": low + 3}
    ports["dead"] = _free_port(low + 4, low + 10)
    (work / "config.yaml").write_text(
        CONFIG.format(
            venvs=work / "venvs",
            port_env=ports["env"],
            port_agent=ports["remote_agent"],
            port_agent2=ports["unreachable_remote_agent"],
            port_low_auto=low + 10,
            port_high=low + 60,
            agent_port=ports["agent"],
            dead_port=ports["dead"],
            responses_timeout=REMOTE_RESPONSES_TIMEOUT_S,
            run_timeout=RUN_TIMEOUT_S,
        )
    )
    rows = [task(name, n) for n, name in enumerate(name for name in CASES if name not in ALONE)]
    unreachable_rows = [task("agent unreachable", 0)]
    verify_unreachable_rows = [task("verify unreachable", 0)]
    env_unreachable_rows = [task("env unreachable", 0)]

    agent_log, env_log = work / "agent.log", work / "gym_env.log"
    agent = subprocess.Popen(
        [
            venv / "bin/python",
            server_dir / "app.py",
            "agent",
            "--port",
            str(ports["agent"]),
            "--cases",
            work / "cases.json",
        ],
        stdout=agent_log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack = None
    try:
        _wait(f"http://127.0.0.1:{ports['agent']}/health", agent, agent_log)
        stack = subprocess.Popen(
            [venv / "bin/gym", "env", "start", "--config", "config.yaml"],
            cwd=work,
            env=env,
            stdout=env_log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait("http://127.0.0.1:11000/readyz", stack, env_log)
        rc, lines = _eval(venv, work, env, "remote_agent", rows, "cases")
        rc2, unreachable_lines = _eval(venv, work, env, "unreachable_remote_agent", unreachable_rows, "unreachable")
        rc3, verify_unreachable_lines = _eval(
            venv, work, env, "remote_agent", verify_unreachable_rows, "verify_unreachable"
        )
        time.sleep(8)  # past uvicorn's keep-alive (5 s): the agent's pooled env connections are closed
        try:
            socket.create_connection(("127.0.0.1", ports["env"]), timeout=5).close()
            sys.exit("the env still accepts connections after /go_dark")
        except ConnectionRefusedError:
            pass
        rc4, env_unreachable_lines = _eval(venv, work, env, "remote_agent", env_unreachable_rows, "env_unreachable")
        version = subprocess.run(
            [venv / "bin/python", "-c", "import importlib.metadata as m; print(m.version('nemo-gym'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        fixture = {
            "what": (
                f"NeMo Gym {version}'s rollouts_failures.jsonl lines when /seed_session, /verify or the agent "
                "service fails: `gym eval run +route_failures_to_sidecar=true` over gym env start (remote_agent "
                "and unreachable_remote_agent, the failing_env resources server, the failing agent service of "
                "scripts/failing_services.py); recorded with scripts/record_failure_text_rows.py"
            ),
            "eval_exit_codes": [rc, rc2, rc3, rc4],
            "remote_responses_timeout_s": REMOTE_RESPONSES_TIMEOUT_S,
            "run_timeout_s": RUN_TIMEOUT_S,
            "ports": ports,
            "cases": CASES,
            "tasks": rows,
            "failure_lines": lines,
            "unreachable_tasks": unreachable_rows,
            "unreachable_failure_lines": unreachable_lines,
            "verify_unreachable_tasks": verify_unreachable_rows,
            "verify_unreachable_failure_lines": verify_unreachable_lines,
            "env_unreachable_tasks": env_unreachable_rows,
            "env_unreachable_failure_lines": env_unreachable_lines,
        }
        args.output.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        counts = (
            f"{len(lines)} + {len(unreachable_lines)} + {len(verify_unreachable_lines)} + {len(env_unreachable_lines)}"
        )
        print(f"{counts} failure rows (gym eval run rc {rc}, {rc2}, {rc3}, {rc4}) -> {args.output}")
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
