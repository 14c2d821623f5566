"""The rollout (trajectory) page and its raw JSON view."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.http import QueryDict
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone

from rollouts.collection import export, runs
from rollouts.collection.datasets import read_jsonl
from rollouts.collection.importer import import_rollouts
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem
from rollouts.web.navigation import filter_querystring, filter_rollouts, neighbours

TASK_ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "add 1 then get the count"}],
        "tools": [{"type": "function", "name": "increment_counter"}, {"type": "function", "name": "get_counter_value"}],
    },
    "expected_count": 4,
    "agent_ref": {"name": "remote_agent"},
    "_ng_task_index": 0,
}


# -- builders (used by test_xss too) ---------------------------------------------------------------
def make_run(name="run", status=Run.Status.COMPLETED, **fields) -> Run:
    return Run.objects.create(name=name, status=status, **fields)


def make_task(run: Run, task_index=0, row=None) -> Task:
    row = dict(row or TASK_ROW, _ng_task_index=task_index)
    return Task.objects.create(run=run, task_index=task_index, row_json=json.dumps(row))


def make_rollout(
    run: Run,
    task: Task,
    rollout_index=0,
    attempt=1,
    status=Rollout.Status.SUCCEEDED,
    reward=1.0,
    verify=None,
    calls=(),
    items=(),
    **fields,
) -> Rollout:
    """A rollout with its agent calls (dicts of AgentCall fields) and items: ``(step, payload, extra
    TrajectoryItem fields)`` in order."""
    if status == Rollout.Status.SUCCEEDED and verify is None:
        verify = {
            "responses_create_params": TASK_ROW["responses_create_params"],
            "response": {"output": []},
            "reward": reward,
        }
    rollout = Rollout.objects.create(
        run=run,
        task=task,
        task_index=task.task_index,
        rollout_index=rollout_index,
        attempt=attempt,
        status=status,
        reward=reward if status == Rollout.Status.SUCCEEDED else (0.0 if status == Rollout.Status.FAILED else None),
        verify_json=json.dumps(verify) if verify is not None else "",
        finished=timezone.now(),
        num_agent_calls=len(calls),
        num_items=len(items),
        **fields,
    )
    AgentCall.objects.bulk_create(
        AgentCall(rollout=rollout, index=i, started=timezone.now(), **{"latency_ms": 12.5, "http_status": 200, **c})
        for i, c in enumerate(calls)
    )
    TrajectoryItem.objects.bulk_create(
        TrajectoryItem(
            # Cut to the columns' sizes as the dispatcher does (PostgreSQL enforces them).
            rollout=rollout,
            seq=seq,
            step=step,
            kind=payload.get("type", "")[:40],
            role=payload.get("role", "")[:20],
            call_id=payload.get("call_id", "")[:300],
            name=payload.get("name", "")[:300],
            payload=payload,
            **{"origin": TrajectoryItem.Origin.AGENT, **extra},
        )
        for seq, (step, payload, extra) in enumerate(items)
    )
    return rollout


def msg(text, role="assistant"):
    return {
        "type": "message",
        "role": role,
        "id": "msg_1",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(call_id, name, arguments):
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def out(call_id, output):
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def rich_rollout(run=None) -> Rollout:
    """A gymweb rollout with every item kind: asked calls run by gymweb (one refused), an
    agent-internal paired call, reasoning, a refusal, a hosted item, and a failed call's step."""
    run = run or make_run("rich run")
    task = make_task(run)
    usage = {
        "input_tokens": 11,
        "output_tokens": 7,
        "total_tokens": 18,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 3},
    }
    items = [
        (
            0,
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "I should increment first."}],
            },
            {},
        ),
        (0, call("c1", "increment_counter", '{"count": 1}'), {"asked": True}),
        (0, call("c2", "lookup_notes", '{"q": "x"}'), {"paired": True}),
        (0, out("c2", "notes: none"), {"paired": True}),
        (0, call("c3", "../verify", "{not json"), {"asked": True}),
        (0, out("c1", '{"success":true}'), {"origin": "gym", "latency_ms": 4.25, "tool_status": 200}),
        (
            0,
            out("c3", "Error: gymweb did not call tool '../verify': the tool name is not a safe URL path segment."),
            {"origin": "gym", "refused": True},
        ),
        (1, {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "counter"}}, {}),
        (
            1,
            {
                "type": "message",
                "role": "assistant",
                "id": "m2",
                "content": [{"type": "refusal", "refusal": "I won't say."}],
            },
            {},
        ),
        (1, msg("The count is 4."), {}),
    ]
    calls = [{"usage": usage, "model": "counter-agent"}, {"latency_ms": 2500.0}]
    verify = {
        "responses_create_params": TASK_ROW["responses_create_params"],
        "response": {"output": []},
        "reward": 0.75,
        "accuracy": 0.5,
        "set_overlap": 3,
        "reward_components": {"correctness": 1.0, "format": 0.0},
        "expected_count": 4,
        "predicted": ["a"],
    }
    return make_rollout(
        run,
        task,
        reward=0.75,
        verify=verify,
        calls=calls,
        items=items,
        usage_reported=True,
        input_tokens=11,
        output_tokens=7,
        total_tokens=18,
        cached_tokens=0,
        reasoning_tokens=3,
    )


