"""gymweb.client against a live gymweb on 127.0.0.1 with a real worker and the example env and agent
(sync and asyncio, NeMo Gym's run_examples shape), its errors, and its reconnection after a dropped
stream (no row lost or repeated)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from gymweb.client import AsyncClient, Client, GymwebError, RefusedSettings, ResultsInterrupted, Unauthorized
from rollouts.evaluation.run_aggregate_metrics import NOT_ASKED
from rollouts.models import Run
from rollouts.tokens import create_token

from .conftest import COUNTER_TASKS, wait_for

pytestmark = pytest.mark.timeout(240)


def task_rows() -> list[dict]:
    rows = [json.loads(line) for line in COUNTER_TASKS.read_text().splitlines() if line.strip()]
    assert rows
    return rows


@pytest.fixture
def token(django_user_model):
    user = django_user_model.objects.create_user(username="trainer", password="x")
    return create_token(user, "trainer")[1]


def test_run_examples_yields_each_row_with_its_result_as_rollouts_finish(
    live_server, workers, token, counter_env_url, counter_agent_url
):
    # Polls far apart: the batch can only start because the launch woke the idle worker.
    workers.start(workers=1, GYMWEB_POLL_S="600")
    from rollouts.models import Worker

    wait_for(lambda: Worker.objects.exists(), timeout=60, what="a live worker")
    rows = task_rows()
    with Client(live_server.url, token) as client:
        pairs = list(client.run_examples(rows, agent_url=counter_agent_url, env_url=counter_env_url))
        second = list(client.run_examples(rows[:2], agent_url=counter_agent_url, env_url=counter_env_url))
    assert len(pairs) == len(rows) and len(second) == 2
    assert sorted(id(row) for row, _ in pairs) == sorted(id(row) for row in rows)  # the caller's own rows
    for row, result in pairs:
        assert result["reward"] == 1.0 and result["_ng_task_index"] == rows.index(row)
        # NeMo Gym's row carries the request as its model materialises it (type, phase added)
        sent = [{k: m[k] for k in ("content", "role")} for m in result["responses_create_params"]["input"]]
        assert sent == row["responses_create_params"]["input"]
    assert Run.objects.count() == 2
    # as NeMo Gym's run_examples, a batch does not ask the env's /aggregate_metrics
    assert Run.objects.filter(aggregate_metrics_error=NOT_ASKED).count() == 2


def test_the_async_client_has_nemo_gyms_shape(live_server, workers, token, counter_env_url, counter_agent_url):
    workers.start(workers=1)
    rows = task_rows()

    async def train_step():
        async with AsyncClient(live_server.url, token) as client:
            out = []
            for future in client.run_examples(rows, agent_url=counter_agent_url, env_url=counter_env_url):
                out.append(await future)
            async for pair in client.iter_examples(rows[:1], agent_url=counter_agent_url, env_url=counter_env_url):
                out.append(pair)
            return out

    pairs = asyncio.run(train_step())
    assert len(pairs) == len(rows) + 1 and all(result["reward"] == 1.0 for _, result in pairs)


def test_refused_settings_and_tokens_raise_clear_errors(live_server, token, counter_env_url, counter_agent_url):
    rows = task_rows()
    rows[1] = {"responses_create_params": {"temperature": 0}}
    with Client(live_server.url, token) as client:
        with pytest.raises(RefusedSettings, match=r"rows\[1\] \(row 2\).*'input'") as exc:
            next(client.run_examples(rows, agent_url=counter_agent_url, env_url=counter_env_url))
        assert exc.value.status == 400 and "rows" in exc.value.errors
        with pytest.raises(RefusedSettings, match="max_steps"):
            next(client.run_examples(task_rows(), agent_url=counter_agent_url, env_url=counter_env_url, max_steps=-1))
        with pytest.raises(RefusedSettings, match="agent_url= and env_url="):
            next(client.run_examples(task_rows(), head_url="http://127.0.0.1:11000"))
    with Client(live_server.url, "gw_wrong") as client, pytest.raises(Unauthorized, match="401"):
        next(client.run_examples(task_rows(), agent_url=counter_agent_url, env_url=counter_env_url))
    assert not Run.objects.exists()


class _Cut(httpx.SyncByteStream):
    """A body that sends ``data`` and then drops the connection."""

    def __init__(self, data: bytes):
        self.data = data

    def __iter__(self):
        yield self.data
        raise httpx.ReadError("connection reset by peer")


def test_a_dropped_stream_is_read_on_from_its_cursor_without_losing_or_repeating_a_row():
    rows = [{"responses_create_params": {"input": f"task {i}"}} for i in range(5)]
    results = [
        json.dumps({"_ng_task_index": i, "_ng_rollout_index": 0, "reward": float(i)}).encode() + b"\n" for i in range(5)
    ]
    afters, state = [], {"final": False}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/api/v1/runs":
            sent = json.loads(request.content)["rows"]
            assert [r["_ng_task_index"] for r in sent] == [0, 1, 2, 3, 4]
            return httpx.Response(201, json={"id": 9, "status": "running"})
        if path == "/api/v1/runs/9/results":
            after = int(request.url.params["after"])
            afters.append(after)
            if len(afters) == 1:  # two rows and half of the third, then the connection drops
                return httpx.Response(200, stream=_Cut(results[0] + results[1] + results[2][:9]))
            if len(afters) == 2:
                return httpx.Response(200, stream=_Cut(b"".join(results[after:4])))
            state["final"] = True
            return httpx.Response(200, content=b"\n" + b"".join(results[after:]))
        if path == "/api/v1/runs/9":
            return httpx.Response(200, json={"id": 9, "status": "completed" if state["final"] else "running"})
        return httpx.Response(404, json={"detail": "Not Found"})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    client = Client("http://gymweb.test", "gw_x", http=http, retry_pause_s=0.0)
    pairs = list(client.run_examples(rows, agent_url="http://a", env_url="http://e"))
    assert afters == [0, 2, 4]
    assert [result["reward"] for _, result in pairs] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [row for row, _ in pairs] == rows


def test_a_stream_that_never_comes_back_raises_after_its_retries():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json={"id": 3, "status": "running"})
        raise httpx.ConnectError("connection refused")

    client = Client(
        "http://gymweb.test",
        "gw_x",
        http=httpx.Client(transport=httpx.MockTransport(handler)),
        retries=2,
        retry_pause_s=0.0,
    )
    with pytest.raises(ResultsInterrupted, match="3 tries") as lost:
        list(
            client.run_examples([{"responses_create_params": {"input": "x"}}], agent_url="http://a", env_url="http://e")
        )
    assert (lost.value.run_id, lost.value.after) == (3, 0), "where to resume the stream"


def _run_batch(client, rows: list[dict]) -> list:
    """Every ``(row, result)`` of ``rows`` through ``client`` (``Client.run_examples`` or
    ``AsyncClient.iter_examples``)."""
    if isinstance(client, Client):
        return list(client.run_examples(rows, agent_url="http://a", env_url="http://e"))

    async def consume():
        return [pair async for pair in client.iter_examples(rows, agent_url="http://a", env_url="http://e")]

    return asyncio.run(consume())


def test_a_stream_that_closes_as_if_it_ended_and_a_server_gone_keeps_the_cursor():
    # A server without chunked encoding (Connection: close) ends a cut stream as a finished one;
    # the status check after it then cannot reach the server either: the cursor is not lost.
    rows = [{"responses_create_params": {"input": f"task {i}"}} for i in range(3)]
    first = b"".join(
        json.dumps({"_ng_task_index": i, "_ng_rollout_index": 0, "reward": 1.0}).encode() + b"\n" for i in range(2)
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json={"id": 4, "status": "running"})
        if request.url.path == "/api/v1/runs/4/results" and request.url.params["after"] == "0":
            return httpx.Response(200, content=first)
        raise httpx.ConnectError("connection refused")

    for make in (Client, AsyncClient):
        http = httpx.Client if make is Client else httpx.AsyncClient
        client = make(
            "http://gymweb.test",
            "gw_x",
            http=http(transport=httpx.MockTransport(handler)),
            retries=1,
            retry_pause_s=0.0,
        )
        with pytest.raises(ResultsInterrupted) as lost:
            _run_batch(client, rows)
        assert (lost.value.run_id, lost.value.after) == (4, 2), make.__name__
        assert "resume with results(4, after=2)" in str(lost.value)


@pytest.mark.parametrize("answer", ["dropped", "not json"])
def test_a_launch_the_server_dropped_or_answered_with_no_json_raises_gymweb_error(answer):
    posts = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(request.method)
        if answer == "dropped":
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, content=b"<html>a proxy's page</html>", headers={"content-type": "text/html"})

    rows = [{"responses_create_params": {"input": "x"}}]
    for make, http in ((Client, httpx.Client), (AsyncClient, httpx.AsyncClient)):
        client = make("http://gymweb.test", "gw_x", http=http(transport=httpx.MockTransport(handler)), retry_pause_s=0)
        with pytest.raises(GymwebError) as raised:
            _run_batch(client, rows)
        message = str(raised.value)
        if answer == "dropped":  # sent once: the server may have launched it
            assert "RemoteProtocolError" in message and "the run may have been launched" in message
        else:
            assert "not JSON (text/html)" in message and raised.value.status == 200
    assert posts == ["POST", "POST"], "a launch the server may have taken is never sent again"


# -- one final result per row ---------------------------------------------------------------------------
def _row(task: int, reward: float | None = None, terminal: bool = False) -> bytes:
    """A streamed row of task ``task`` (rollout 0): a success with ``reward``, else a failure row."""
    row: dict = {"_ng_task_index": task, "_ng_rollout_index": 0, "reward": reward or 0.0}
    if reward is None:
        row.update({"_ng_failure_class": "remote_agent_error", "error": "agent down"})
        if terminal:
            row["_ng_failure_terminal"] = True
    return (json.dumps(row) + "\n").encode()


def _server(stream: bytes, sent: list):
    """A mock server: the launch records its body; the results stream sends ``stream``; the run is final."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            sent.append(json.loads(request.content))
            return httpx.Response(201, json={"id": 5, "status": "running"})
        if request.url.path == "/api/v1/runs/5/results":
            return httpx.Response(200, content=stream if request.url.params["after"] == "0" else b"")
        return httpx.Response(200, json={"id": 5, "status": "completed"})

    return Client("http://gymweb.test", "gw_x", http=httpx.Client(transport=httpx.MockTransport(handler)))


