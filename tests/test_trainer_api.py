"""The training-loop routes: batches sent inline (bad rows answer a 400 naming row and field, and
store nothing), the results stream (finishing order, the files' own rows, a cursor that gives every
row exactly once across reconnects), one rollout whole, the api_token command and what the OpenAPI
document declares."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from rollouts.collection import export
from rollouts.engine.loop import RolloutOutcome
from rollouts.models import AgentCall, ApiToken, Dataset, Rollout, Run
from rollouts.tokens import create_token, user_for_token
from rollouts.workers import claims, dispatcher, writer
from rollouts.workers.claims import running_runs

from .conftest import COUNTER_TASKS

API = "/api/v1"
AGENT, ENV = "http://127.0.0.1:9102", "http://127.0.0.1:9101"


@pytest.fixture
def auth(user):
    _row, token = create_token(user, "trainer")
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def task_rows(n: int = 5) -> list[dict]:
    rows = [json.loads(line) for line in COUNTER_TASKS.read_text().splitlines() if line.strip()]
    assert len(rows) >= n
    return rows[:n]


def post_json(client, auth, body):
    return client.post(f"{API}/runs", data=json.dumps(body), content_type="application/json", **auth)


def post_jsonl(client, auth, lines: list[str], query: str = ""):
    """A JSONL body of ``lines``, the settings in the querystring (the agent and env, then ``query``)."""
    return client.post(
        f"{API}/runs?agent_url={AGENT}&env_url={ENV}{query}",
        data="\n".join(lines) + "\n",
        content_type="application/x-ndjson",
        **auth,
    )


def nothing_stored():
    return Run.objects.count() == 0 and Dataset.objects.count() == 0 and Rollout.objects.count() == 0


# -- batches in ------------------------------------------------------------------------------------
def test_rows_sent_inline_make_a_launched_run(client, auth):
    rows = task_rows(3)
    response = post_json(
        client, auth, {"rows": rows, "agent_url": AGENT, "env_url": ENV, "num_repeats": 2, "name": "step 7"}
    )
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.status == Run.Status.RUNNING and run.name == "step 7"
    assert run.num_keys == 6 and run.rollouts.count() == 6
    assert run.dataset.num_rows == 3


def test_a_misspelt_setting_in_the_querystring_is_refused_naming_it(client, auth):
    response = post_jsonl(client, auth, [json.dumps(row) for row in task_rows(2)], "&max_step=2")
    assert response.status_code == 400
    assert "max_step: not a run setting" in response.json()["detail"] and "max_steps" in response.json()["detail"]
    assert nothing_stored()


def test_a_jsonl_body_with_settings_in_the_querystring(client, auth):
    response = post_jsonl(client, auth, [json.dumps(r) for r in task_rows(4)], "&concurrency=4")
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.num_keys == 4 and run.concurrency == 4


@pytest.mark.parametrize(
    "bad, where, field",
    [
        ({"responses_create_params": {"temperature": 0.1}}, "rows[2] (row 3)", "'input'"),
        ({"no_params": 1}, "rows[2] (row 3)", "responses_create_params"),
        ([1, 2], "rows[2] (row 3)", "JSON object"),
        ({"responses_create_params": {"input": "x"}, "_ng_task_index": "seven"}, "rows[2] (row 3)", "_ng_task_index"),
    ],
)
def test_a_bad_row_is_a_400_naming_row_and_field_and_nothing_is_stored(client, auth, bad, where, field):
    rows = task_rows(4)
    rows[2] = bad
    response = post_json(client, auth, {"rows": rows, "agent_url": AGENT, "env_url": ENV})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert where in detail and field in detail, detail
    assert response.json()["errors"]["rows"] == [detail]
    assert nothing_stored()


def test_an_inline_row_past_the_line_limit_is_named_by_its_place_in_rows(client, auth, settings):
    rows = task_rows(3)
    settings.GYMWEB_MAX_LINE_BYTES = max(len(json.dumps(r)) for r in rows) + 10
    rows[1]["responses_create_params"]["input"] = "x" * settings.GYMWEB_MAX_LINE_BYTES
    response = post_json(client, auth, {"rows": rows, "agent_url": AGENT, "env_url": ENV})
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert detail.startswith("rows[1] (row 2): the row is longer than the limit of"), detail
    assert "line" not in detail and response.json()["errors"] == {"rows": [detail]}
    assert nothing_stored()


@pytest.mark.parametrize("bad", ['"\\ud800"', "NaN", "1e400"])
def test_a_value_no_file_can_hold_is_named_by_its_row(client, auth, bad):
    rows = [json.dumps(r) for r in task_rows(3)]
    rows[2] = rows[2][:-1] + f', "note": {bad}}}'
    body = '{"agent_url": "%s", "env_url": "%s", "rows": [%s]}' % (AGENT, ENV, ", ".join(rows))
    response = client.post(f"{API}/runs", data=body, content_type="application/json", **auth)
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert detail.startswith("rows[2] (row 3): not valid JSON"), detail
    assert nothing_stored()


@pytest.mark.parametrize("setting, bad", [("concurrency", "NaN"), ("run_timeout_s", "1e400"), ("name", '"\\udc00"')])
def test_a_setting_no_file_can_hold_is_named(client, auth, setting, bad):
    body = '{"agent_url": "%s", "env_url": "%s", "rows": %s, "%s": %s}' % (
        AGENT,
        ENV,
        json.dumps(task_rows(1)),
        setting,
        bad,
    )
    response = client.post(f"{API}/runs", data=body, content_type="application/json", **auth)
    assert response.status_code == 400 and response.json()["detail"].startswith(f"{setting}: not valid JSON")
    assert list(response.json()["errors"]) == [setting]
    assert nothing_stored()


def test_a_setting_named_twice_is_refused_not_last_one_wins(client, auth):
    rows = json.dumps(task_rows(1))
    body = '{"agent_url": "%s", "env_url": "%s", "concurrency": 1, "concurrency": 8, "rows": %s}' % (AGENT, ENV, rows)
    response = client.post(f"{API}/runs", data=body, content_type="application/json", **auth)
    assert response.status_code == 400 and "'concurrency' appears twice" in response.json()["detail"]
    assert nothing_stored()
    lines = [json.dumps(r) for r in task_rows(1)]
    response = post_jsonl(client, auth, lines, "&concurrency=1&concurrency=8")
    assert response.status_code == 400 and "names 'concurrency' more than once" in response.json()["detail"]
    assert nothing_stored()


def test_settings_in_the_querystring_of_a_json_body_are_refused_not_ignored(client, auth):
    body = {"rows": task_rows(1), "agent_url": AGENT, "env_url": ENV}
    response = client.post(f"{API}/runs?concurrency=3", data=json.dumps(body), content_type="application/json", **auth)
    assert response.status_code == 400 and "'concurrency' is in the querystring" in response.json()["detail"]
    assert nothing_stored()


def test_a_jsonl_body_of_one_line_is_refused_for_what_is_wrong_with_it(client, auth):
    row = json.dumps(task_rows(1)[0])
    twice = post_jsonl(client, auth, [row[:-1] + ', "x": 1, "x": 2}'])
    assert twice.status_code == 400 and "line 1" in twice.json()["detail"]
    assert "the key 'x' appears twice" in twice.json()["detail"], twice.json()
    array = post_jsonl(client, auth, [json.dumps(task_rows(2))])
    assert array.status_code == 400 and "send an array as application/json, in `rows`" in array.json()["detail"]
    assert "jq" not in array.json()["detail"]
    assert nothing_stored()


def test_a_bad_jsonl_line_names_its_line(client, auth):
    lines = [json.dumps(r) for r in task_rows(3)]
    lines[1] = '{"responses_create_params": {"input": "x"'
    response = post_jsonl(client, auth, lines)
    assert response.status_code == 400
    assert "line 2" in response.json()["detail"] and "not valid JSON" in response.json()["detail"]
    assert nothing_stored()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": "many"}, "concurrency"),
        ({"concurrency": True}, "concurrency"),  # JSON's true is no number
        ({"num_repeats": "4"}, "num_repeats"),  # nor is a string
        ({"env_aggregate_metrics": 0}, "env_aggregate_metrics"),
        ({"env_url": "not a url"}, "env_url"),
        ({"overrides": {"tools": "x"}}, "overrides"),
        ({"env_max_in_flight": -1}, "env_max_in_flight"),
        ({"env_max_in_flight": 2.5}, "env_max_in_flight"),
        ({"max_step": 3}, "max_step"),  # misspelt: refused, not ignored
    ],
)
def test_a_refused_setting_names_the_field_and_stores_nothing(client, auth, change, field):
    body = {"rows": task_rows(2), "agent_url": AGENT, "env_url": ENV, **change}
    response = post_json(client, auth, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["detail"] or field in response.json().get("errors", {})
    assert nothing_stored()


def test_a_run_keeps_its_own_bound_on_env_calls_and_the_workers_share_it(client, auth):
    body = {"rows": task_rows(2), "agent_url": AGENT, "env_url": ENV, "env_max_in_flight": 5}
    response = post_json(client, auth, body)
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.env_max_in_flight == 5
    assert post_json(client, auth, {"rows": task_rows(1), "agent_url": AGENT, "env_url": ENV}).status_code == 201
    assert Run.objects.latest("id").env_max_in_flight == 0, "not sent: the server's bound"
    # Two live worker processes: each keeps at most its half (rounded up) of the run's 5 out.
    d = dispatcher.Dispatcher()
    d.live_workers = 2

    rows = running_runs(None)  # read here: a coroutine's connection would not see the test's rows

    async def answered(fn, *args):
        assert fn is running_runs, fn  # both runs have pending rollouts: nothing else is asked
        return rows

    d._db = answered  # type: ignore[method-assign]
    asyncio.run(d._refresh_runs())
    assert d.runs[run.pk].settings.env_max_in_flight == 3
    assert d.runs[Run.objects.latest("id").pk].settings.env_max_in_flight == 0


def test_a_run_answers_with_the_settings_it_was_launched_with_under_the_names_post_takes(client, auth):
    sent = {
        "concurrency": 3,
        "max_steps": 7,
        "num_repeats": 2,
        "max_attempts": 1,
        "env_max_in_flight": 4,
        "remote_responses_timeout_s": 60.0,
        "run_timeout_s": 120.0,
        "overrides": {"temperature": 0.5},
        "env_aggregate_metrics": False,
    }
    response = post_json(client, auth, {"rows": task_rows(2), "agent_url": AGENT, "env_url": ENV, **sent})
    assert response.status_code == 201, response.content
    run = client.get(f"{API}/runs/{response.json()['id']}", **auth).json()
    got = run["settings"]
    assert {k: got[k] for k in sent} == sent and got["limit"] is None and run["head_url"] == ""
    repost = post_json(client, auth, {"rows": task_rows(1), "agent_url": AGENT, "env_url": ENV, **got})
    assert repost.status_code == 201, repost.content
    assert repost.json()["settings"] == got


def test_a_dataset_the_user_cannot_use_is_named_and_nothing_else_is_blamed(client, auth):
    response = post_json(client, auth, {"dataset": 99999, "agent_url": AGENT, "env_url": ENV})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("dataset: dataset 99999: not a dataset you can use")
    assert set(response.json()["errors"]) == {"dataset"}
    assert nothing_stored()


def test_rows_and_dataset_together_or_neither_are_refused(client, auth):
    assert (
        post_json(client, auth, {"rows": task_rows(1), "dataset": 1, "agent_url": AGENT, "env_url": ENV}).status_code
        == 400
    )
    neither = post_json(client, auth, {"agent_url": AGENT, "env_url": ENV})
    assert neither.status_code == 400 and "dataset" in json.dumps(neither.json())
    assert post_json(client, auth, {"rows": [], "agent_url": AGENT, "env_url": ENV}).status_code == 400
    assert nothing_stored()


def test_an_inline_batch_has_a_files_size_limit(client, auth, settings):
    settings.GYMWEB_MAX_UPLOAD_BYTES = 300
    response = post_json(client, auth, {"rows": task_rows(5), "agent_url": AGENT, "env_url": ENV})
    assert response.status_code == 413 and "rows" in response.json()["errors"]
    assert nothing_stored()


def test_a_batch_can_skip_the_envs_aggregate_metrics_and_says_why(client, auth, monkeypatch):
    from rollouts.evaluation import aggregate_metrics, run_aggregate_metrics

    body = {"rows": task_rows(2), "agent_url": AGENT, "env_url": ENV}
    asked = post_json(client, auth, body)
    skipped = post_json(client, auth, {**body, "env_aggregate_metrics": False})
    assert asked.status_code == skipped.status_code == 201
    assert Run.objects.get(pk=asked.json()["id"]).aggregate_metrics_error == ""
    run = Run.objects.get(pk=skipped.json()["id"])
    assert run.aggregate_metrics_error == run_aggregate_metrics.NOT_ASKED
    finish_some(run, 2)

    def never(*args, **kwargs):
        raise AssertionError("the env's /aggregate_metrics was called")

    monkeypatch.setattr(run_aggregate_metrics, "build_aggregate_metrics", never)
    assert run_aggregate_metrics.fetch_aggregate_metrics(run.pk) == run_aggregate_metrics.NOT_ASKED
    monkeypatch.undo()
    entries, notes = run_aggregate_metrics.run_aggregate_entries(run)  # computed by gymweb instead
    assert entries and "env_aggregate_metrics off" in notes[0] and aggregate_metrics.LOCAL_NOTE in notes[0]


def test_a_completed_batch_without_the_envs_aggregates_queues_no_task_for_them(client, auth, monkeypatch):
    import django_q.tasks

    queued = []
    monkeypatch.setattr(django_q.tasks, "async_task", lambda *args, **kwargs: queued.append(args))
    body = {"rows": task_rows(2), "agent_url": AGENT, "env_url": ENV}
    asked, skipped = (
        Run.objects.get(pk=post_json(client, auth, b).json()["id"])
        for b in (body, {**body, "env_aggregate_metrics": False})
    )
    for run in (asked, skipped):
        finish_some(run, 2)
    dispatcher.finish_idle([asked.pk, skipped.pk])
    assert Run.objects.filter(pk__in=[asked.pk, skipped.pk], status=Run.Status.COMPLETED).count() == 2
    assert queued == [("rollouts.evaluation.run_aggregate_metrics.fetch_aggregate_metrics", asked.pk)]


def test_a_launch_wakes_idle_workers_through_the_database(transactional_db):
    """The SQLite watcher sees a run launched by another connection (PostgreSQL: LISTEN/NOTIFY)."""
    import threading

    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl
    from rollouts.workers import wakeup

    woken = threading.Event()
    watcher = wakeup.Watcher(woken.set, poll_s=0.01).start()
    try:
        assert not woken.wait(0.3)  # nothing launched: no wake-up
        with COUNTER_TASKS.open("rb") as fh:
            run = runs.create_run(read_jsonl(fh), name="w", agent_url=AGENT, env_url=ENV)
        runs.launch(run)
        assert woken.wait(30), "the watcher never saw the launch"
    finally:
        watcher.stop()


# -- results out -----------------------------------------------------------------------------------
def finish_some(run: Run, n: int, fail_every: int = 0) -> list[int]:
    """Claim ``n`` pending rollouts and write their ends through the dispatcher's own writer."""
    claimed = claims.claim(run.pk, "test-worker", n, 60.0)
    assert len(claimed) == n
    batch = writer.Batch()
    for i, (rollout_id, row_json, rollout_index) in enumerate(reversed(claimed)):  # not in key order
        row = json.loads(row_json)
        if fail_every and i % fail_every == 0:
            out = RolloutOutcome(
                ok=False, failure_kind="agent_http_error", error=f"HTTP 500 from the agent ({rollout_id})"
            )
        else:
            verify = {
                "responses_create_params": row["responses_create_params"],
                "reward": 1.0,
                "response": {
                    "id": f"r{rollout_id}",
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [
                                {"type": "output_text", "text": "ok", "logprobs": [{"token": "ok", "logprob": -0.25}]}
                            ],
                            "generation_token_ids": [7, 8, 9],
                        }
                    ],
                },
            }
            out = RolloutOutcome(ok=True, reward=1.0, verify_response=verify)
        batch.finished.append((rollout_id, out))
        batch.run_of[rollout_id] = run.pk
    writer.write_batch(batch, "test-worker")
    return [rollout_id for rollout_id, _, _ in reversed(claimed)]