def page(client, rollout, query=""):
    url = reverse("rollout", args=[rollout.run_id, rollout.pk]) + (f"?{query}" if query else "")
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


# -- access ------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_it_requires_login_for_the_page_and_the_raw_view(client):
    rollout = rich_rollout()
    for name in ("rollout", "rollout_raw"):
        response = client.get(reverse(name, args=[rollout.run_id, rollout.pk]))
        assert response.status_code == 302 and reverse("login") in response["Location"]


@pytest.mark.django_db
def test_a_rollout_of_another_run_is_not_found(signed_in):
    rollout = rich_rollout()
    other = make_run("other")
    assert signed_in.get(reverse("rollout", args=[other.pk, rollout.pk])).status_code == 404
    assert signed_in.get(reverse("rollout_raw", args=[other.pk, rollout.pk])).status_code == 404


# -- the timeline ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_it_shows_the_task_input_then_a_header_per_agent_call(signed_in):
    html = page(signed_in, rich_rollout())
    assert "Task input" in html and "add 1 then get the count" in html
    assert "increment_counter" in html and "get_counter_value" in html  # declared tools
    assert html.index("Task input") < html.index("Step 1") < html.index("Step 2")
    assert "12.5 ms" in html and "2.50 s" in html and "HTTP 200" in html
    assert "11 in · 7 out · 3 reasoning" in html


@pytest.mark.django_db
def test_it_shows_each_item_kind(signed_in):
    html = page(signed_in, rich_rollout())
    assert "I should increment first." in html  # reasoning summary
    assert "The count is 4." in html  # output_text
    assert "refusal" in html and "I won&#x27;t say." in html
    assert "web_search_call" in html  # a hosted item, as a JSON tree
    assert '<span class="j-k">action</span>: <span class="j-s">{&quot;query&quot;: &quot;counter&quot;}</span>' in html
    assert 'id="item-9"' in html


@pytest.mark.django_db
def test_it_pretty_prints_call_arguments_and_shows_raw_text_when_they_are_not_json(signed_in):
    html = page(signed_in, rich_rollout())
    assert '<dt class="f-k">count</dt><dd class="f-v"><span class="j-n">1</span></dd>' in _item(html, 1)  # a field list
    assert "{not json" in html and "arguments are not valid JSON" in html


@pytest.mark.django_db
def test_it_shows_gym_outputs_with_tool_latency_and_status_and_flags_refused_ones(signed_in):
    html = page(signed_in, rich_rollout())
    assert "run by gymweb" in html and "4.2 ms" in html
    assert '<span class="j-k">success</span>: <span class="j-l">true</span>' in _item(html, 5)  # JSON output as a tree
    assert "refused · not sent" in html and "not a safe URL path segment" in html
    assert "asked · run by gymweb" in html


