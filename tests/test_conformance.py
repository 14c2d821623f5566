"""rollouts.evaluation.conformance: the agent conformance check finds every breach of the contract.

Each breach is shown by a dedicated bad agent (tests/bad_agents.py: the example counter agent with
one twist), and the check must find exactly that breach, with advice on how to fix it.
"""

from __future__ import annotations

import json

import pytest

from rollouts.engine.loop import InvalidBaseURL
from rollouts.evaluation.conformance import Report, check_agent, check_agent_sync
from rollouts.evaluation.conformance_checks import CHECKS, ERROR, WARNING, check_reply
from tests.bad_agents import REQUESTS, SLOW_DELAY_S, serve
from tests.servers import LOCAL, AgentService, RawServer, Reply, async_test, call, free_url, message, reply

PROBES = ["counter_task", "follow_up", "string_input", "no_tools"]


def run_check(name: str, **kwargs) -> tuple[Report, list]:
    """Check the bad agent ``name``; returns the report and the requests the agent received."""
    with serve(name) as agent:
        report = check_agent_sync(agent.url, **kwargs, policy=LOCAL)
        return report, list(agent.app[REQUESTS])


def found(report: Report, code: str, severity: str) -> list:
    """The findings of ``code``; asserts there is one, of ``severity``, with advice and evidence."""
    hits = [f for f in report.findings if f.code == code]
    assert hits, f"no {code!r} finding in:\n{report.to_text()}"
    for f in hits:
        assert f.severity == severity
        assert f.how_to_fix.strip() and f.rule.strip() and f.title.strip()
        assert f.sent.startswith("{") and f.received and f.probes
    return hits


# --- a conforming agent --------------------------------------------------------------------------


def test_the_example_counter_agent_passes_with_no_findings(counter_agent_url):
    report = check_agent_sync(counter_agent_url, policy=LOCAL)
    assert report.ok and report.findings == [], report.to_text()
    assert [p.name for p in report.probes] == PROBES
    assert all(p.status == 200 and p.latency_ms is not None and not p.findings for p in report.probes)
    assert report.to_text().endswith("PASS: 0 error(s), 0 warning(s)")


def test_the_follow_up_probe_sends_the_agents_own_calls_with_one_output_each():
    report, requests = run_check("sets_cookie")
    assert report.ok
    first_reply_calls = [i for i in requests[1][1]["input"] if i.get("type") == "function_call"]
    outputs = [i for i in requests[1][1]["input"] if i.get("type") == "function_call_output"]
    assert [c["name"] for c in first_reply_calls] == ["increment_counter", "increment_counter"]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in first_reply_calls]
    assert all(o["output"] == '{"success":true}' for o in outputs)
    assert requests[2][1]["input"] == "add 4 then get the count"
    assert requests[3][1]["tools"] == []


def test_the_agents_cookies_come_back_within_one_conversation_and_nowhere_else():
    report, requests = run_check("sets_cookie")
    cookies = [c for c, _ in requests]
    assert cookies == ["", "agent_state=call0", "", ""]


def test_the_text_and_json_forms_of_the_report_list_every_probe(counter_agent_url):
    report = check_agent_sync(counter_agent_url, policy=LOCAL)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is True and data["errors"] == 0 and data["findings"] == []
    assert [p["name"] for p in data["probes"]] == PROBES
    assert all(p["sent"].startswith('{"input"') and p["received"].startswith("HTTP 200") for p in data["probes"])
    text = report.to_text()
    for name in PROBES:
        assert name in text


# --- transport -------------------------------------------------------------------------------------


def test_a_refused_connection_is_one_unreachable_finding_naming_the_url():
    url = free_url()
    report = check_agent_sync(url, policy=LOCAL)
    (finding,) = report.findings
    assert finding.code == "unreachable" and finding.severity == ERROR
    assert f"{url}/v1/responses" in finding.title and url in finding.how_to_fix
    assert len(report.probes) == 1 and not report.ok


@async_test
async def test_a_connection_closed_without_a_reply_is_reported():
    async with RawServer("drop") as server:
        report = await check_agent(server.url, policy=LOCAL)
    found(report, "connection_dropped", ERROR)
    assert report.codes() == {"connection_dropped"}


@async_test
async def test_a_service_that_does_not_speak_http_is_reported():
    async with RawServer("garbage") as server:
        report = await check_agent(server.url, policy=LOCAL)
    found(report, "not_http", ERROR)