def read_stream(client, auth, run, after=0, wait=0) -> list[bytes]:
    response = client.get(f"{API}/runs/{run.pk}/results?after={after}&wait={wait}", **auth)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/x-ndjson")
    return [line for line in b"".join(response.streaming_content).split(b"\n") if line.strip()]


@pytest.fixture
def inline_run(client, auth):
    response = post_json(client, auth, {"rows": task_rows(5), "agent_url": AGENT, "env_url": ENV, "num_repeats": 2})
    assert response.status_code == 201
    return Run.objects.get(pk=response.json()["id"])


def test_a_result_dropped_because_its_lease_was_taken_over_takes_no_place_in_the_finishing_order(inline_run):
    run = inline_run
    claimed = claims.claim(run.pk, "test-worker", 3, 60.0)
    taken = claimed[1][0]
    Rollout.objects.filter(pk=taken).update(worker="another-worker")  # reaped and run by another worker
    batch = writer.Batch()
    for rollout_id, _, _ in claimed:
        batch.finished.append((rollout_id, RolloutOutcome(ok=False, failure_kind="agent_http_error", error="HTTP 500")))
        batch.run_of[rollout_id] = run.pk
    writer.write_batch(batch, "test-worker")
    seqs = dict(Rollout.objects.filter(pk__in=[c[0] for c in claimed]).values_list("id", "result_seq"))
    assert seqs == {claimed[0][0]: 1, taken: None, claimed[2][0]: 2}
    assert finish_some(run, 2)  # numbered on from the highest
    assert sorted(Rollout.objects.filter(run=run, result_seq__isnull=False).values_list("result_seq", flat=True)) == [
        1,
        2,
        3,
        4,
    ]