def _item(html: str, seq: int) -> str:
    """The markup of item ``#seq`` (up to the next item)."""
    start = html.index(f'id="item-{seq}"')
    start = html.rindex("<div", 0, start)
    end = html.find('<div class="item ', start + 1)
    return html[start : end if end != -1 else len(html)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, arguments, why",
    [
        ("../verify", "{}", "not a safe URL path segment"),
        ("seed_session", "{}", "one of the environment's own routes"),
        ("increment_counter", "{not json", "arguments are not valid JSON"),
    ],
)
def test_a_refused_ask_reads_as_asked_but_refused_never_as_run_by_gymweb(signed_in, name, arguments, why):
    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}, {}],
        items=[
            (0, call("c1", name, arguments), {"asked": True}),
            (0, out("c1", f"Error: gymweb did not call tool {name!r}: {why}."), {"origin": "gym", "refused": True}),
            (1, msg("done"), {}),
        ],
    )
    html = page(signed_in, rollout)
    asked, output = _item(html, 0), _item(html, 1)
    assert "asked · refused, not sent" in asked
    assert "run by gymweb" not in asked and "run by gymweb" not in output
    assert "refused · not sent" in output
    assert "run by gymweb" not in html


@pytest.mark.django_db
def test_an_ask_gymweb_ran_still_reads_run_by_gymweb_beside_a_refused_one(signed_in):
    html = page(signed_in, rich_rollout())
    assert "asked · run by gymweb" in _item(html, 1)  # increment_counter, run
    assert "asked · refused, not sent" in _item(html, 4) and "run by gymweb" not in _item(html, 4)  # ../verify


@pytest.mark.django_db
def test_it_marks_agent_internal_paired_calls(signed_in):
    html = page(signed_in, rich_rollout())
    assert "agent-internal (paired in the same reply)" in html
    assert "agent&#x27;s own tool record" in html


@pytest.mark.django_db
def test_it_marks_unpaired_calls_as_never_answered(signed_in, shared_data):
    path = shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl"
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    unpaired = TrajectoryItem.objects.filter(rollout__run=run, kind="function_call", paired=False).first()
    html = page(signed_in, unpaired.rollout)
    assert "never answered" in html
    assert "answered at #" in html
    assert "latency unknown" in html and "imported" in html
    assert "You are a helpful assistant that can interact with a computer shell" in html  # system input


@pytest.mark.django_db
def test_a_failed_agent_call_shows_its_error_in_its_step(signed_in):
    run = make_run()
    task = make_task(run)
    rollout = make_rollout(
        run,
        task,
        status=Rollout.Status.FAILED,
        failure_kind="agent_http_error",
        error="the agent service answered HTTP 502: bad gateway",
        calls=[{}, {"http_status": 502, "error": "the agent service answered HTTP 502: bad gateway"}],
        items=[
            (0, call("c1", "get_counter_value", "{}"), {"asked": True}),
            (0, out("c1", '{"count":4}'), {"origin": "gym", "latency_ms": 1.0, "tool_status": 200}),
        ],
    )
    html = page(signed_in, rollout)
    assert "HTTP 502" in html and "step-failed" in html
    assert html.count("the agent service answered HTTP 502: bad gateway") == 2  # failure panel + its step


@pytest.mark.django_db
def test_a_string_input_is_shown_as_one_user_message(signed_in):
    run = make_run()
    task = make_task(run, row={"responses_create_params": {"input": "just count please", "instructions": "be terse"}})
    html = page(signed_in, make_rollout(run, task))
    assert "just count please" in html and "be terse" in html
    assert "role-user" in html and "role-instructions" in html


# -- huge content ------------------------------------------------------------------------------
def _notes(html: str) -> list[str]:
    return re.findall(r'<div class="clip-note">(.*?)</div>', html, re.S)


