"""The trajectory page's outline, folding, live tail and the run page's live fixes."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from rollouts.collection import runs
from rollouts.collection.importer import import_rollouts
from rollouts.evaluation import run_summary
from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem
from rollouts.web.outline import item_summary, outline

from . import run_factories as rf
from .test_view_rollout_detail import call, make_rollout, make_run, make_task, msg, out

pytestmark = pytest.mark.django_db


def _page(client, rollout, **params) -> str:
    response = client.get(reverse("rollout", args=[rollout.run_id, rollout.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


def _timed_rollout(status=Rollout.Status.SUCCEEDED):
    """Two steps: the first calls two tools (one failing with HTTP 500, 30 ms + 20 ms), the second
    answers; the calls start 0 ms and 1,000 ms after each other and take 400 and 600 ms."""
    run = make_run()
    task = make_task(run)
    t0 = timezone.now() - timedelta(seconds=5)
    rollout = make_rollout(
        run,
        task,
        status=status,
        items=[
            (0, call("c1", "increment_counter", '{"count": 1}'), {"asked": True}),
            (0, call("c2", "get_counter_value", "{}"), {"asked": True}),
            (0, out("c1", '{"count": 1}'), {"origin": "gym", "latency_ms": 30.0, "tool_status": 200}),
            (0, out("c2", "internal error"), {"origin": "gym", "latency_ms": 20.0, "tool_status": 500}),
            (1, msg("The count is 1.\nDone."), {}),
        ],
    )
    AgentCall.objects.create(
        rollout=rollout, index=0, started=t0, latency_ms=400.0, usage={"input_tokens": 120, "output_tokens": 30}
    )
    AgentCall.objects.create(rollout=rollout, index=1, started=t0 + timedelta(milliseconds=1000), latency_ms=600.0)
    return rollout


def test_the_outline_lists_every_step_with_tools_latency_tokens_and_a_shared_time_axis(signed_in):
    rollout = _timed_rollout()
    html = _page(signed_in, rollout)
    rows = re.findall(r'<a class="outline-row" href="#(step-[\w-]+)"', html)
    assert rows == ["step-input", "step-0", "step-1"]
    first = html[html.index('href="#step-0"') : html.index('href="#step-1"')]
    assert "<code>increment_counter</code>" in first and "<code>get_counter_value</code>" in first
    assert "400 ms" in first and "+ 50.0 ms tools" in first and "120→30 tok" in first
    assert "1 tool failed" in first  # the HTTP 500 output
    # One axis from the first call's start to the last call's end (1,000 + 600 ms = 1.6 s wide):
    # step 1's agent bar starts at 0 and is 400/1600 of the axis; its tools follow it.
    assert '<rect class="wf-agent" x="0" y="1" width="250"' in first
    assert '<rect class="wf-tools" x="250" y="1" width="31.25"' in first
    second = html[html.index('href="#step-1"') : html.index("</ol>")]
    assert '<rect class="wf-agent" x="625" y="1" width="375"' in second
    assert "no tool call" in second


def test_outline_badges_name_errors_refusals_unpaired_and_refused_calls():
    class Call:
        def __init__(self, **kw):
            self.error, self.http_status, self.latency_ms, self.usage, self.started = "", 200, 1.0, None, None
            self.__dict__.update(kw)

    steps = [
        {"index": 0, "call": Call(error="HTTP 502", http_status=502), "items": [], "tail": []},
        {
            "index": 1,
            "call": Call(),
            "tail": [],
            "items": [
                {"template": "rollouts/partials/item_message.html", "parts": [{"kind": "refusal", "text": "no"}]},
                {"template": "rollouts/partials/item_function_call.html", "name": "bash", "unanswered": True},
                {"template": "rollouts/partials/item_function_call.html", "name": "rm", "answer_refused": True},
            ],
        },
    ]
    rows = outline(steps, imported=False)["rows"]
    assert [b["text"] for b in rows[0]["badges"]] == ["error"]
    assert [b["text"] for b in rows[1]["badges"]] == ["refusal", "1 unpaired", "1 refused"]
    assert rows[1]["tools"] == ["bash", "rm"]


def test_every_step_and_item_folds_with_a_one_line_summary(signed_in):
    rollout = _timed_rollout()
    html = _page(signed_in, rollout)
    assert html.count('<details class="step') == 3  # the task input and two steps, open
    assert html.count('<details class="fold" open>') == 5 + 1  # five items and the input message
    assert (
        '<span class="fold-label">call increment_counter</span> <span class="fold-seq">#0</span> <span class="fold-line">1</span>'
        not in html
    )
    assert (
        '<span class="fold-label">assistant</span> <span class="fold-seq">#4</span> <span class="fold-line">The count is 1.</span> <span class="fold-len">21 chars</span>'
        in html
    )
    assert 'id="traj-q"' in html and 'data-fold="collapse"' in html


def test_item_summaries_say_role_or_tool_first_line_and_length():
    assert item_summary(msg("<think>\nhmm\n</think>\nAnswer")) == {
        "label": "assistant",
        "line": "hmm",
        "length": "27 chars",
    }
    assert item_summary(call("c", "bash", json.dumps({"command": "ls -la\ncat x"}))) == {
        "label": "call bash",
        "line": "ls -la",
        "length": "28 chars",
    }
    assert item_summary(out("c", "")) == {"label": "output", "line": "", "length": "0 chars"}
    assert item_summary({"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan " * 50}]})[
        "line"
    ].endswith("…")
    assert item_summary({"type": "web_search_call", "id": "x"})["label"] == "web_search_call"


def test_search_text_comes_back_escaped_in_the_box(signed_in):
    rollout = _timed_rollout()
    html = _page(signed_in, rollout, q='"><script>alert(1)</script>')
    assert 'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in html
    assert "<script>alert(1)" not in html


def test_a_running_attempt_polls_for_new_steps_and_stops_when_final(signed_in):
    rollout = _timed_rollout(status=Rollout.Status.RUNNING)
    html = _page(signed_in, rollout)
    live_url = reverse("rollout_live", args=[rollout.run_id, rollout.pk])
    tail = re.search(r'<div id="traj-tail" hx-get="([^"]+)" hx-trigger="every 2s"', html)
    assert tail, "a running attempt's tail polls"
    url = tail.group(1).replace("&amp;", "&")
    assert url == f"{live_url}?from=1&seen=running.5.2"
    assert 'id="step-0"' in html[: html.index('id="traj-tail"')]  # earlier steps are fixed
    assert '<dd id="count-calls">2</dd>' in html and '<dd id="count-tools">2</dd>' in html

    # Nothing new: 204, htmx swaps nothing and the tail polls on.
    assert signed_in.get(url).status_code == 204

    # A new step and its items arrive: the tail comes back with step 1 fixed and step 2 polling,
    # and out of band the header counts and the outline.
    AgentCall.objects.create(rollout=rollout, index=2, started=timezone.now(), latency_ms=5.0)
    TrajectoryItem.objects.create(
        rollout=rollout,
        seq=5,
        step=2,
        kind="message",
        role="assistant",
        payload=msg("a third step"),
        origin=TrajectoryItem.Origin.AGENT,
    )
    body = signed_in.get(url).content.decode()
    assert 'id="step-0"' not in body
    assert body.index('id="step-1"') < body.index('<div id="traj-tail" hx-get="') < body.index('id="step-2"')
    assert "?from=2&amp;seen=running.6.3" in body
    assert 'id="traj-summary" hx-swap-oob="true"' in body and '<dd id="count-calls">3</dd>' in body
    assert '<div id="outline-body" hx-swap-oob="true">' in body and 'href="#step-2"' in body

    # Final: the last steps, no trigger, the verify panel out of band.
    Rollout.objects.filter(pk=rollout.pk).update(
        status=Rollout.Status.SUCCEEDED,
        num_agent_calls=3,
        num_tool_calls=2,
        verify_json=json.dumps({"reward": 1.0, "response": {"output": []}}),
    )
    body = signed_in.get(f"{live_url}?from=2&seen=running.6.3").content.decode()
    assert 'id="step-2"' in body and "hx-trigger" not in body
    assert '<div id="traj-end" hx-swap-oob="true"><section class="card traj-verify"' in body


def test_a_finished_attempt_has_no_live_tail(signed_in):
    html = _page(signed_in, _timed_rollout())
    assert '<div id="traj-tail" data-live="0">' in html
    assert 'hx-trigger="every 2s"' not in html


def test_imported_runs_have_no_waterfall_and_say_latency_unknown(signed_in, shared_data):
    with (shared_data / "tau2" / "example_rollouts.jsonl").open("rb") as fh:
        run = import_rollouts(fh, source="/very/long/path/example_rollouts.jsonl").run
    rollout = Rollout.objects.filter(run=run).first()
    html = _page(signed_in, rollout)
    assert "wf-agent" not in html and "latency unknown" in html
    assert run.name == "example_rollouts.jsonl"  # named by the file, not its path
    charts = signed_in.get(reverse("run_charts", args=[run.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert 'id="latency-unknown"' in charts and "&lt; 0.2 ms" not in charts and "< 0.2 ms" not in charts


def test_an_imported_five_by_four_file_shows_five_tasks_times_four(signed_in, shared_data):
    rows = [
        json.loads(line) for line in (shared_data / "example_tool_call_multireward" / "example_rollouts.jsonl").open()
    ]
    lines = [json.dumps({**row, "_ng_rollout_index": r}) for r in range(4) for row in rows]
    run = import_rollouts(lines).run
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert re.search(r'<span id="run-shape">5 tasks × 4</span>', html)


def test_a_cancelled_attempt_and_the_next_are_numbered_apart(signed_in):
    run = rf.make_run(1)
    first = rf.key(run, 0)
    rf.finish(first, Rollout.Status.CANCELLED)
    second = rf.new_attempt(run, 0)
    assert first.attempt == second.attempt == 1  # a cancelled row is not an attempt
    html = _page(signed_in, second)
    assert re.search(
        r'<a class="attempt" href="[^"]+" title="cancelled: not an attempt[^"]*">#1 <span class="badge cancelled">',
        html,
    )
    assert '<span class="attempt current"><strong>#2</strong>' in html
    assert "cancelled (not an attempt)" in _page(signed_in, first)


def test_running_rows_of_the_run_table_show_their_agent_calls_so_far(signed_in):
    run = rf.make_run(2, status=Run.Status.RUNNING)
    running = rf.key(run, 0)
    Rollout.objects.filter(pk=running.pk).update(status=Rollout.Status.RUNNING)
    for i in range(3):
        AgentCall.objects.create(rollout=running, index=i, started=timezone.now(), latency_ms=1.0)
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    row = html[html.index(f"/rollouts/{running.pk}/") :]
    row = row[: row.index("</tr>")]
    assert '<td class="num">3</td>' in row


def test_the_live_poll_announces_the_end_of_the_run(signed_in):
    run = rf.make_run(1, status=Run.Status.RUNNING)
    url = reverse("run_live", args=[run.pk])
    first = signed_in.get(url, {"seen": "x.running"})
    assert first["HX-Trigger"] == "rollouts-changed"
    rf.finish(rf.key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED, finished=timezone.now())
    last = signed_in.get(url, {"seen": "x.running"})
    assert last["HX-Trigger"] == "rollouts-changed, run-finished"
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    assert 'hx-trigger="revealed, run-finished from:body"' in page  # the charts and the evaluation


def test_the_overall_rate_after_a_retry_counts_from_the_relaunch():
    run = rf.make_run(60, status=Run.Status.COMPLETED)
    for r in Rollout.objects.filter(run=run)[:59]:
        rf.finish(r, Rollout.Status.SUCCEEDED, 1.0)
    Rollout.objects.filter(run=run).update(finished=timezone.now() - timedelta(hours=1))
    rf.finish(rf.key(run, 59), Rollout.Status.FAILED)
    # Retry: the failed key gets a new attempt and the run is launched again (started = now).
    Run.objects.filter(pk=run.pk).update(created=timezone.now() - timedelta(hours=2))
    run.refresh_from_db()
    assert runs.resume(run) == 1
    run.refresh_from_db()
    summary = run_summary.run_summary(run, now=run.started + timedelta(seconds=1))
    assert summary.overall_per_min is None  # nothing finished since the relaunch (was 60 × 60 = 3,600/min)
    rf.finish(rf.key(run, 59), Rollout.Status.SUCCEEDED, 1.0)
    summary = run_summary.run_summary(run, now=run.started + timedelta(seconds=30))
    assert summary.overall_per_min == pytest.approx(2.0, rel=0.5)


def test_long_run_names_are_cut_with_a_title_and_urls_do_not_wrap(signed_in):
    name = "/home/someone/very/long/path/to/a/rollouts/folder/" * 3 + "rollouts.jsonl"
    run = rf.make_run(1, name=name)
    html = signed_in.get(reverse("runs")).content.decode()
    assert f'title="{name}"' in html
    assert f">{name}<" not in html
    assert f"/runs/{run.pk}/" in html


def test_previous_and_next_keep_the_search(signed_in):
    run = rf.make_run(3)
    for t in range(3):
        rf.finish(rf.key(run, t), Rollout.Status.SUCCEEDED, 1.0)
    html = _page(signed_in, rf.key(run, 1), q="count is", status="succeeded")
    assert re.search(r'href="/runs/\d+/rollouts/\d+/\?status=succeeded&amp;q=count\+is" data-nav="next"', html)
    assert re.search(r'href="/runs/\d+/rollouts/\d+/\?status=succeeded&amp;q=count\+is" data-nav="prev"', html)
