"""The trajectory page renders item content by what it is: Markdown messages, folded
thinking, tool-call arguments as fields, diffs, JSON trees (also JSON inside JSON strings), and
long texts shown in full in place through the item endpoint. Uses NeMo Gym's real traces."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils.html import escape

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout, TrajectoryItem
from rollouts.thinking import split_thinking
from rollouts.web.diffs import looks_like_diff
from tests.test_view_rollout_detail import call, make_rollout, make_run, make_task, msg, out, page

HX = {"HX-Request": "true"}


def _import(shared_data, name):
    with (shared_data / name / "example_rollouts.jsonl").open("rb") as fh:
        return import_rollouts(fh).run


def _body(html: str, key: str) -> str:
    """The markup of the item body ``key`` (a seq or ``input-K``) on a page."""
    start = html.index(f'id="body-{key}"')
    end = html.find('<div class="item-tools">', start)
    return html[start:end]


def _text(markup: str) -> str:
    """Text of markup, entities kept (what a reader sees, still escaped)."""
    return re.sub(r"<[^>]+>", "", markup)


def _item_url(rollout, key, query=""):
    return reverse("rollout_item", args=[rollout.run_id, rollout.pk, key]) + (f"?{query}" if query else "")


# -- Markdown ------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_assistant_and_user_text_is_markdown_headings_lists_code_fences_and_tables(signed_in):
    text = "# Plan\n\n1. read\n2. fix\n\n- a *b* **c**\n\n```python\nif x < 1:\n    pass\n```\n\n| k | v |\n|---|--:|\n| a | 1 |\n\n`x<y`"
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), calls=[{}], items=[(0, msg(text), {}), (0, msg("## Q\n- one", role="user"), {})]
    )
    html = page(signed_in, rollout)
    body = _body(html, "0")
    assert (
        "<h1>Plan</h1>" in body
        and "<ol>\n<li>read</li>" in body
        and "<em>b</em>" in body
        and "<strong>c</strong>" in body
    )
    # a fence keeps its whitespace, escaped, highlighted as its language
    assert (
        '<pre class="code hl"><span class="hl-k">if</span> <span class="hl-n">x</span> <span class="hl-o">&lt;</span>'
        in body
    )
    assert '<span class="hl-p">:</span>\n    <span class="hl-k">pass</span>\n</pre>' in body
    assert "<table>" in body and "<th>k</th>" in body and "<td>1</td>" in body and "style=" not in body
    assert "<code>x&lt;y</code>" in body
    assert "<h2>Q</h2>" in _body(html, "1") and "<li>one</li>" in _body(html, "1")


@pytest.mark.django_db
def test_the_plain_text_toggle_loads_the_text_as_it_came_and_back(signed_in):
    run = make_run()
    rollout = make_rollout(run, make_task(run), calls=[{}], items=[(0, msg("# Plan\n- a"), {})])
    html = page(signed_in, rollout)
    plain = _item_url(rollout, "0", "view=plain")
    assert (
        f'<a class="view-toggle" href="{plain}" hx-get="{plain}" hx-target="closest .item-body" hx-swap="outerHTML">plain text</a>'
        in html
    )
    response = signed_in.get(plain, headers=HX)
    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div class="item-body" id="body-0">')
    assert '<pre class="plain"># Plan\n- a</pre>' in fragment and "<h1>" not in fragment
    back = _item_url(rollout, "0", "view=rendered")
    assert f'href="{back}"' in fragment and ">rendered</a>" in fragment
    assert "<h1>Plan</h1>" in signed_in.get(back, headers=HX).content.decode()


# -- thinking ------------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("tag", ["think", "thinking"])
def test_thinking_spans_in_message_text_are_folded_with_their_length(signed_in, tag):
    text = f"<{tag}>\nI should check the file first.\n</{tag}>\n\nThe answer is **42**."
    run = make_run()
    rollout = make_rollout(run, make_task(run), calls=[{}], items=[(0, msg(text), {})])
    body = _body(page(signed_in, rollout), "0")
    fold = re.search(r'<details class="think">(.*?)</details>', body, re.S)
    assert fold, body  # no "open": folded by default
    assert 'thinking <span class="think-len">32 characters</span>' in fold.group(1)
    assert "I should check the file first." in fold.group(1)
    assert "<strong>42</strong>" in body[fold.end() :]  # the answer, outside the fold, as Markdown
    assert f"&lt;{tag}&gt;" not in body and f"<{tag}>" not in body


def test_a_closing_tag_alone_folds_what_came_before_and_an_unclosed_one_what_comes_after():
    assert split_thinking("plan it</think>Done.") == [(True, "plan it"), (False, "Done.")]
    assert split_thinking("Hi <think>still going") == [(False, "Hi "), (True, "still going")]
    assert split_thinking("no tags") == [(False, "no tags")]


@pytest.mark.django_db
def test_reasoning_items_and_real_think_blocks_are_folded(signed_in, shared_data):
    run = _import(shared_data, "mini_swe_agent_2")
    rollout = run.rollouts.order_by("task_index").first()
    html = page(signed_in, rollout)
    first = TrajectoryItem.objects.filter(rollout=rollout, kind="message").order_by("seq").first()
    body = _body(html, str(first.seq))
    assert re.search(
        r'<details class="think"><summary class="think-sum">thinking <span class="think-len">[\d,]+ characters</span></summary><pre class="think-text">.{100}',
        body,
        re.S,
    )
    assert "&lt;think&gt;" not in html  # no think tag shown as text anywhere
    run2 = make_run()
    r2 = make_rollout(
        run2,
        make_task(run2),
        calls=[{}],
        items=[(0, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "weigh both options"}]}, {})],
    )
    body = _body(page(signed_in, r2), "0")
    assert (
        '<details class="reasoning"><summary class="think-sum">reasoning <span class="think-len">18 characters</span>'
        in body
    )


# -- tool-call arguments --------------------------------------------------------------------------
@pytest.mark.django_db
def test_arguments_are_a_field_list_with_commands_as_code_blocks_whitespace_kept(signed_in, shared_data):
    run = _import(shared_data, "mini_swe_agent_2")
    item = next(
        i
        for i in TrajectoryItem.objects.filter(rollout__run=run, kind="function_call")
        if "\n" in json.loads(i.payload["arguments"])["command"]
    )
    command = json.loads(item.payload["arguments"])["command"]
    html = page(signed_in, item.rollout)
    body = _body(html, str(item.seq))
    assert body.count('<dt class="f-k">command</dt>') == 1
    # real newlines, not \n escapes; highlighted as shell (the text reads the same without the spans)
    assert '<pre class="code hl">' in body and escape(command) in _text(body)
    assert "\\n" not in _text(body) or "\\n" in command
    one_line = TrajectoryItem.objects.filter(rollout=item.rollout, kind="function_call").order_by("seq").first()
    assert '<pre class="code hl">' in _body(html, str(one_line.seq))  # a command is code even on one line


@pytest.mark.django_db
def test_other_argument_values_keep_their_type(signed_in, shared_data):
    run = _import(shared_data, "workplace_assistant")
    rollout = run.rollouts.order_by("task_index").first()
    item = TrajectoryItem.objects.filter(rollout=rollout, kind="function_call").order_by("seq").first()
    body = _body(page(signed_in, rollout), str(item.seq))
    assert '<dt class="f-k">time_min</dt><dd class="f-v"><span class="j-s">2023-11-30</span></dd>' in body
    assert '<dt class="f-k">plot_type</dt><dd class="f-v"><span class="j-s">bar</span></dd>' in body
    run2 = make_run()
    r2 = make_rollout(
        run2,
        make_task(run2),
        calls=[{}],
        items=[
            (
                0,
                call("c1", "f", json.dumps({"n": 3, "ok": True, "none": None, "tags": ["a", "b"], "opt": {"x": 1}})),
                {"asked": True},
            )
        ],
    )
    body = _body(page(signed_in, r2), "0")
    assert '<dd class="f-v"><span class="j-n">3</span></dd>' in body and '<span class="j-l">true</span>' in body
    assert '<span class="j-l">null</span>' in body
    assert (
        '<dt class="f-k">tags</dt><dd class="f-v"><span class="j-s">[&quot;a&quot;, &quot;b&quot;]</span></dd>' in body
    )
    assert '<dt class="f-k">opt</dt><dd class="f-v"><dl class="fields"><dt class="f-k">x</dt>' in body


# -- diffs ---------------------------------------------------------------------------------------
PATCH = "diff --git a/x.py b/x.py\nindex 1..2 100644\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n def f():\n-    return 1\n+    return 2\n"


@pytest.mark.django_db
def test_a_diff_argument_is_shown_as_a_diff_with_added_and_removed_lines_marked(signed_in):
    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, call("c1", "apply_patch", json.dumps({"patch": PATCH})), {"asked": True}),
            (0, out("c1", PATCH), {"origin": "gym", "tool_status": 200}),
        ],
    )
    html = page(signed_in, rollout)
    for key in ("0", "1"):
        body = _body(html, key)
        assert '<div class="diff-stat">diff · 1 file · +1 −1</div><pre class="diff">' in body
        assert '<span class="d-d">-    return 1</span>\n<span class="d-a">+    return 2</span>' in body
        assert '<span class="d-h">@@ -1,3 +1,3 @@</span>' in body and '<span class="d-f">+++ b/x.py</span>' in body
        assert "\n def f():\n" in body  # context lines as they are


@pytest.mark.django_db
def test_a_verify_field_holding_a_patch_is_shown_as_a_diff(signed_in, shared_data):
    run = _import(shared_data, "mini_swe_agent_2")
    rollout = run.rollouts.order_by("task_index").first()
    patch = json.loads(rollout.verify_json)["metadata"]["model_patch"]
    added = sum(1 for line in patch.split("\n") if line.startswith("+") and not line.startswith("+++"))
    html = page(signed_in, rollout)
    verify = html[html.index('id="verify"') :]
    assert '<dt class="f-k">model_patch</dt><dd class="f-v"><div class="diff-stat">diff · ' in verify
    assert f"+{added:,} " in verify
    assert verify.count('<span class="d-a">') == added


def test_text_that_only_mentions_diffs_is_not_a_diff():
    assert looks_like_diff(PATCH)
    assert looks_like_diff("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b")
    assert not looks_like_diff("use --- and +++ in a diff\n@@ is a hunk")
    assert not looks_like_diff("- a list\n- of things")


# -- JSON ----------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_json_inside_json_strings_is_decoded_level_after_level(signed_in):
    inner = json.dumps({"stdout": "line 1\nline 2", "code": 0})
    middle = json.dumps({"result": inner, "tags": ["x"]})
    output = json.dumps({"status": "ok", "body": middle})
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), calls=[{}], items=[(0, out("c1", output), {"origin": "gym", "tool_status": 200})]
    )
    html = page(signed_in, rollout)
    body = _body(html, "0")
    assert body.count('<span class="j-note">JSON in a string</span>') == 2
    assert '<span class="j-k">stdout</span>: <pre class="j-m">line 1\nline 2</pre>' in body
    assert '<span class="j-k">code</span>: <span class="j-n">0</span>' in body
    assert "\\&quot;" not in body and '\\"' not in body  # no escaped quotes left
    assert body.count('<details class="j" open="">') == 3  # objects fold; an array of short scalars is one line
    assert '<span class="j-k">tags</span>: <span class="j-s">[&quot;x&quot;]</span>' in body
    raw = _item_url(rollout, "0", "view=plain")
    assert f'href="{raw}"' in html and ">raw</a>" in html
    fragment = signed_in.get(raw, headers=HX).content.decode()
    assert "&quot;body&quot;: &quot;{\\&quot;result\\&quot;" in fragment  # the raw toggle: as it came, pretty-printed


@pytest.mark.django_db
def test_a_real_tau2_verify_result_decodes_its_tool_outputs(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rollout = run.rollouts.order_by("task_index").first()
    html = page(signed_in, rollout)
    verify = html[html.index('id="verify"') :]
    assert '<span class="j-note">JSON in a string</span>' in verify
    assert '<span class="j-k">user_id</span>: <span class="j-s">&quot;' in verify


@pytest.mark.django_db
def test_a_workplace_tool_output_is_a_json_tree(signed_in, shared_data):
    run = _import(shared_data, "workplace_assistant")
    rollout = run.rollouts.order_by("task_index").first()
    item = TrajectoryItem.objects.filter(rollout=rollout, kind="function_call_output").order_by("seq").first()
    body = _body(page(signed_in, rollout), str(item.seq))
    assert (
        '<div class="json"><details class="j" open=""><summary class="j-sum">{ <span class="j-c">1 key</span>' in body
    )
    assert '<span class="j-k">output</span>: <span class="j-s">&quot;plots/' in body


# -- long content in place -------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_23675_character_tau2_system_prompt_shows_its_head_and_loads_the_rest_in_place(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rollout = next(
        r
        for r in run.rollouts.order_by("task_index")
        if len(json.loads(r.task.row_json)["responses_create_params"]["input"][0]["content"]) == 23_675
    )
    prompt = json.loads(rollout.task.row_json)["responses_create_params"]["input"][0]["content"]
    html = page(signed_in, rollout)
    body = _body(html, "input-0")
    assert "… 3,675 more characters" in body
    full = _item_url(rollout, "input-0", "full=1")
    assert (
        f'<a class="show-all" href="{full}" hx-get="{full}" hx-target="closest .item-body" hx-swap="outerHTML">show all 23,675 characters</a>'
        in html
    )
    fragment = signed_in.get(full, headers=HX).content.decode()
    assert fragment.lstrip().startswith('<div class="item-body" id="body-input-0">')
    assert "<html" not in fragment and "more characters" not in fragment and "show all" not in fragment
    whole = signed_in.get(_item_url(rollout, "input-0", "full=1&view=plain"), headers=HX).content.decode()
    assert f'<pre class="plain">{escape(prompt)}</pre>' in whole  # every character, in place
    page_fallback = signed_in.get(full)  # without HTMX: a page with the whole item (the href works)
    assert (
        page_fallback.status_code == 200
        and "<html" in page_fallback.content.decode()
        and "more characters" not in page_fallback.content.decode()
    )


@pytest.mark.django_db
def test_show_all_expands_messages_tool_outputs_and_verify_fields(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_CHARS = 100
    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, msg("m" * 150 + " END"), {}),
            (0, out("c1", "o" * 150 + " END"), {"origin": "gym", "tool_status": 200}),
            (0, call("c2", "bash", json.dumps({"command": "c" * 150 + " END"})), {"asked": True}),
        ],
        verify={"reward": 1.0, "metadata": {"model_patch": PATCH + "+" + "p" * 150 + "\n"}},
    )
    html = page(signed_in, rollout)
    assert html.count('class="show-all"') == 4 and " END" not in html
    for key in ("0", "1", "2"):
        fragment = signed_in.get(_item_url(rollout, key, "full=1"), headers=HX).content.decode()
        assert " END" in _text(fragment) and "more character" not in fragment
    verify = signed_in.get(_item_url(rollout, "verify", "full=1"), headers=HX).content.decode()
    assert verify.lstrip().startswith('<section class="card traj-verify" id="verify"') and "p" * 150 in verify


@pytest.mark.django_db
def test_the_item_endpoint_requires_login_and_answers_404_outside_the_rollout(client, signed_in, django_user_model):
    run = make_run()
    rollout = make_rollout(run, make_task(run), calls=[{}], items=[(0, msg("hello"), {})])
    failed = make_rollout(
        run,
        make_task(run, task_index=1),
        status=Rollout.Status.FAILED,
        error="boom",
        calls=[{}],
        items=[(0, msg("partial"), {})],
    )
    other = make_run("other")
    assert signed_in.get(_item_url(rollout, "0")).status_code == 200
    assert signed_in.get(reverse("rollout_item", args=[other.pk, rollout.pk, "0"])).status_code == 404  # not this run's
    assert signed_in.get(_item_url(rollout, "7")).status_code == 404  # no such item
    assert signed_in.get(_item_url(rollout, "input-3")).status_code == 404
    assert signed_in.get(_item_url(rollout, "0")[:-2] + "..%2Fraw.json/").status_code == 404
    assert signed_in.get(_item_url(rollout, "payload")).status_code == 404
    assert signed_in.get(_item_url(failed, "verify")).status_code == 404  # no verify result
    assert signed_in.get(_item_url(failed, "0"), headers=HX).status_code == 200  # items of any attempt
    assert signed_in.post(_item_url(rollout, "0")).status_code == 405
    signed_in.logout()
    response = signed_in.get(_item_url(rollout, "0"))
    assert response.status_code == 302 and reverse("login") in response["Location"]
    response = signed_in.get(_item_url(rollout, "0"), headers=HX)  # HTMX: told to go to the sign-in page
    assert reverse("login") in response["HX-Redirect"] and "hello" not in response.content.decode()
