"""The compare page: two runs task by task (regressions, improvements, tasks in one run only,
mismatched inputs) and one task's two trajectories side by side."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils import timezone

from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import AgentCall, Rollout, TrajectoryItem

from .run_factories import dataset_lines, finish, key, make_run
from .test_xss import EVIL, assert_inert

S = Rollout.Status


def _url(**params):
    from urllib.parse import urlencode

    return f"{reverse('compare')}?{urlencode(params)}" if params else reverse("compare")


def _trajectory(rollout: Rollout, answer: str, tool: str = "increment_counter") -> None:
    """One agent call asking ``tool``, gymweb's output, then an assistant message ``answer``."""
    now = timezone.now()
    AgentCall.objects.create(rollout=rollout, index=0, started=now, latency_ms=10.0, http_status=200)
    AgentCall.objects.create(rollout=rollout, index=1, started=now, latency_ms=12.0, http_status=200)
    items = [
        (0, {"type": "function_call", "call_id": "c1", "name": tool, "arguments": '{"count": 1}'}, {"asked": True}),
        (
            0,
            {"type": "function_call_output", "call_id": "c1", "output": '{"ok": true}'},
            {"origin": "gym", "tool_status": 200},
        ),
        (
            1,
            {
                "type": "message",
                "role": "assistant",
                "id": "m1",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            },
            {},
        ),
    ]
    TrajectoryItem.objects.bulk_create(
        TrajectoryItem(
            rollout=rollout,
            seq=seq,
            step=step,
            kind=payload["type"],
            call_id=payload.get("call_id", ""),
            name=payload.get("name", ""),
            payload=payload,
            **{"origin": "agent", **extra},
        )
        for seq, (step, payload, extra) in enumerate(items)
    )


@pytest.fixture
def pair(db):
    """A: tasks 0-3 = 1.0, 0.0, 1.0, 0.5. B: tasks 0-4 = 0.0 (regression), 1.0 (improvement),
    1.0 (unchanged), pending (unfinished), 1.0 (only in B)."""
    a = make_run(4, name="baseline")
    for t, reward in enumerate((1.0, 0.0, 1.0, 0.5)):
        finish(key(a, t), S.SUCCEEDED, reward)
    b = make_run(5, name="candidate")
    finish(key(b, 0), S.FAILED, kind="agent_timeout")
    finish(key(b, 1), S.SUCCEEDED, 1.0)
    finish(key(b, 2), S.SUCCEEDED, 1.0)
    finish(key(b, 4), S.SUCCEEDED, 1.0)
    _trajectory(key(a, 1), "the count is 2 (from A)")
    _trajectory(key(b, 1), "the count is 1 (from B)")
    return a, b


def _section(html: str, label: str) -> str:
    match = re.search(rf'<section class="card" aria-label="{label}">.*?</section>', html, re.S)
    assert match, label
    return match.group(0)


# -- access and form ---------------------------------------------------------------------------------
def test_it_requires_login(client, pair):
    a, b = pair
    for url in (_url(), _url(a=a.pk, b=b.pk), _url(a=a.pk, b=b.pk, task=1)):
        response = client.get(url)
        assert response.status_code == 302 and reverse("login") in response["Location"]


def test_the_empty_form_offers_every_run(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url()).content.decode()
    assert f'<option value="{a.pk}">#{a.pk} · baseline · completed</option>' in html
    assert f'<option value="{b.pk}">#{b.pk} · candidate · completed</option>' in html
    assert "Regressions" not in html