@async_test
async def test_a_reply_slower_than_the_timeout_is_an_error_naming_the_knob():
    async with AgentService(Reply(json=reply(message()), delay=1.0)) as agent:
        report = await check_agent(agent.url, timeout_s=0.2, policy=LOCAL)
    (finding,) = found(report, "timeout", ERROR)
    assert "0.2 s" in finding.title and "remote_responses_timeout_s" in finding.how_to_fix
    assert finding.probes == PROBES


def test_a_slow_reply_is_a_warning_with_its_latency():
    report, _ = run_check("slow", slow_s=0.1)
    hits = found(report, "slow", WARNING)
    assert report.ok and report.codes() == {"slow"}
    assert hits and report.probes
    assert all("more than 0.1 s" in f.title for f in hits)
    assert all(float(f.title.split("took ")[1].split(" s")[0]) >= SLOW_DELAY_S - 0.05 for f in hits)
    assert sorted(p for f in hits for p in f.probes) == sorted(PROBES)
    assert all(p.latency_ms >= SLOW_DELAY_S * 1000 - 50 for p in report.probes)


def test_a_bad_url_raises_without_echoing_credentials():
    with pytest.raises(InvalidBaseURL) as exc:
        check_agent_sync("http://alice:s3cret@127.0.0.1:9102", policy=LOCAL)
    assert "s3cret" not in str(exc.value)
    with pytest.raises(InvalidBaseURL):
        check_agent_sync("ftp://127.0.0.1/", policy=LOCAL)


# --- HTTP (rules 1, 2) -----------------------------------------------------------------------------


@async_test
async def test_it_never_follows_a_redirect():
    async with AgentService(reply(message())) as target:
        location = f"{target.url}/v1/responses"
        async with AgentService(Reply(307, text="", headers=[("Location", location)])) as redirector:
            report = await check_agent(redirector.url, policy=LOCAL)
    (finding,) = found(report, "redirect", ERROR)
    assert location in finding.title and finding.received.startswith("HTTP 307")
    assert target.requests == []
    assert report.codes() == {"redirect"}


@async_test
async def test_a_relative_redirect_is_shown_resolved_against_the_request_url():
    async with AgentService(Reply(308, text="", headers=[("Location", "/v2/responses")])) as redirector:
        report = await check_agent(redirector.url, policy=LOCAL)
    (finding,) = found(report, "redirect", ERROR)
    assert (
        finding.title == f"HTTP 308 redirect to {redirector.url}/v2/responses (Location: /v2/responses) (not followed)"
    )


def test_it_reports_a_redirect_as_an_error_whatever_the_target():
    report, requests = run_check("redirect")
    (finding,) = found(report, "redirect", ERROR)
    assert "HTTP 307 redirect to http://127.0.0.1:1/elsewhere/v1/responses (not followed)" == finding.title
    assert "point the agent url (nemo gym's agent_base_url) at the final address" in finding.how_to_fix.lower()
    assert finding.probes == PROBES and len(requests) == 4


def test_it_reports_an_error_status_with_the_start_of_the_body():
    report, _ = run_check("server_error")
    (finding,) = found(report, "http_error", ERROR)
    assert finding.received.startswith("HTTP 500") and "KeyError: 'input'" in finding.received
    assert finding.probes == PROBES and report.codes() == {"http_error"}


def test_it_reports_a_body_that_is_not_json():
    report, _ = run_check("html")
    (finding,) = found(report, "not_json", ERROR)
    assert "text/html" in finding.title and "Welcome to nginx" in finding.received


def test_it_reports_json_that_is_not_an_object():
    report, _ = run_check("json_list")
    (finding,) = found(report, "not_object", ERROR)
    assert "list" in finding.title


# --- shape (rule 3) --------------------------------------------------------------------------------


def test_it_reports_missing_top_level_fields_in_parse_replys_words():
    report, _ = run_check("missing_fields")
    (finding,) = found(report, "invalid_response", ERROR)
    for name in ("id: Field required", "created_at: Field required", "model: Field required"):
        assert name in finding.title
    assert report.codes(ERROR) == {"invalid_response"}


def test_it_reports_each_invalid_output_item_with_its_position():
    report, _ = run_check("bad_item")
    titles = [f.title for f in found(report, "invalid_output_item", ERROR)]
    assert any(
        t.startswith("output[0] (function_call)")
        and "output.0.call_id: Field required" in t
        and "output.0.arguments" in t
        for t in titles
    )
    assert any(t.startswith("output[1] (thought)") and "unknown output item type 'thought'" in t for t in titles)
    assert report.codes(ERROR) == {"invalid_output_item"}


def test_it_reports_a_partial_usage_as_an_error():
    report, _ = run_check("partial_usage")
    (finding,) = found(report, "partial_usage", ERROR)
    assert "total_tokens: Field required" in finding.title and "input_tokens_details" in finding.title
    assert report.codes() == {"partial_usage"}