@pytest.mark.django_db
def test_a_huge_assistant_message_shows_its_head_and_a_link_that_shows_all_of_it(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_CHARS = 1000
    run = make_run()
    rollout = make_rollout(run, make_task(run), calls=[{}], items=[(0, msg("<b>" + "x" * 49_997), {})])
    html = page(signed_in, rollout)
    assert len(html) < 20_000
    assert "… 49,000 more characters" in html
    full = reverse("rollout_item", args=[run.pk, rollout.pk, "0"]) + "?full=1"
    assert (
        f'<a class="show-all" href="{full}" hx-get="{full}" hx-target="closest .item-body" hx-swap="outerHTML">show all 50,000 characters</a>'
        in html
    )
    assert "&lt;b&gt;" + "x" * 997 + "</p>" in html  # cut, still escaped
    raw = reverse("rollout_raw", args=[run.pk, rollout.pk]) + "?item=0"
    assert f'href="{raw}"' in html  # the raw JSON, one click away
    whole = signed_in.get(raw)
    assert whole.status_code == 200 and len(json.loads(whole.content)["content"][0]["text"]) == 50_000


@pytest.mark.django_db
def test_long_arguments_tool_outputs_reasoning_generic_items_and_input_are_cut_too(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_CHARS = 500
    run = make_run()
    task = make_task(run, row={"responses_create_params": {"input": "y" * 3000}})
    rollout = make_rollout(
        run,
        task,
        calls=[{}, {}],
        items=[
            (0, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r" * 2000}]}, {}),
            (0, call("c1", "increment_counter", json.dumps({"blob": "a" * 2000})), {"asked": True}),
            (0, out("c1", "o" * 2000), {"origin": "gym", "latency_ms": 1.0, "tool_status": 200}),
            (0, {"type": "web_search_call", "id": "ws", "action": {"query": "q" * 2000}}, {}),
            (
                1,
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "p" * 300}] * 100},
                {},
            ),
        ],
    )
    html = page(signed_in, rollout)
    assert len(html) < 30_000
    assert html.count("more characters") == 6  # input, reasoning, arguments, output, generic, message
    assert "… 98 more parts" in html  # the message's budget is spent after 2 parts
    for key in ("0", "1", "2", "3", "4", "input-0"):
        assert reverse("rollout_item", args=[run.pk, rollout.pk, key]) + "?full=1" in html
    assert html.count('class="show-all"') == 6
    assert "?item=input" in html
    assert "r" * 501 not in html and "o" * 501 not in html and "q" * 501 not in html and "y" * 501 not in html


@pytest.mark.django_db
def test_a_step_with_more_items_than_the_cap_shows_its_first_and_last_items_and_a_note(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP = 20
    run = make_run()
    items = [(0, call(f"c{i}", "increment_counter", "{}"), {"asked": True}) for i in range(100)]
    items += [(0, out(f"c{i}", "ok"), {"origin": "gym", "latency_ms": 1.0, "tool_status": 200}) for i in range(100)]
    items += [(1, msg("The count is 100."), {})]
    rollout = make_rollout(run, make_task(run), calls=[{}, {}], items=items)
    html = page(signed_in, rollout)
    step1 = html[html.index('id="step-0"') : html.index('id="step-1"')]
    assert step1.count('class="item item-') == 20
    assert 'id="item-0"' in step1 and 'id="item-17"' in step1 and 'id="item-18"' not in step1
    assert 'id="item-198"' in step1 and 'id="item-199"' in step1  # the step's last items
    assert "… 180 more items of this step not shown (#18–#197), at most 20 per step" in step1
    assert "The count is 100." in html


@pytest.mark.slow
@pytest.mark.django_db
def test_5000_tool_calls_in_one_step_make_a_page_of_bounded_size(signed_in):
    run = make_run()
    items = [(0, call(f"c{i}", "increment_counter", '{"count": 1}'), {"asked": True}) for i in range(5000)]
    items += [
        (0, out(f"c{i}", '{"success": true}'), {"origin": "gym", "latency_ms": 1.0, "tool_status": 200})
        for i in range(5000)
    ]
    rollout = make_rollout(run, make_task(run), calls=[{}], items=items)
    html = page(signed_in, rollout)
    assert html.count('class="item item-function_call') == 500
    assert "9,500 more items of this step not shown" in html
    assert len(html) < 600_000


@pytest.mark.django_db
def test_a_3_mb_message_and_a_huge_tool_name_make_a_small_page(signed_in):
    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, call("c1", "n" * 100_000, '{"count": 1}'), {"asked": True}),
            (0, msg("z" * 3_000_000), {}),
        ],
    )
    html = page(signed_in, rollout)
    assert len(html) < 60_000
    assert "… 2,980,000 more characters" in html


# -- verify and failures ---# -- verify and failures -------------------------------------------------------------------------
@pytest.mark.django_db
def test_it_shows_the_reward_extra_numeric_fields_and_reward_components(signed_in):
    html = page(signed_in, rich_rollout())
    verify = html[html.index("traj-verify") :]
    assert "0.75" in verify
    assert "accuracy" in verify and "0.5" in verify and "set_overlap" in verify and "expected_count" in verify
    assert "reward_components" in verify and "correctness" in verify and "format" in verify
    assert "predicted" in verify  # non-numeric fields under "other fields"