def test_a_link_with_one_run_prefills_the_form(signed_in, pair):
    a, _ = pair
    response = signed_in.get(_url(a=a.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert re.search(rf'<select name="a"[^>]*>.*?<option value="{a.pk}" selected>', html, re.S)
    assert "errorlist" not in html


def test_an_unknown_run_is_a_form_error(signed_in, pair):
    a, _ = pair
    response = signed_in.get(_url(a=a.pk, b=999))
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()


def test_the_run_page_and_the_runs_list_link_here(signed_in, pair):
    a, _ = pair
    assert f'href="{reverse("compare")}?a={a.pk}"' in signed_in.get(reverse("run", args=[a.pk])).content.decode()
    assert f'href="{reverse("compare")}"' in signed_in.get(reverse("runs")).content.decode()


# -- the comparison ----------------------------------------------------------------------------------
def test_it_lists_a_regression_and_an_improvement(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk)).content.decode()
    regressions = _section(html, "regressions")
    improvements = _section(html, "improvements")
    assert re.findall(r'<th scope="row" class="mono">(\d+)</th>', regressions) == ["0"]
    assert re.findall(r'<th scope="row" class="mono">(\d+)</th>', improvements) == ["1"]
    assert '<td class="num bad">-1</td>' in regressions and '<td class="num ok">+1</td>' in improvements
    assert f"{_url(a=a.pk, b=b.pk)}&amp;task=0#side-by-side".replace("&", "&amp;", 1) in regressions


def test_the_table_gives_each_common_task_its_verdict(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk)).content.decode()
    verdicts = re.findall(r'<tr class="verdict-(\w*)">\s*<th scope="row" class="mono">(\d+)</th>', html)
    assert verdicts == [("regressions", "0"), ("improvements", "1"), ("unchanged", "2"), ("unfinished", "3")]
    assert f'href="{reverse("run", args=[b.pk])}?task=3#rollouts"' in html


def test_tasks_only_in_one_run_are_listed(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk)).content.decode()
    one = _section(html, "tasks in one run only")
    assert "only in B" in one and f'href="{reverse("run", args=[b.pk])}?task=4#rollouts">4</a>' in one
    assert "only in A" not in one
    swapped = signed_in.get(_url(a=b.pk, b=a.pk)).content.decode()
    assert "only in A" in _section(swapped, "tasks in one run only")


def test_the_summary_shows_means_and_their_delta(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk)).content.decode()
    # comparable tasks 0, 1, 2: A = (1 + 0 + 1) / 3, B = (0 + 1 + 1) / 3
    assert 'id="compare-delta">+0.0000<' in html
    assert "mean reward 0.6667 over 3 comparable tasks" in html


def test_mismatched_inputs_are_listed_and_never_counted(signed_in, pair):
    a, _ = pair
    lines = dataset_lines(4)
    lines[2] = json.dumps({"responses_create_params": {"input": "a different task"}, "expected": 2})
    c = runs.create_run(
        read_jsonl(lines, source="other.jsonl"),
        name="other inputs",
        agent_url="http://127.0.0.1:1",
        env_url="http://127.0.0.1:2",
    )
    for t in range(4):
        finish(key(c, t), S.SUCCEEDED, 0.0)
    html = signed_in.get(_url(a=a.pk, b=c.pk)).content.decode()
    mismatched = re.search(r'<section class="card" aria-label="mismatched tasks">.*?</section>', html, re.S).group(0)
    assert re.findall(r'task=(\d+)#side-by-side">', mismatched) == ["2"]
    assert re.findall(r'<th scope="row" class="mono">(\d+)</th>', _section(html, "regressions")) == ["0", "3"]


def test_the_table_can_show_one_kind_of_task(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk, show="improvements")).content.decode()
    assert re.findall(r'<tr class="verdict-(\w*)">', html) == ["improvements"]
    assert 'aria-current="true" class="current">improvements' in html
    assert re.findall(
        r'<tr class="verdict-(\w*)">', signed_in.get(_url(a=a.pk, b=b.pk, show="nonsense")).content.decode()
    ) == ["regressions", "improvements", "unchanged", "unfinished"]