def test_the_stream_gives_the_files_rows_in_finishing_order_and_each_once_across_reconnects(client, auth, inline_run):
    run = inline_run
    first = finish_some(run, 3, fail_every=3)
    got = read_stream(client, auth, run)
    assert len(got) == 3
    # finishing order: the order the writer was given them
    assert [json.loads(line).get("_ng_task_index") for line in got] == [
        Rollout.objects.get(pk=r).task_index for r in first
    ]
    again = read_stream(client, auth, run, after=2)  # a client that kept 2 rows reconnects
    assert again == got[2:]
    finish_some(run, 4, fail_every=2)
    later = read_stream(client, auth, run, after=3)
    assert len(later) == 4
    finish_some(run, 3)
    dispatcher.finish_idle([run.pk], after_finish=False)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    whole = got + later + read_stream(client, auth, run, after=7, wait=1)  # a final run: answers at once
    assert len(whole) == 10 and len(set(whole)) == 10
    # the same bytes the run's files hold, row for row
    files = set(export.iter_successes(run)) | set(export.iter_failures(run))
    assert {line.decode() for line in whole} == files
    assert read_stream(client, auth, run, after=10, wait=1) == []
    # the token-level fields the agent sent come through unchanged
    success = next(json.loads(line) for line in whole if "_ng_failure_class" not in json.loads(line))
    item = success["response"]["output"][0]
    assert item["generation_token_ids"] == [7, 8, 9] and item["content"][0]["logprobs"][0]["logprob"] == -0.25