@pytest.mark.django_db
def test_it_shows_the_numeric_verifier_fields_of_real_multi_step_rollouts(signed_in, shared_data):
    path = shared_data / "example_multi_step" / "example_rollouts.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    html = page(signed_in, Rollout.objects.get(run=run, task_index=0))
    verify = html[html.index("traj-verify") :]
    for key in ("accuracy", "set_overlap", "original_term_minefield_hit", "order_instruction_following_failure"):
        if isinstance(row[key], (int, float)) and not isinstance(row[key], bool):
            assert key in verify


@pytest.mark.django_db
def test_a_failed_attempt_shows_kind_message_terminal_flag_and_partial_trajectory(signed_in):
    run = make_run()
    task = make_task(run)
    rollout = make_rollout(
        run,
        task,
        status=Rollout.Status.FAILED,
        failure_kind="agent_invalid_response",
        terminal=True,
        error="the agent service returned an invalid Responses API object: 1 validation error(s)",
        calls=[{}, {"error": "invalid"}],
        items=[
            (0, call("c1", "increment_counter", '{"count": 1}'), {"asked": True}),
            (0, out("c1", '{"success":true}'), {"origin": "gym", "tool_status": 200}),
        ],
    )
    html = page(signed_in, rollout)
    panel = html[html.index("traj-failure") : html.index("Task input")]
    assert "Failed" in panel and "agent_invalid_response" in panel and "terminal" in panel
    assert "invalid Responses API object" in panel
    assert "increment_counter" in html[html.index("Step 1") :]
    assert "traj-verify" not in html


@pytest.mark.django_db
def test_a_non_terminal_failure_says_resume_retries_it(signed_in):
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), status=Rollout.Status.FAILED, failure_kind="agent_unreachable", error="down"
    )
    html = page(signed_in, rollout)
    assert "not terminal" in html and "No agent call was recorded" in html


@pytest.mark.django_db
def test_it_links_the_other_attempts_of_the_same_key(signed_in):
    run = make_run()
    task = make_task(run)
    first = make_rollout(run, task, attempt=1, status=Rollout.Status.FAILED, failure_kind="agent_timeout", error="slow")
    second = make_rollout(run, task, attempt=2, status=Rollout.Status.SUCCEEDED)
    make_rollout(run, task, rollout_index=1, status=Rollout.Status.SUCCEEDED)  # another key: not an attempt of this one
    html = page(signed_in, second)
    assert reverse("rollout", args=[run.pk, first.pk]) in html and "agent_timeout" in html
    attempts = html[html.index("traj-attempts") : html.index("Task input")]
    assert "#1" in attempts and "#2" in attempts and "#3" not in attempts
    html = page(signed_in, first, "status=failed")
    assert reverse("rollout", args=[run.pk, second.pk]) + "?status=failed" in html


@pytest.mark.django_db
def test_a_kill_shaped_attempt_says_it_is_written_to_no_file(signed_in):
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), status=Rollout.Status.INTERRUPTED, error="its worker stopped; the key runs again"
    )
    html = page(signed_in, rollout)
    assert "Interrupted" in html and "written to no file" in html and "its worker stopped" in html


# -- prev / next -----------------------------------------------------------------------------
def _nav_links(html):
    """The (previous, next) hrefs of the page's navigation, None where there is no link."""

    def href(kind):
        marker = f'data-nav="{kind}"'
        if marker not in html:
            return None
        at = html.index(marker)
        tag = html[html.rfind("<a ", 0, at) : html.index(">", at)]
        return tag.split('href="')[1].split('"')[0].replace("&amp;", "&")

    return href("prev"), href("next")


@pytest.fixture
def ten_rollouts(db):
    run = make_run("ten")
    rollouts = []
    for t in range(10):
        task = make_task(run, t)
        status = Rollout.Status.FAILED if t % 3 == 0 else Rollout.Status.SUCCEEDED
        rollouts.append(
            make_rollout(
                run,
                task,
                status=status,
                reward=t / 10,
                failure_kind="agent_timeout" if status == "failed" else "",
                duration_ms=100.0 - t,
            )
        )
    return run, rollouts


def test_prev_and_next_follow_the_unfiltered_list_in_task_order(signed_in, ten_rollouts):
    run, rollouts = ten_rollouts
    prev, nxt = _nav_links(page(signed_in, rollouts[4]))
    assert prev == reverse("rollout", args=[run.pk, rollouts[3].pk])
    assert nxt == reverse("rollout", args=[run.pk, rollouts[5].pk])
    prev, nxt = _nav_links(page(signed_in, rollouts[0]))
    assert prev is None and nxt.endswith(f"/{rollouts[1].pk}/")