def test_a_long_task_table_is_paged(signed_in, db):
    a, b = make_run(120, name="a"), make_run(120, name="b")
    html = signed_in.get(_url(a=a.pk, b=b.pk)).content.decode()
    assert len(re.findall(r'<tr class="verdict-', html)) == 100 and "page 1 of 2" in html
    html2 = signed_in.get(_url(a=a.pk, b=b.pk, page=2)).content.decode()
    assert len(re.findall(r'<tr class="verdict-', html2)) == 20


# -- side by side ------------------------------------------------------------------------------------
def test_side_by_side_renders_both_trajectories_with_the_trajectory_partials(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk, task=1)).content.decode()
    side = re.search(r'<section id="side-by-side".*?(?=<div class="grid two compare-lists">)', html, re.S).group(0)
    assert "Task 1 side by side" in side and "improvement" in side
    assert re.findall(r'<div class="side" aria-label="run (A|B)">', side) == ["A", "B"]
    # step 2 differs: each side's step, with the trajectory page's partials
    step = side[side.index('aria-label="Step 2 differs"') :]
    first, second = step.split('<div class="side" aria-label="Step 2 of run B">')
    assert "the count is 2 (from A)" in first and "the count is 1 (from B)" not in first
    assert "the count is 1 (from B)" in second
    # step 1 (the same call and output on both sides) is shown once, folded
    assert re.search(r'aligned-same" data-row="0">\s*<summary><span class="step-title">Task input</span>', side)
    same = side[side.index('<details class="aligned-row aligned-same" data-row="1"') :]
    assert "Step 1" in same[:400] and "identical on both sides" in same[:400]
    assert "item item-function_call" in same and "run by gymweb" in same
    assert f'href="{reverse("rollout", args=[a.pk, key(a, 1).pk])}"' in side
    assert f'href="{reverse("rollout", args=[b.pk, key(b, 1).pk])}"' in side


def test_side_by_side_gives_every_element_id_once_and_each_side_links_its_own_items(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk, task=1)).content.decode()
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert ids and len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert 'id="a-item-0"' in html and 'href="#a-item-0"' in html and 'id="a-step-0"' in html
    assert 'id="a-item-2"' in html and 'id="b-item-2"' in html and 'id="b-step-1"' in html


def test_side_by_side_shows_a_failed_attempt_and_says_when_a_run_has_none(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk, task=0)).content.decode()
    side = html.split('<section id="side-by-side"')[1]
    assert "agent_timeout" in side and "badge failed" in side
    html = signed_in.get(_url(a=a.pk, b=b.pk, task=4)).content.decode()
    first = html.split('<div class="side" aria-label="run A">')[1].split('<div class="side" aria-label="run B">')[0]
    assert "No finished attempt of this task in this run." in first


def test_a_task_that_is_not_a_number_is_reported(signed_in, pair):
    a, b = pair
    html = signed_in.get(_url(a=a.pk, b=b.pk, task="x")).content.decode()
    assert "task must be a whole number" in html


# -- untrusted text ----------------------------------------------------------------------------------
def test_the_compare_page_is_inert_whatever_the_runs_hold(signed_in, db):
    a = make_run(2, name=f"a {EVIL}")
    b = make_run(2, name=f"b {EVIL}")
    finish(key(a, 0), S.SUCCEEDED, 1.0)
    finish(key(b, 0), S.FAILED, kind=EVIL[:40], error=EVIL)
    finish(key(a, 1), S.SUCCEEDED, 0.0)
    finish(key(b, 1), S.SUCCEEDED, 1.0)
    _trajectory(key(a, 1), EVIL, tool=EVIL)
    _trajectory(key(b, 1), EVIL, tool=EVIL)
    for url in (_url(), _url(a=a.pk), _url(a=a.pk, b=b.pk), _url(a=a.pk, b=b.pk, task=0), _url(a=a.pk, b=b.pk, task=1)):
        response = signed_in.get(url)
        assert response.status_code == 200
        assert_inert(response.content.decode())
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in signed_in.get(_url(a=a.pk, b=b.pk, task=1)).content.decode()