def test_a_batch_is_one_attempt_per_row_as_nemo_gyms_run_examples():
    sent: list = []
    client = _server(_row(0, 1.0) + _row(1), sent)
    rows = [{"responses_create_params": {"input": "x"}}] * 2
    results = [result for _, result in client.run_examples(rows, agent_url="http://a", env_url="http://e")]
    assert sent[0]["max_attempts"] == 1, "a failed row is not run again after its failure was handed out"
    assert [r.get("_ng_failure_class") for r in results] == [None, "remote_agent_error"]


def test_with_more_attempts_a_failure_that_is_retried_gives_way_to_the_later_result():
    sent: list = []
    # task 0 fails, then succeeds on its second attempt; task 1 fails terminally (never retried);
    # task 2 fails twice, its last attempt with max_attempts=2.
    stream = _row(0) + _row(1, terminal=True) + _row(2) + _row(0, 1.0) + _row(2)
    client = _server(stream, sent)
    rows = [{"responses_create_params": {"input": "x"}}] * 3
    pairs = list(client.run_examples(rows, agent_url="http://a", env_url="http://e", max_attempts=2))
    assert sent[0]["max_attempts"] == 2
    by_task = {result["_ng_task_index"]: result for _, result in pairs}
    assert len(pairs) == 3, "one result per row"
    assert by_task[0]["reward"] == 1.0 and "_ng_failure_class" not in by_task[0]
    assert by_task[1]["_ng_failure_terminal"] is True and "_ng_failure_class" in by_task[2]


