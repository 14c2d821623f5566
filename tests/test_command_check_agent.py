"""``manage.py check_agent URL [--timeout S] [--json]``: prints the conformance report; exit status 0
(no errors), 1 (errors), 2 (bad URL)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from tests.bad_agents import serve
from tests.conftest import REPO
from tests.servers import free_url


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("check_agent", *args, stdout=out)
    return out.getvalue()


def fails(returncode: int, *args: str) -> tuple[str, CommandError]:
    out = io.StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("check_agent", *args, stdout=out)
    assert exc.value.returncode == returncode
    return out.getvalue(), exc.value


def test_a_conforming_agent_prints_the_report_and_passes(counter_agent_url):
    text = run(counter_agent_url)
    assert f"Agent conformance check of {counter_agent_url}/v1/responses" in text
    assert "No breach of the contract found." in text
    assert text.rstrip().endswith("PASS: 0 error(s), 0 warning(s)")


def test_warnings_alone_still_pass():
    with serve("no_usage") as agent:
        text = run(agent.url)
    assert "WARNING no_usage" in text and "PASS: 0 error(s), 1 warning(s)" in text


def test_an_agent_with_errors_exits_with_status_one_after_printing_every_finding():
    with serve("undeclared_tool") as agent:
        text, exc = fails(1, agent.url)
    assert "ERROR   undeclared_tool" in text and "how to fix:" in text and "FAIL: 2 error(s)" in text
    assert "breaks the contract: 2 error(s), 0 warning(s)" in str(exc)


def test_an_unreachable_agent_exits_with_status_one_naming_the_url():
    url = free_url()
    text, _ = fails(1, url)
    assert "unreachable" in text and f"is your service running at {url}?" in text


def test_a_bad_url_exits_with_status_two_without_echoing_credentials():
    _, exc = fails(2, "http://alice:s3cret@agent.example:9000")
    assert "s3cret" not in str(exc) and "alice" not in str(exc) and "credentials" in str(exc)
    _, exc = fails(2, "agent.example:9000")
    assert "http://" in str(exc)
    _, exc = fails(2, "http://agent.example/?token=x")
    assert "query" in str(exc)


def test_json_output_is_the_report_as_one_object():
    with serve("redirect") as agent:
        text, _ = fails(1, agent.url, "--json")
    data = json.loads(text)
    assert data["ok"] is False and data["errors"] == 1 and data["url"].endswith("/v1/responses")
    (finding,) = data["findings"]
    assert finding["code"] == "redirect" and finding["severity"] == "error"
    assert "http://127.0.0.1:1/elsewhere/v1/responses" in finding["title"]
    assert (
        finding["how_to_fix"] and finding["sent"].startswith('{"input"') and finding["received"].startswith("HTTP 307")
    )
    assert [p["name"] for p in data["probes"]] == ["counter_task", "follow_up", "string_input", "no_tools"]


def test_json_output_of_a_passing_agent_says_ok(counter_agent_url):
    data = json.loads(run(counter_agent_url, "--json"))
    assert data["ok"] is True and data["findings"] == [] and data["warnings"] == 0


def test_the_timeout_option_bounds_each_probe():
    with serve("slow") as agent:
        text, _ = fails(1, agent.url, "--timeout", "0.1")
    assert "no reply within 0.1 s" in text


@pytest.mark.slow
def test_the_exit_status_reaches_the_shell(counter_agent_url):
    def status(*args: str) -> int:
        # the agents run on 127.0.0.1: a local single-user set-up allows local targets
        proc = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "check_agent", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "GYMWEB_ALLOW_LOCAL_TARGETS": "1"},
        )
        return proc.returncode

    assert status(counter_agent_url) == 0
    with serve("partial_usage") as agent:
        assert status(agent.url, "--json") == 1
    assert status("http://user:pw@127.0.0.1:9") == 2
