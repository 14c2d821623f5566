"""NeMo Gym environments: configs read as NeMo Gym reads them, environments found through a (fake)
head server by name, ``collect --config/--head-url/--agent-name``, the env followed to its new port
on retry, and the mis-wiring (an agent URL that is NeMo Gym's own agent server) caught."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command

from rollouts.collection import environments
from rollouts.evaluation import health_report
from rollouts.models import HeadServer, Rollout, Run
from rollouts.nemo import miswiring
from rollouts.nemo.config import NemoConfigError, load_files, load_texts
from rollouts.nemo.head_server import HeadServerError, fetch
from tests.nemo_fakes import DATA, ENV_NAME, FakeHeadServer, fake_nemo_agent_server, self_tooled_agent
from tests.servers import free_url

pytestmark = pytest.mark.django_db(transaction=True)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _counter_config(tmp_path: Path, agent_url: str) -> Path:
    """The spec's counter_remote.yaml with its agent_base_url set to the test's agent service."""
    path = tmp_path / "counter_remote.yaml"
    path.write_text((DATA / "counter_remote.yaml").read_text().replace("http://127.0.0.1:9000", agent_url))
    return path


@pytest.fixture
def head(counter_env_url, counter_agent_url):
    server = FakeHeadServer(env_url=counter_env_url, agent_base_url=counter_agent_url)
    yield server
    server.stop()


# -- configs -------------------------------------------------------------------------------------
def test_the_specs_counter_config_gives_the_agent_its_environment_and_knobs():
    config = load_files([DATA / "counter_remote.yaml"])
    agent = config.agent()
    assert (agent.name, agent.agent_base_url, agent.resources_server) == (
        "remote_agent",
        "http://127.0.0.1:9000",
        ENV_NAME,
    )
    assert (agent.concurrency, agent.max_steps) == (4, 8)
    assert agent.sources["concurrency"].endswith(
        "counter_remote.yaml: remote_agent.responses_api_agents.remote_agent.concurrency"
    )
    env = config.environment(agent)
    assert (env.name, env.server, env.url) == (
        ENV_NAME,
        "example_session_state_mgmt",
        None,
    )  # no port before gym env start


def test_files_merge_in_order_later_wins_and_interpolations_resolve(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text((DATA / "counter_remote.yaml").read_text())
    local = tmp_path / "local.yaml"
    local.write_text(
        "my_agent_host: 10.1.2.3\nremote_agent:\n  responses_api_agents:\n    remote_agent:\n"
        "      agent_base_url: http://${my_agent_host}:9000\n      concurrency: 16\n"
        "      run_timeout_secs: 60\n"
    )
    agent = load_files([base, local]).agent("remote_agent")
    assert agent.agent_base_url == "http://10.1.2.3:9000"
    assert (agent.concurrency, agent.max_steps, agent.run_timeout_s) == (16, 8, 60.0)
    assert agent.sources["concurrency"].startswith(str(local)) and agent.sources["max_steps"].startswith(str(base))
    # reversed order: the base file wins again
    assert load_files([local, base]).agent().concurrency == 4


def test_a_files_own_config_paths_are_merged_before_it(tmp_path):
    (tmp_path / "inner.yaml").write_text((DATA / "counter_remote.yaml").read_text())
    outer = tmp_path / "outer.yaml"
    outer.write_text(
        "config_paths: [inner.yaml]\nremote_agent:\n  responses_api_agents:\n    remote_agent:\n      max_steps: 3\n"
    )
    agent = load_files([outer]).agent()
    assert (agent.max_steps, agent.concurrency) == (3, 4)


def test_bad_configs_are_refused_naming_the_file_and_the_key_path(tmp_path):
    no_agent = tmp_path / "env_only.yaml"
    no_agent.write_text("counter:\n  resources_servers:\n    example_session_state_mgmt: {entrypoint: app.py}\n")
    with pytest.raises(NemoConfigError, match=r"env_only\.yaml: names no usable agent"):
        load_files([no_agent]).agent()
    wrong_env = tmp_path / "wrong_env.yaml"
    wrong_env.write_text(
        (DATA / "counter_remote.yaml")
        .read_text()
        .replace("name: example_session_state_mgmt_resources_server", "name: nope")
    )
    config = load_files([wrong_env])
    with pytest.raises(NemoConfigError) as exc:
        config.environment(config.agent())
    assert "wrong_env.yaml: remote_agent.responses_api_agents.remote_agent.resources_server.name names 'nope'" in str(
        exc.value
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\nb: [1, 2\n")
    with pytest.raises(NemoConfigError, match=r"bad\.yaml at line \d+, column \d+: not valid YAML"):
        load_files([bad])
    with pytest.raises(NemoConfigError, match="no agent named 'other'.*agents there: remote_agent"):
        load_files([DATA / "counter_remote.yaml"]).agent("other")
    with pytest.raises(NemoConfigError, match="missing.yaml: no such file"):
        load_files([tmp_path / "missing.yaml"])


# -- head server ---------------------------------------------------------------------------------
def test_the_recorded_head_server_config_parses_with_every_port():
    text = json.loads((DATA / "global_config_dict_yaml.json").read_text())
    config = load_texts([("head", text)])
    assert config.resources_servers()[ENV_NAME].url == "http://127.0.0.1:9416"
    assert config.agent("remote_agent").server_url == "http://127.0.0.1:9415"
    assert config.head_server_url() == "http://127.0.0.1:9419"


def test_a_head_server_resolves_the_environment_by_name_and_names_both_when_it_cannot(head, counter_env_url):
    with httpx.Client(timeout=5) as c:
        found = fetch(c, head.url)
        assert found.resources_server_url(ENV_NAME) == counter_env_url
        with pytest.raises(
            HeadServerError, match=rf"head server at {head.url} knows no resources server named 'nope'.*{ENV_NAME}"
        ):
            found.resources_server_url("nope")
        dead = free_url()
        with pytest.raises(HeadServerError, match=f"cannot reach the NeMo Gym head server at {dead}"):
            fetch(c, dead)


def test_collect_by_config_and_head_url_needs_no_port(
    tmp_path, head, counter_agent_url, counter_env_url, counter_tasks_path, capsys
):
    config = _counter_config(tmp_path, counter_agent_url)
    out = tmp_path / "results" / "rollouts.jsonl"
    call_command(
        "collect",
        "--config",
        str(config),
        "--head-url",
        head.url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--no-progress",
    )
    rows = _read(out)
    assert len(rows) == 5 and all(r["reward"] == 1.0 for r in rows)
    assert all(r["agent_ref"] == {"name": "remote_agent"} for r in rows)
    run = Run.objects.get()
    assert (run.agent_url, run.env_url, run.head_url, run.env_name) == (
        counter_agent_url,
        counter_env_url,
        head.url,
        ENV_NAME,
    )
    assert (run.concurrency, run.max_steps) == (4, 8)  # from the config
    printed = capsys.readouterr().out
    assert f"--env-url {counter_env_url} (head server {head.url}: {ENV_NAME})" in printed
    assert (
        "--concurrency 4 (" in printed
        and "counter_remote.yaml: remote_agent.responses_api_agents.remote_agent.concurrency" in printed
    )


def test_flags_override_the_config_and_the_head_servers_own_config_is_enough(tmp_path, head, counter_tasks_path):
    out = tmp_path / "rollouts.jsonl"
    call_command(
        "collect",
        "--head-url",
        head.url,
        "--agent-name",
        "remote_agent",
        "--concurrency",
        "2",
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--no-progress",
        "--no-health-check",
    )
    run = Run.objects.get()
    assert run.concurrency == 2 and run.max_steps == 8
    assert [r["reward"] for r in _read(out)] == [1.0] * 5


def test_a_resources_server_that_moved_port_is_followed_on_retry(
    tmp_path, counter_agent_url, counter_env_url, counter_tasks_path
):
    head = FakeHeadServer(env_url=free_url(), agent_base_url=counter_agent_url)  # the env is down at first
    try:
        config = _counter_config(tmp_path, counter_agent_url)
        out = tmp_path / "rollouts.jsonl"
        args = [
            "collect",
            "--config",
            str(config),
            "--head-url",
            head.url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(out),
            "--no-progress",
            "--no-health-check",
            "--max-attempts",
            "3",
        ]
        call_command(*args)
        assert (
            _read(out) == []
            and Rollout.objects.filter(status=Rollout.Status.FAILED, failure_kind="seed_failed").count() == 5
        )
        head.env_url = counter_env_url  # restarted on another port
        call_command(*args, "--resume")
        assert [r["reward"] for r in _read(out)] == [1.0] * 5
        assert Run.objects.get().env_url == counter_env_url
    finally:
        head.stop()


def test_the_retry_button_resolves_the_env_again(head, counter_env_url):
    run = Run.objects.create(
        name="r", agent_url="http://127.0.0.1:1", env_url="http://127.0.0.1:2", head_url=head.url, env_name=ENV_NAME
    )
    assert environments.refresh_env_url(run) == counter_env_url
    run.refresh_from_db()
    assert run.env_url == counter_env_url


# -- the mis-wiring ------------------------------------------------------------------------------
def test_collect_refuses_nemo_gyms_own_agent_server_naming_the_url_meant(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    nemo_agent = fake_nemo_agent_server()
    head = FakeHeadServer(env_url=counter_env_url, agent_base_url=counter_agent_url, agent_server_url=nemo_agent.url)
    try:
        with pytest.raises(CommandError) as exc:
            call_command(
                "collect",
                "--agent-url",
                nemo_agent.url,
                "--env-url",
                counter_env_url,
                "--head-url",
                head.url,
                "--input",
                str(counter_tasks_path),
                "--output",
                str(tmp_path / "r.jsonl"),
                "--no-progress",
            )
        text = str(exc.value)
        assert f"{nemo_agent.url} is NeMo Gym's own agent server 'remote_agent'" in text
        assert f"Use your agent service's URL instead: {counter_agent_url}" in text
        assert not Run.objects.exists()
        # found through a registered head server when none is named
        environments.register_head(head.url)
        assert f"instead: {counter_agent_url}" in environments.miswiring_problem(nemo_agent.url)
    finally:
        head.stop()
        nemo_agent.stop()


def test_check_agent_fails_on_nemo_gyms_own_agent_server(capsys):
    nemo_agent = fake_nemo_agent_server()
    try:
        with pytest.raises(CommandError) as exc:
            call_command("check_agent", nemo_agent.url)
        assert exc.value.returncode == 1
        out = capsys.readouterr().out
        assert "ERROR   nemo_gym_agent_server" in out and "FAIL" in out
        assert "agent_ran_env_tools" in out
    finally:
        nemo_agent.stop()


def test_an_agent_that_runs_the_env_tools_itself_is_flagged_at_run_time(
    tmp_path, counter_env_url, counter_tasks_path, capsys
):
    agent = self_tooled_agent()
    try:
        out = tmp_path / "rollouts.jsonl"
        call_command(
            "collect",
            "--agent-url",
            agent.url,
            "--env-url",
            counter_env_url,
            "--input",
            str(counter_tasks_path),
            "--output",
            str(out),
            "--no-progress",
        )
        printed = capsys.readouterr().out
        assert "WARNING: 5 rollout(s) got tool results the environment never executed" in printed
        rollouts = list(Rollout.objects.filter(status=Rollout.Status.SUCCEEDED))
        assert len(rollouts) == 5 and all(r.reward == 0.0 for r in rollouts)
        assert all(any(w.startswith(miswiring.ROLLOUT_WARNING) for w in r.warnings) for r in rollouts)
        verdicts = [
            json.loads(line) for line in (tmp_path / health_report.ROLLOUT_VERDICTS_FILENAME).read_text().splitlines()
        ]
        assert verdicts and all(v["verdict"] == "unhealthy" for v in verdicts)
        assert all("tool_results_not_executed" in {f["check"] for f in v["findings"]} for v in verdicts)
    finally:
        agent.stop()


def test_unexecuted_tool_results_counts_only_the_envs_tools_the_env_never_ran():
    call = {"type": "function_call", "call_id": "a", "name": "increment_counter", "arguments": "{}"}
    own = {"type": "function_call", "call_id": "b", "name": "web_search", "arguments": "{}"}
    items = [
        (call, "agent"),
        ({"type": "function_call_output", "call_id": "a", "output": "{}"}, "agent"),
        (own, "agent"),
        ({"type": "function_call_output", "call_id": "b", "output": "{}"}, "agent"),
    ]
    assert miswiring.unexecuted_tool_results(items, ["increment_counter"]) == ["a"]
    ran = [(call, "agent"), ({"type": "function_call_output", "call_id": "a", "output": "{}"}, "gym")]
    assert miswiring.unexecuted_tool_results(ran, ["increment_counter"]) == []


def test_registered_head_servers_list_their_environments_with_health_and_tools(head, counter_env_url):
    environments.register_head(head.url, ["counter_remote.yaml"])
    assert HeadServer.objects.get().config_files == "counter_remote.yaml"
    heads, past = environments.known_environments()
    assert len(heads) == 1 and not heads[0].error
    envs = heads[0].environments
    assert [(e.name, e.url, e.healthy) for e in envs] == [(ENV_NAME, counter_env_url, True)]
    assert set(envs[0].tools) == {"increment_counter", "get_counter_value"}
    assert heads[0].agents and heads[0].agents[0]["name"] == "remote_agent"


# -- env start / env list ------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_env_start_runs_gym_registers_the_head_server_and_stops_its_process_group(tmp_path, counter_agent_url):
    from tests.conftest import REPO, _worker_env, free_port, wait_for

    port = free_port()
    config = _counter_config(tmp_path, counter_agent_url)
    local = tmp_path / "local.yaml"
    local.write_text(f"head_server:\n  host: 127.0.0.1\n  port: {port}\n")
    gym = tmp_path / "gym"
    gym.write_text(f'#!/bin/sh\ncd {REPO}\nexec {sys.executable} -m tests.fake_gym "$@"\n')
    gym.chmod(0o755)
    pids_file = tmp_path / "pids.json"
    out = (tmp_path / "env_start.out").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "manage.py"),
            "env",
            "start",
            str(config),
            str(local),
            "--gym",
            str(gym),
            "--log",
            str(tmp_path / "gym.log"),
        ],
        cwd=REPO,
        env=_worker_env({"FAKE_GYM_PIDS": str(pids_file)}),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: "Ctrl-C stops NeMo Gym" in (tmp_path / "env_start.out").read_text() or proc.poll() is not None,
            timeout=60,
            what="env start ready",
        )
        printed = (tmp_path / "env_start.out").read_text()
        assert proc.poll() is None, printed
        assert f"head server http://127.0.0.1:{port} registered with gymweb" in printed
        assert re.search(rf"environment {ENV_NAME}  http://127\.0\.0\.1:\d+  healthy  tools: ", printed)
        assert f"--head-url http://127.0.0.1:{port} --agent-name remote_agent" in printed
        assert HeadServer.objects.filter(url=f"http://127.0.0.1:{port}").exists()
        gym_pids = json.loads(pids_file.read_text())
        assert len(gym_pids) == 2 and all(_alive(p) for p in gym_pids)
        listed = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "env", "list"],
            cwd=REPO,
            env=_worker_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"head server http://127.0.0.1:{port}" in listed.stdout and f"environment {ENV_NAME}" in listed.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "stopped NeMo Gym" in (tmp_path / "env_start.out").read_text()
        wait_for(lambda: not any(_alive(p) for p in gym_pids), timeout=10, what="gym's processes gone")
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()


def test_env_start_without_nemo_gym_says_how_to_install_it(tmp_path, settings):
    settings.GYMWEB_NEMO_GYM_BIN = str(tmp_path / "nowhere" / "gym")
    with pytest.raises(CommandError, match="NeMo Gym needs Python >= 3.13"):
        call_command("env", "start", str(DATA / "counter_remote.yaml"))


def test_a_config_without_the_envs_port_uses_the_default_head_server_setting(
    tmp_path, settings, head, counter_agent_url, counter_env_url, counter_tasks_path
):
    settings.GYMWEB_NEMO_GYM_HEAD_URL = head.url
    out = tmp_path / "rollouts.jsonl"
    call_command(
        "collect",
        "--config",
        str(_counter_config(tmp_path, counter_agent_url)),
        "--input",
        str(counter_tasks_path),
        "--output",
        str(out),
        "--no-progress",
        "--no-health-check",
    )
    assert [r["reward"] for r in _read(out)] == [1.0] * 5
    assert (Run.objects.get().head_url, Run.objects.get().env_url) == (head.url, counter_env_url)