def test_a_failure_held_for_a_retry_that_never_came_is_handed_out_when_the_run_ends():
    client = _server(_row(0, 1.0) + _row(1), [])  # the server did not retry task 1 (auto-retry off)
    rows = [{"responses_create_params": {"input": "x"}}] * 2
    pairs = list(client.run_examples(rows, agent_url="http://a", env_url="http://e", max_attempts=3))
    assert [result["_ng_task_index"] for _, result in pairs] == [0, 1]


@pytest.mark.parametrize(
    "rows, extra, words",
    [
        ([], {}, "at least one row"),
        ([["not", "a", "row"]], {}, "rows[0] is a list"),
        ([{"responses_create_params": {"input": "x"}}], {"num_repeats": 2}, "repeat a row"),
        ([{"responses_create_params": {"input": "x"}}], {"limit": 1}, "fewer rows"),
    ],
)
def test_what_run_examples_cannot_take_is_refused_before_anything_is_sent(rows, extra, words):
    sent: list = []
    client = _server(b"", sent)
    with pytest.raises(RefusedSettings, match=words.replace("[", "\\[").replace("]", "\\]")):
        list(client.run_examples(rows, agent_url="http://a", env_url="http://e", **extra))
    assert sent == []


@pytest.mark.parametrize(
    "rows, extra, words",
    [
        (
            [{"responses_create_params": {"input": "x"}}, {"responses_create_params": {"input": b"x"}}],
            {},
            "rows[1] (row 2)",
        ),
        ([{"responses_create_params": {"input": "x", "temperature": float("nan")}}], {}, "rows[0] (row 1)"),
        ([{"responses_create_params": {"input": "x"}}], {"overrides": {"temperature": float("inf")}}, "overrides"),
    ],
)
def test_a_value_json_cannot_carry_is_refused_naming_its_row_or_setting(rows, extra, words):
    sent: list = []
    client = _server(b"", sent)
    with pytest.raises(RefusedSettings, match=re.escape(words) + ": not JSON"):
        list(client.run_examples(rows, agent_url="http://a", env_url="http://e", **extra))
    assert sent == []


