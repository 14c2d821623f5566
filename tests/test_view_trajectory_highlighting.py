"""Code in a trajectory is highlighted server side (Pygments) and still goes through the one
sanitiser: a payload inside a code block stays text; the token stylesheet is generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import reverse

from rollouts.web.highlight import HL_CLASSES, code_block, stylesheet
from rollouts.web.rendering import item_body
from tests.test_view_rollout_detail import call, make_rollout, make_run, make_task, msg

XSS = '</pre><script>alert(1)</script><img src=x onerror="alert(2)"><span class="hl-k" onclick="x()">'


def test_a_fenced_block_is_highlighted_and_a_payload_in_it_stays_inert():
    html = str(item_body(msg(f"```python\nprint({XSS!r})\n```"), "message", max_chars=10_000).html)
    assert '<pre class="code hl"><span class="hl-nb">print</span>' in html
    assert "<script" not in html and "<img" not in html and "onerror" not in html.replace("onerror=", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "onclick" not in html.replace("onclick=", "")  # a payload's attribute is text, never an attribute
    assert 'onclick="' not in html


def test_a_command_argument_is_highlighted_as_shell_and_escaped():
    html = str(
        item_body(
            call("c1", "bash", json.dumps({"command": f"echo '{XSS}' | wc"})), "function_call", max_chars=10_000
        ).html
    )
    assert (
        '<dd class="f-v"><pre class="code hl"><span class="hl-nb">echo</span>'
        '<span class="hl-w"> </span><span class="hl-s1">' in html
    )
    assert html.endswith("wc</pre></dd></dl>")  # no newline the command did not have
    assert "<script" not in html and "<img" not in html and 'onclick="' not in html


def test_an_unknown_fence_language_is_plain_escaped_text():
    html = str(item_body(msg("```nosuchlang\n<b>bold</b>\n```"), "message", max_chars=10_000).html)
    assert "<b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html and 'class="code hl"' not in html


def test_only_pygments_token_classes_pass_the_sanitiser():
    from rollouts.web.sanitiser import sanitise

    out = str(sanitise('<span class="hl-k">if</span><span class="evil hl-nope">x</span><pre class="hl danger">y</pre>'))
    assert out == '<span class="hl-k">if</span><span class="">x</span><pre class="hl">y</pre>'
    assert "hl-k" in HL_CLASSES and "hl-s2" in HL_CLASSES and all(c.startswith("hl-") for c in HL_CLASSES)


def test_long_code_is_not_highlighted():
    text = "x = 1\n" * 20_000
    assert code_block(text, "python").startswith('<pre class="code">')


def test_the_token_stylesheet_is_the_generated_one_with_a_dark_variant():
    css = (Path(__file__).resolve().parent.parent / "gymweb" / "static" / "gymweb" / "highlight.css").read_text()
    assert css == stylesheet()
    assert "@media (prefers-color-scheme: dark)" in css and ".hl .hl-k" in css


@pytest.mark.django_db
def test_the_rollout_page_links_the_token_stylesheet_and_highlights_commands(signed_in):
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), calls=[{}], items=[(0, call("c1", "bash", json.dumps({"command": "ls -la /tmp"})), {})]
    )
    html = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert "/static/gymweb/highlight.css" in html
    assert '<pre class="code hl">ls<span class="hl-w"> </span>-la' in html
