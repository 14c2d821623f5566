"""A refused agent reply on the rollout page, in the raw JSON and in the API: kept as it came,
escaped, with the validation errors pointing into it; the attempt's agent and env URLs; and a run's
URL change on its page. Collected for real: ``manage.py collect`` against an agent on 127.0.0.1."""

from __future__ import annotations

import json
import re

import pytest
from aiohttp import web
from django.core.management import call_command
from django.urls import reverse

from gymweb.examples._serve import BackgroundServer
from rollouts.models import RefusedReply, Rollout, Run
from rollouts.tokens import create_token

pytestmark = pytest.mark.django_db(transaction=True)

XSS = "<script>alert('refused')</script>"
BAD_REPLY = {
    "id": "resp_1",
    "created_at": 1.0,
    "model": "m",
    "object": "response",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": XSS, "annotations": []}],
        },
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ],
    "usage": {"input_tokens": 3},
}


@pytest.fixture
def bad_agent():
    """An agent that answers every call with ``BAD_REPLY`` (exact bytes kept in ``sent``)."""
    sent = json.dumps(BAD_REPLY, indent=1).encode()

    async def responses(request):
        await request.read()
        return web.Response(body=sent, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    server = BackgroundServer(app).start()
    yield server.url, sent
    server.stop()


@pytest.fixture
def refused_rollout(tmp_path, bad_agent, counter_env_url, counter_tasks_path):
    url, sent = bad_agent
    call_command(
        "collect",
        "--agent-url",
        url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(tmp_path / "r.jsonl"),
        "--no-progress",
        "--limit",
        "1",
        "--no-health-check",
    )
    rollout = Rollout.objects.get()
    assert rollout.failure_kind == "agent_invalid_response" and rollout.terminal
    return rollout, url, sent


def test_the_refused_body_is_stored_whole_with_the_attempt(refused_rollout, counter_env_url):
    rollout, url, sent = refused_rollout
    kept = RefusedReply.objects.get(rollout=rollout)
    assert bytes(kept.body) == sent and kept.size == len(sent) and not kept.truncated
    assert kept.http_status == 200 and kept.content_type.startswith("application/json")
    paths = [e["path"] for e in kept.errors]
    assert ["output", 1, "action"] in paths and ["usage", "output_tokens"] in paths
    assert (rollout.agent_url, rollout.env_url) == (url, counter_env_url)


def test_the_page_shows_the_body_escaped_with_each_error_pointing_at_its_line(
    refused_rollout, signed_in, counter_env_url
):
    rollout, url, _ = refused_rollout
    html = signed_in.get(rollout.get_absolute_url()).content.decode()
    assert 'id="refused-reply"' in html
    assert XSS not in html, "model output must never reach the page unescaped"
    assert "&lt;script&gt;alert(&#x27;refused&#x27;)&lt;/script&gt;" in html
    lines = dict(re.findall(r'id="refused-L(\d+)" data-line="\d+">([^<]*)</span>', html))
    assert lines, "the body is shown line by line"
    links = re.findall(r"<code>([^<]+)</code>: ([^<]+) — <a href=\"#refused-L(\d+)\">", html)
    by_path = {where: lines[n] for where, _, n in links}
    assert by_path["usage.output_tokens"].strip() == "&quot;usage&quot;: {"
    assert by_path["output.1.action"].strip() == "{"  # the web_search_call item that lacks it
    marked = re.findall(r'class="refused-line refused-mark" id="refused-L(\d+)"', html)
    assert set(marked) == {n for _, _, n in links}
    assert f'id="attempt-agent-url">{url}<' in html and f'id="attempt-env-url">{counter_env_url}<' in html


def test_the_raw_json_and_the_api_give_the_refused_reply(refused_rollout, signed_in, user, client):
    rollout, _, sent = refused_rollout
    raw = signed_in.get(reverse("rollout_raw", args=[rollout.run_id, rollout.pk]) + "?item=refused")
    assert raw.status_code == 200
    data = raw.json()
    assert data["body"] == sent.decode() and data["http_status"] == 200 and data["truncated"] is False
    assert ["output", 1, "action"] in [e["path"] for e in data["errors"]]
    token = create_token(user, "tests")[1]
    api = client.get(f"/api/v1/rollouts/{rollout.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert api["refused_reply"]["body"] == sent.decode()
    assert api["refused_reply"]["errors"] == data["errors"]
    assert api["agent_url"] == rollout.agent_url and api["env_url"] == rollout.env_url


def test_a_success_has_no_refused_reply(
    tmp_path, counter_agent_url, counter_env_url, counter_tasks_path, signed_in, user, client
):
    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(tmp_path / "r.jsonl"),
        "--no-progress",
        "--limit",
        "1",
        "--no-health-check",
    )
    rollout = Rollout.objects.get()
    assert rollout.status == "succeeded" and not RefusedReply.objects.exists()
    assert 'id="refused-reply"' not in signed_in.get(rollout.get_absolute_url()).content.decode()
    assert signed_in.get(reverse("rollout_raw", args=[rollout.run_id, rollout.pk]) + "?item=refused").status_code == 404
    token = create_token(user, "tests")[1]
    assert (
        client.get(f"/api/v1/rollouts/{rollout.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()["refused_reply"]
        is None
    )


def test_a_body_past_the_cap_is_kept_cut_and_the_page_says_so(
    tmp_path, bad_agent, counter_env_url, counter_tasks_path, signed_in, settings
):
    settings.GYMWEB_FAILED_REPLY_MAX_BYTES = 100
    url, sent = bad_agent
    call_command(
        "collect",
        "--agent-url",
        url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(tmp_path / "r.jsonl"),
        "--no-progress",
        "--limit",
        "1",
        "--no-health-check",
    )
    kept = RefusedReply.objects.get()
    assert bytes(kept.body) == sent[:100] and kept.truncated and kept.size == len(sent)
    html = signed_in.get(kept.rollout.get_absolute_url()).content.decode()
    assert f"Only the first 100 bytes of {len(sent)} are kept" in html


def test_the_run_page_shows_a_url_change(tmp_path, counter_agent_url, counter_env_url, counter_tasks_path, signed_in):
    args = [
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(tmp_path / "r.jsonl"),
        "--no-progress",
        "--limit",
        "1",
        "--no-health-check",
    ]
    call_command("collect", "--agent-url", "http://127.0.0.1:9", *args)
    call_command("collect", "--agent-url", counter_agent_url, "--resume", "--allow-url-change", *args)
    run = Run.objects.get()
    html = signed_in.get(run.get_absolute_url()).content.decode()
    assert 'id="url-changed"' in html
    changes = html[html.index('id="url-changes"') :]
    assert 'http://127.0.0.1:9</span> → <span class="mono">' + counter_agent_url in changes