def test_prev_and_next_honour_the_filter_and_keep_its_querystring(signed_in, ten_rollouts):
    run, rollouts = ten_rollouts
    query = "status=succeeded&reward_min=0.2&reward_max=0.8&sort=-reward&junk=1"
    html = page(signed_in, rollouts[5], query)
    prev, nxt = _nav_links(html)
    # succeeded with 0.2 <= reward <= 0.8, by reward descending: 8, 7, 5, 4, 2
    assert urlsplit(prev).path == reverse("rollout", args=[run.pk, rollouts[7].pk])
    assert urlsplit(nxt).path == reverse("rollout", args=[run.pk, rollouts[4].pk])
    kept = parse_qs(urlsplit(nxt).query)
    assert kept == {"status": ["succeeded"], "reward_min": ["0.2"], "reward_max": ["0.8"], "sort": ["-reward"]}
    assert "3 of 5" in html
    assert reverse("run", args=[run.pk]) + "?status=succeeded&amp;reward_min=0.2" in html


def test_prev_and_next_filter_by_failure_kind_and_task(signed_in, ten_rollouts):
    run, rollouts = ten_rollouts
    prev, nxt = _nav_links(page(signed_in, rollouts[3], "kind=agent_timeout"))
    assert urlsplit(prev).path.endswith(f"/{rollouts[0].pk}/") and urlsplit(nxt).path.endswith(f"/{rollouts[6].pk}/")
    html = page(signed_in, rollouts[3], "task=3")
    assert _nav_links(html) == (None, None) and "1 of 1" in html


def test_a_rollout_outside_the_filter_has_no_neighbours_and_says_so(signed_in, ten_rollouts):
    run, rollouts = ten_rollouts
    html = page(signed_in, rollouts[0], "status=succeeded")
    assert _nav_links(html) == (None, None) and "not in the filtered list" in html


def test_the_filter_ignores_unknown_params_and_bad_values(ten_rollouts):
    run, rollouts = ten_rollouts
    assert filter_rollouts(run, {"bogus": "1", "status": "nope", "reward_min": "abc", "task": "x"}).count() == 10
    assert filter_rollouts(run, {"status": "failed", "junk": "<x>"}).count() == 4
    assert neighbours(rollouts[1], {"sort": "sideways"})["prev_id"] == rollouts[0].pk
    assert neighbours(rollouts[1], {"sort": "duration"})["next_id"] == rollouts[0].pk  # shorter first
    assert neighbours(rollouts[1], {"sort": "-task"})["next_id"] == rollouts[0].pk
    assert filter_querystring(QueryDict("status=failed&page=3&x=1&sort=")) == "status=failed"


def test_j_and_k_are_bound_to_next_and_previous(signed_in, ten_rollouts):
    run, rollouts = ten_rollouts
    html = page(signed_in, rollouts[4])
    assert static("gymweb/trajectory.js") in html
    assert 'rel="next"' in html and 'rel="prev"' in html
    from pathlib import Path

    script = (Path(__file__).resolve().parents[1] / "gymweb" / "static" / "gymweb" / "trajectory.js").read_text()
    assert '"j"' in script and '"k"' in script and "data-nav" in script


# -- raw JSON ---------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_raw_view_of_a_success_equals_its_rollouts_jsonl_row(signed_in):
    rollout = rich_rollout()
    response = signed_in.get(reverse("rollout_raw", args=[rollout.run_id, rollout.pk]))
    assert response["Content-Type"].startswith("application/json")
    assert b'\n  "' in response.content  # pretty
    assert json.loads(response.content) == json.loads(next(export.iter_successes(rollout.run)))


@pytest.mark.django_db
def test_the_raw_view_of_a_failure_equals_its_sidecar_row(signed_in):
    run = make_run()
    rollout = make_rollout(
        run,
        make_task(run),
        status=Rollout.Status.FAILED,
        failure_kind="agent_redirect",
        error="redirected to /login",
        terminal=False,
    )
    response = signed_in.get(reverse("rollout_raw", args=[run.pk, rollout.pk]))
    assert json.loads(response.content) == json.loads(next(export.iter_failures(run)))