@pytest.mark.parametrize("name", ["no_usage", "null_usage"])
def test_a_missing_usage_is_only_a_warning(name):
    report, _ = run_check(name)
    (finding,) = found(report, "no_usage", WARNING)
    assert "token metrics will be empty" in finding.title
    assert finding.probes == PROBES
    assert report.ok and report.codes() == {"no_usage"}
    assert report.to_text().endswith("PASS: 0 error(s), 1 warning(s)")


# --- asks and call ids (rules 4, 5, 6, 10) ---------------------------------------------------------


def test_it_reports_an_ask_for_an_undeclared_tool():
    report, _ = run_check("undeclared_tool")
    hits = found(report, "undeclared_tool", ERROR)
    assert all("'delete_everything'" in f.title for f in hits)
    assert any("declared: get_counter_value, increment_counter" in f.title for f in hits)
    assert any("declared: none (tools: [])" in f.title and f.probes == ["no_tools"] for f in hits)
    assert report.codes(ERROR) == {"undeclared_tool"} and not report.ok


def test_it_reports_asks_that_share_a_call_id():
    report, _ = run_check("duplicate_call_ids")
    (finding,) = found(report, "duplicate_call_id", ERROR)
    assert "2 asks share call_id 'call_same'" in finding.title
    assert "only the last" in finding.how_to_fix
    assert "counter_task" in finding.probes


def test_it_reports_a_function_call_output_for_a_call_never_made():
    report, _ = run_check("orphan_output")
    (finding,) = found(report, "orphan_call_output", ERROR)
    assert "'call_never_made'" in finding.title and finding.probes == PROBES
    assert report.codes(ERROR) == {"orphan_call_output"}


def test_an_output_pairing_a_call_from_the_input_is_not_an_orphan():
    request = {"input": [{"role": "user", "content": "hi"}, call("get_counter_value", {}, call_id="c_1")], "tools": []}
    data = reply(call_output("c_1", "9"), message())
    assert [code for code, _ in check_reply(request, data)] == []


def test_malformed_arguments_are_a_warning():
    report, _ = run_check("bad_arguments")
    hits = found(report, "arguments_not_json", WARNING)
    assert any("'{count: 1'" in f.title for f in hits)
    assert "json.dumps" in hits[0].how_to_fix
    assert report.ok and report.codes() == {"arguments_not_json"}


def test_it_reports_a_tool_name_that_is_not_a_safe_url_segment():
    report, _ = run_check("unsafe_tool_name")
    (finding, *_) = found(report, "unsafe_tool_name", ERROR)
    assert "'../seed_session'" in finding.title and "not a safe URL path segment" in finding.title
    assert report.codes(ERROR) == {"unsafe_tool_name", "undeclared_tool"}


def test_it_reports_an_ask_for_one_of_the_envs_own_routes():
    report, _ = run_check("reserved_tool_name")
    (finding, *_) = found(report, "reserved_tool_name", ERROR)
    assert "'verify'" in finding.title and "environment's own routes" in finding.title
    assert report.codes(ERROR) == {"reserved_tool_name", "undeclared_tool"}


def test_an_ask_reusing_an_earlier_call_id_is_a_warning():
    report, _ = run_check("repeated_call_id")
    (finding,) = found(report, "repeated_call_id", WARNING)
    assert finding.probes == ["follow_up"] and report.ok


def test_a_reply_with_neither_asks_nor_a_message_is_a_warning():
    report, _ = run_check("no_progress")
    (finding,) = found(report, "no_progress", WARNING)
    assert "(reasoning)" in finding.title and "loops" in finding.how_to_fix
    assert report.ok and report.codes() == {"no_progress"}


def test_an_incomplete_reply_without_a_message_is_not_a_loop():
    data = reply(incomplete_details={"reason": "max_output_tokens"})
    assert check_reply({"input": [], "tools": []}, data) == []


def test_a_valid_reply_has_no_findings_and_every_code_has_advice():
    request = {
        "input": [{"role": "user", "content": "add 1"}],
        "tools": [{"type": "function", "name": "increment_counter"}],
    }
    assert check_reply(request, reply(call("increment_counter", {"count": 1}))) == []
    assert check_reply(request, reply(message())) == []
    assert all(c.how_to_fix and c.rule and c.severity in (ERROR, WARNING) for c in CHECKS.values())


def test_the_text_report_escapes_control_characters_from_the_service():
    report, _ = run_check("server_error")
    report.findings[0].received = "HTTP 500: \x1b[31mred\x07"
    text = report.to_text()
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[31mred\\x07" in text


def call_output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}
