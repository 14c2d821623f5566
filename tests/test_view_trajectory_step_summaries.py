"""What a step did, said on its outline row and folded header; long steps in sub-groups."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout
from rollouts.web.outline import message_gist, output_failure, sub_groups

pytestmark = pytest.mark.django_db


def _import(path):
    with path.open("rb") as fh:
        return import_rollouts(fh).run


def _page(client, rollout) -> str:
    response = client.get(reverse("rollout", args=[rollout.run_id, rollout.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_mini_swe_outline_rows_say_the_command_and_the_first_words(signed_in, shared_data):
    run = _import(shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl")
    html = _page(signed_in, Rollout.objects.filter(run=run).order_by("pk").first())
    outline = html[html.index('id="outline-body"') : html.index("</ol>", html.index('id="outline-body"'))]
    whats = re.findall(r'<span class="ol-what">([^<]*)</span>', outline)
    assert whats and whats[0].startswith("bash: find . -type f -name")
    assert len(set(whats)) > len(whats) // 2  # rows differ: not 22 identical "bash ×3"
    texts = re.findall(r'<span class="ol-text">([^<]*)</span>', outline)
    assert texts and "<think>" not in texts[0] and "&lt;think&gt;" not in texts[0]
    # the folded header carries the same summary
    assert '<code class="gist-what">bash: find . -type f -name' in html


def test_a_non_zero_exit_code_is_an_error_badge_on_the_output_and_the_row(signed_in, shared_data):
    run = _import(shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl")
    pages = [_page(signed_in, r) for r in Rollout.objects.filter(run=run)]
    assert any('<span class="badge bad">exit 1</span>' in html for html in pages)
    assert any(re.search(r'class="badge bad" title="tool outputs that failed[^"]*exit 1', html) for html in pages)


def test_output_failures_are_read_from_http_status_exit_codes_and_json_errors():
    assert output_failure({"output": "<returncode>0</returncode>\n<output>ok</output>"}) == ""
    assert output_failure({"output": "<returncode>2</returncode>\n<output>grep</output>"}) == "exit 2"
    assert output_failure({"output": "Exit code: 127\nnot found"}) == "exit 127"
    assert output_failure({"output": json.dumps({"returncode": 1, "stdout": ""})}) == "exit 1"
    assert output_failure({"output": json.dumps({"error": "no such tool"})}) == "error"
    assert output_failure({"output": json.dumps({"error": None, "result": 3})}) == ""
    assert output_failure({"output": "fine"}, tool_status=502) == "HTTP 502"


def test_message_gist_skips_thinking_and_falls_back_to_it():
    said = {"type": "message", "role": "assistant", "content": "<think>\nhmm\n</think>\nI will run the tests."}
    assert message_gist(said) == "I will run the tests."
    only = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "<think>\nplan it"}]}
    assert message_gist(only) == "plan it"


def test_a_reply_of_many_calls_with_reasoning_is_shown_in_sub_groups(signed_in):
    output = []
    for k in range(60):
        output.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": f"think {k}"}]})
        output.append(
            {"type": "function_call", "name": "search", "call_id": f"c{k}", "arguments": json.dumps({"query": f"q{k}"})}
        )
    row = {"responses_create_params": {"input": "find it"}, "response": {"output": output}, "reward": 0.0}
    rollout = Rollout.objects.get(run=import_rollouts([json.dumps(row)]).run)
    html = _page(signed_in, rollout)
    assert html.count('<details class="substep">') == 60  # 120 items: the groups start folded
    assert '<code class="fold-line">search: q7</code>' in html
    groups = sub_groups(
        [
            {"template": "x/item_reasoning.html", "seq": "0"},
            {"template": "x/item_function_call.html", "name": "bash", "seq": "1", "summary": {"line": "ls"}},
            {"template": "x/item_function_call_output.html", "seq": "2", "failed": "exit 1"},
            {"template": "x/item_message.html", "seq": "3", "gist": "done"},
        ]
    )
    assert [(g["label"], g["line"], g["failed"]) for g in groups] == [
        ("bash", "bash: ls", "exit 1"),
        ("text", "done", ""),
    ]