def test_a_waiting_stream_is_woken_by_results_another_connection_stores(transactional_db, monkeypatch):
    """SQLite: the change counter moves; PostgreSQL: the writer's NOTIFY. Never the fallback look."""
    import threading

    from django.db import connection

    from rollouts.api import result_wait
    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl

    monkeypatch.setattr(result_wait, "FALLBACK_S", 600.0)
    with COUNTER_TASKS.open("rb") as fh:
        run = runs.create_run(read_jsonl(fh), name="w", agent_url=AGENT, env_url=ENV)
    runs.launch(run)
    ready, woken = threading.Event(), threading.Event()

    def stream() -> None:
        try:
            with result_wait.ResultWait() as changes:
                assert changes.mode == connection.vendor
                ready.set()
                changes.wait()
                woken.set()
        finally:
            connection.close()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert ready.wait(30)
    finish_some(run, 1)
    assert woken.wait(60), "the stream never saw the stored result"
    thread.join(5)


def test_a_waiting_stream_gives_results_stored_after_it_caught_up_each_once(transactional_db, monkeypatch):
    """Between results, other commits (a claim) wake the stream without a new row; the rows that
    come later still arrive, each once, and the stream ends when the run is final."""
    from rollouts.api import result_wait
    from rollouts.api.trainer import result_lines
    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl

    monkeypatch.setattr(result_wait, "FALLBACK_S", 0.02)  # the same connection's commits do not signal
    with COUNTER_TASKS.open("rb") as fh:
        run = runs.create_run(read_jsonl(fh), name="w", agent_url=AGENT, env_url=ENV)
    runs.launch(run)
    keys = run.num_keys
    assert keys >= 3
    lines = result_lines(run.pk, 0, True)
    finish_some(run, 2)
    got = next(lines).splitlines()
    assert len(got) == 2
    claims.claim(run.pk, "another-worker", 1, 60.0)  # a commit that stores no result
    finish_some(run, keys - 3)
    got += next(lines).splitlines()
    assert len(got) == keys - 1
    Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).update(worker="test-worker")
    batch = writer.Batch()
    for rollout_id in Rollout.objects.filter(run=run, status=Rollout.Status.RUNNING).values_list("id", flat=True):
        batch.finished.append((rollout_id, RolloutOutcome(ok=False, failure_kind="agent_http_error", error="x")))
        batch.run_of[rollout_id] = run.pk
    writer.write_batch(batch, "test-worker")
    dispatcher.finish_idle([run.pk], after_finish=False)
    got += b"".join(lines).splitlines()
    assert len(got) == keys and len(set(got)) == keys
    files = set(export.iter_successes(run)) | set(export.iter_failures(run))
    assert {line.decode() for line in got} == files