@pytest.mark.django_db
def test_the_raw_view_of_an_imported_row_gives_the_file_row_back(signed_in, shared_data):
    path = shared_data / "example_tool_call_multireward" / "example_rollouts.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    with path.open("rb") as fh:
        run = import_rollouts(fh).run
    rollout = Rollout.objects.get(run=run, task_index=row["_ng_task_index"])
    assert json.loads(signed_in.get(reverse("rollout_raw", args=[run.pk, rollout.pk])).content) == row


@pytest.mark.django_db
def test_the_raw_view_of_an_attempt_written_to_no_file_is_not_found(signed_in):
    run = make_run()
    rollout = make_rollout(run, make_task(run), status=Rollout.Status.CANCELLED)
    response = signed_in.get(reverse("rollout_raw", args=[run.pk, rollout.pk]))
    assert response.status_code == 404 and "written to no output file" in json.loads(response.content)["error"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status", [Rollout.Status.SUCCEEDED, Rollout.Status.FAILED, Rollout.Status.RUNNING, Rollout.Status.CANCELLED]
)
def test_the_raw_view_gives_one_item_or_the_task_input_whole_for_an_attempt_of_any_status(signed_in, status):
    rollout = rich_rollout()
    Rollout.objects.filter(pk=rollout.pk).update(status=status)
    url = reverse("rollout_raw", args=[rollout.run_id, rollout.pk])
    item = signed_in.get(url + "?item=9")
    assert item.status_code == 200 and json.loads(item.content) == msg("The count is 4.")
    task_input = signed_in.get(url + "?item=input")
    assert json.loads(task_input.content)["responses_create_params"] == TASK_ROW["responses_create_params"]
    assert signed_in.get(url + "?item=99").status_code == 404
    assert signed_in.get(url + "?item=x").status_code == 404


# -- a real gymweb rollout -----------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_counter_rollout_collected_by_gymweb_renders_its_steps_and_gym_outputs(
    client, django_user_model, counter_env_url, counter_agent_url, counter_tasks_path
):
    from rollouts.workers.process import run_in_process

    client.force_login(django_user_model.objects.create_user("bob", password="pw-long-enough"))
    with counter_tasks_path.open("rb") as fh:
        parsed = read_jsonl(fh, source="counter_tasks.jsonl", max_rows=1)
    run = runs.create_run(parsed, name="counter", agent_url=counter_agent_url, env_url=counter_env_url)
    runs.launch(run)
    run_in_process(run.pk)
    rollout = Rollout.objects.get(run=run)
    assert rollout.status == Rollout.Status.SUCCEEDED
    html = page(client, rollout)
    assert "Step 1" in html and "Step 2" in html and "Step 3" in html
    assert "asked · run by gymweb" in html and "HTTP 200" in html
    assert "The count is" in html
    assert "latency unknown" not in html
    raw = json.loads(client.get(reverse("rollout_raw", args=[run.pk, rollout.pk])).content)
    assert raw == json.loads(next(export.iter_successes(run)))


# -- speed -------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_500_item_rollout_renders_every_item_with_a_fixed_number_of_queries(signed_in, django_assert_max_num_queries):
    # Its speed is measured in benchmarks/bench_storage.py, never asserted here.
    run = make_run()
    task = make_task(run)
    items, calls = [], []
    for step in range(125):
        calls.append({"usage": {"input_tokens": 10, "output_tokens": 5}})
        items.append((step, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking " * 20}]}, {}))
        items.append(
            (
                step,
                call(f"c{step}", "increment_counter", json.dumps({"count": step, "note": "x" * 200})),
                {"asked": True},
            )
        )
        items.append(
            (
                step,
                out(f"c{step}", json.dumps({"success": True, "log": ["line"] * 30})),
                {"origin": "gym", "latency_ms": 3.0, "tool_status": 200},
            )
        )
        items.append((step, msg("progress " * 30), {}))
    rollout = make_rollout(run, task, calls=calls, items=items)
    # session, user, rollout, calls, items, attempts, prev/next (3 keyset queries), and the review
    # panel: labels with this rollout's, its notes, its corrections, the label set's rubric
    with django_assert_max_num_queries(14):
        html = page(signed_in, rollout)
    assert html.count('class="item ') == 500 + 1  # + the task input message