def test_a_lone_surrogate_in_a_row_reaches_the_server_escaped():
    sent: list = []
    client = _server(_row(0, 1.0), sent)
    list(
        client.run_examples(
            [{"responses_create_params": {"input": "x\ud800"}}], agent_url="http://a", env_url="http://e"
        )
    )
    assert sent[0]["rows"][0]["responses_create_params"]["input"] == "x\ud800"


def test_reconnections_back_off_up_to_a_cap():
    client = Client("http://gymweb.test", "gw_x", retry_pause_s=0.5)
    assert [client._pause(n) for n in (1, 2, 3, 4, 5, 6, 10)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert sum(client._pause(n) for n in range(1, client.retries + 1)) > 30, "outlasts a web server's restart"


# -- a busy server (503/429 with Retry-After) ---------------------------------------------------------
def _busy_then_ok(busy: int, status: int = 503):
    """A handler whose results stream answers ``busy`` times 503 (or 429) with Retry-After, then
    one row and the run final."""
    calls = {"results": 0}
    refused = {
        "detail": "this web process already holds its 3 open results streams",
        "limit": "per_process",
        "setting": "GYMWEB_MAX_RESULT_STREAMS",
        "value": 3,
        "retry_after_s": 0,
    }

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json={"id": 4, "status": "running"})
        if request.url.path == "/api/v1/runs/4/results":
            calls["results"] += 1
            if calls["results"] <= busy:
                return httpx.Response(status, headers={"Retry-After": "0.01"}, json=refused)
            return httpx.Response(200, content=b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
        return httpx.Response(200, json={"id": 4, "status": "completed"})

    return handler, calls


@pytest.mark.parametrize("status", [503, 429])
def test_a_busy_answer_is_waited_out_and_the_stream_read_after_it(status):
    handler, calls = _busy_then_ok(3, status)
    client = Client("http://gymweb.test", "gw_x", http=httpx.Client(transport=httpx.MockTransport(handler)))
    pairs = list(
        client.run_examples([{"responses_create_params": {"input": "x"}}], agent_url="http://a", env_url="http://e")
    )
    assert [result["reward"] for _, result in pairs] == [1.0]
    assert calls["results"] == 4


def test_a_server_busy_past_the_budget_raises_server_busy_naming_the_limit():
    from gymweb.client import ServerBusy

    handler, calls = _busy_then_ok(10**6)
    client = Client(
        "http://gymweb.test", "gw_x", http=httpx.Client(transport=httpx.MockTransport(handler)), busy_budget_s=0.1
    )
    with pytest.raises(ServerBusy) as busy:
        list(client.results(4))
    assert busy.value.status == 503 and busy.value.limit == "per_process" and busy.value.value == 3
    assert "holds its 3 open results streams" in str(busy.value) and "busy_budget_s=0.1" in str(busy.value)
    assert calls["results"] > 1  # it waited and tried again before giving up


def test_the_async_client_waits_out_a_busy_answer_too():
    handler, calls = _busy_then_ok(2)

    async def main():
        client = AsyncClient(
            "http://gymweb.test", "gw_x", http=httpx.AsyncClient(transport=httpx.MockTransport(handler))
        )
        return [
            pair
            async for pair in client.iter_examples(
                [{"responses_create_params": {"input": "x"}}], agent_url="http://a", env_url="http://e"
            )
        ]

    pairs = asyncio.run(main())
    assert [result["reward"] for _, result in pairs] == [1.0] and calls["results"] == 3


def test_a_busy_answer_to_a_single_call_is_retried():
    state = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        state["n"] += 1
        if state["n"] == 1:
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"detail": "slow down"})
        return httpx.Response(200, json={"id": 4, "status": "running"})

    client = Client("http://gymweb.test", "gw_x", http=httpx.Client(transport=httpx.MockTransport(handler)))
    assert client.run(4)["status"] == "running" and state["n"] == 2


def test_the_async_run_examples_refuses_no_rows_at_once():
    with pytest.raises(RefusedSettings, match="at least one row"):
        AsyncClient("http://gymweb.test", "gw_x").run_examples([], agent_url="http://a", env_url="http://e")
