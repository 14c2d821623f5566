"""The compare page's side by side on a real NeMo Gym trace: the two trajectories aligned step by
step, what is identical shown once and folded, what differs diffed (escaped), and a link to the
first divergence."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts.models import Run
from rollouts.web.compare_align import pair_items

from .test_xss import EVIL, assert_inert

pytestmark = pytest.mark.django_db


def _write(tmp_path, name, row):
    path = tmp_path / name / "rollouts.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(row) + "\n")
    call_command("import_rollouts", str(path), "--name", name, "--no-health-check")
    return Run.objects.get(name=name)


def _pair(shared_data, tmp_path, change=True):
    row = json.loads((shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").read_text().splitlines()[0])
    a = _write(tmp_path, "a", row)
    if change:
        message = [o for o in row["response"]["output"] if o.get("type") == "message"][-1]
        message["content"][0]["text"] = "I am done.\n" + EVIL
    b = _write(tmp_path, "b", row)
    return a, b, row


def _side(signed_in, a, b, task):
    html = signed_in.get(reverse("compare"), {"a": a.pk, "b": b.pk, "task": task}).content.decode()
    return html, html[html.index('<section id="side-by-side"') : html.index('<div class="grid two compare-lists">')]


def test_identical_steps_are_shown_once_folded_and_the_first_divergence_is_linked(signed_in, shared_data, tmp_path):
    a, b, row = _pair(shared_data, tmp_path)
    html, side = _side(signed_in, a, b, row["_ng_task_index"])
    assert_inert(html)
    assert side.count('href="#first-divergence"') == 1 and side.count('id="first-divergence"') == 1
    # the long system prompt is on the page once, in the folded task input
    prompt = row["responses_create_params"]["input"][0]["content"]
    snippet = prompt[:60].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    snippet = snippet.replace("'", "&#x27;")
    assert side.count(snippet) == 1
    assert re.search(r'aligned-same" data-row="0">\s*<summary><span class="step-title">Task input</span>', side)
    folded = side[: side.index('id="first-divergence"')]
    assert folded.count("identical on both sides</span>") >= 2
    divergence = side[side.index('id="first-divergence"') :]
    diff = divergence[divergence.index('class="aligned-diffs"') :]
    assert '<span class="d-a">+I am done.</span>' in diff and "&lt;script&gt;" in diff
    assert divergence.count('aria-label="Step') >= 1


def test_two_identical_trajectories_say_so_and_offer_no_divergence(signed_in, shared_data, tmp_path):
    a, b, row = _pair(shared_data, tmp_path, change=False)
    _, side = _side(signed_in, a, b, row["_ng_task_index"])
    assert "The two trajectories are identical." in side and "first-divergence" not in side
    assert "aligned-differs" not in side


def test_items_pair_by_type_and_name_in_order():
    a = [{"type": "function_call", "name": "bash"}, {"type": "message", "role": "assistant"}]
    b = [{"type": "reasoning"}, {"type": "message", "role": "assistant"}, {"type": "function_call", "name": "bash"}]
    assert pair_items(a, b) == [(None, 0), (0, 2), (1, 1)]
    assert pair_items(a, a[:1]) == [(0, 0), (1, None)]


def test_a_word_that_differs_is_marked_within_its_line_and_escaped(signed_in, shared_data, tmp_path):
    row = json.loads((shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").read_text().splitlines()[0])
    a = _write(tmp_path, "a", row)
    message = [o for o in row["response"]["output"] if o.get("type") == "message"][-1]
    text = message["content"][0]["text"]
    assert "the patch file shows the change correctly" in text
    message["content"][0]["text"] = text.replace(
        "the patch file shows the change correctly", "the patch file shows the change <b>wrongly</b>", 1
    )
    b = _write(tmp_path, "b", row)
    html, side = _side(signed_in, a, b, row["_ng_task_index"])
    assert_inert(html)
    divergence = side[side.index('id="first-divergence"') :]
    diff = divergence[divergence.index('class="aligned-diffs"') :]
    # the line is shown on both sides of the diff, only the differing words marked
    assert '<span class="w-d">correctly</span>' in diff
    assert '<span class="w-a">&lt;b&gt;wrongly&lt;/b&gt;</span>' in diff
    assert "the patch file shows the change " in diff and "<b>wrongly" not in html


def test_word_marks_are_left_out_for_rewritten_or_very_long_lines():
    from rollouts.web.diffs import WORD_LINE_MAX_CHARS, mark_words

    assert mark_words("one two three", "one two four") == (
        'one two <span class="w-d">three</span>',
        'one two <span class="w-a">four</span>',
    )
    assert mark_words("completely different words", "nothing alike at all here") is None
    long = "word " * WORD_LINE_MAX_CHARS
    assert mark_words(long, long + "x") is None