def test_the_stream_waits_for_rows_until_the_run_is_final(client, auth, inline_run, settings):
    settings.GYMWEB_STREAM_POLL_S = 0.01
    settings.GYMWEB_STREAM_MAX_S = 0.3  # the stream ends by itself; the client reconnects
    run = inline_run
    finish_some(run, 2)
    got = read_stream(client, auth, run, wait=1)
    assert len(got) == 2  # ended by the time bound with the two rows, the run still running
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_one_rollout_whole_and_as_its_nemo_gym_row(client, auth, inline_run):
    run = inline_run
    rollout_id = finish_some(run, 1)[0]
    AgentCall.objects.create(
        rollout_id=rollout_id,
        index=0,
        started="2026-12-01T00:00:00Z",
        latency_ms=12.5,
        http_status=200,
        usage={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    )
    whole = client.get(f"{API}/rollouts/{rollout_id}", **auth).json()
    assert whole["status"] == "succeeded" and whole["verify"]["reward"] == 1.0
    assert whole["response"]["id"] == f"r{rollout_id}"
    assert whole["steps"][0]["latency_ms"] == 12.5 and whole["steps"][0]["usage"]["total_tokens"] == 5
    row = client.get(f"{API}/rollouts/{rollout_id}?format=nemo_gym", **auth)
    assert row.status_code == 200
    assert row.content.decode() in set(export.iter_successes(run))
    pending = run.rollouts.filter(status=Rollout.Status.PENDING).first()
    assert client.get(f"{API}/rollouts/{pending.pk}?format=nemo_gym", **auth).status_code == 409
    assert client.get(f"{API}/rollouts/{rollout_id}?format=csv", **auth).status_code == 400


# -- api_token -------------------------------------------------------------------------------------
def test_api_token_create_list_revoke(user):
    out = io.StringIO()
    call_command("api_token", "create", "--user", user.username, "--name", "trainer", stdout=out, stderr=io.StringIO())
    token = out.getvalue().strip()
    assert token.startswith("gw_") and user_for_token(token) == user
    listing = io.StringIO()
    call_command("api_token", "list", "--user", user.username, stdout=listing)
    row = ApiToken.objects.get(user=user)
    assert row.prefix in listing.getvalue() and "trainer" in listing.getvalue() and token not in listing.getvalue()
    call_command("api_token", "revoke", "--user", user.username, "--id", str(row.pk), stdout=io.StringIO())
    assert user_for_token(token) is None and not ApiToken.objects.exists()
    with pytest.raises(CommandError, match="no user named"):
        call_command("api_token", "list", "--user", "nobody")
    with pytest.raises(CommandError, match="no such token"):
        call_command("api_token", "revoke", "--user", user.username, "--all")


# -- OpenAPI ---------------------------------------------------------------------------------------
def test_the_openapi_document_declares_filters_answers_and_content_types(client, db):
    doc = client.get(f"{API}/openapi.json").json()
    paths = doc["paths"]
    listing = paths["/api/v1/runs/{run_id}/rollouts"]["get"]
    params = {p["name"]: p for p in listing["parameters"]}
    assert params["status"]["schema"]["enum"] == [
        "",
        "pending",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "interrupted",
    ]
    assert "agent_timeout" in params["kind"]["schema"]["enum"] and "verdict" in params and "check" in params
    assert set(params["sort"]["schema"]["enum"]) >= {"reward", "-reward"}
    download = paths["/api/v1/runs/{run_id}/rollouts.jsonl"]["get"]
    assert "status" in {p["name"] for p in download["parameters"]}
    assert "application/jsonl" in download["responses"]["200"]["content"]
    assert "application/x-ndjson" in paths["/api/v1/runs/{run_id}/results"]["get"]["responses"]["200"]["content"]
    ops = [op for ops in paths.values() for op in ops.values()]
    assert ops and all("401" in op["responses"] for op in ops)
    assert all("404" in op["responses"] for path, o in paths.items() if "{" in path for op in o.values())
    create = paths["/api/v1/runs"]["post"]
    assert {"application/json", "application/x-ndjson"} <= set(create["requestBody"]["content"])
    # A JSONL body's settings go in the querystring, typed as in the JSON body.
    query = {p["name"]: p for p in create["parameters"]}
    assert query["num_repeats"]["schema"]["type"] == "integer" and query["num_repeats"]["schema"]["default"] == 1
    assert query["env_aggregate_metrics"]["schema"]["type"] == "boolean"
    assert query["remote_responses_timeout_s"]["schema"]["type"] == "number"
    assert (
        query["overrides"]["schema"]["type"] == "string"
        and "JSON object" in query["overrides"]["schema"]["description"]
    )
    assert "GYMWEB_ENV_MAX_IN_FLIGHT" in query["env_max_in_flight"]["description"]


def test_the_new_routes_answer_401_without_a_token(client, auth, inline_run):
    assert client.get(f"{API}/runs/{inline_run.pk}/results?wait=0").status_code == 401
    assert (
        client.post(
            f"{API}/runs?agent_url={AGENT}&env_url={ENV}", data="{}", content_type="application/x-ndjson"
        ).status_code
        == 401
    )
    assert Run.objects.count() == 1
