"""Limits on open results streams (``rollouts.api.open_streams``): the counting (a slot given back
on every exit path), the 503/429 answers of ``GET /api/v1/runs/{id}/results``, a dropped client
noticed without a write, and the same under the real gunicorn (``gymweb serve``) with a small
thread count: pages and /healthz answer while the streams are open, a dropped client's slot is
freed, and the Python client waits out a 503."""

from __future__ import annotations

import gc
import re
import socket
import threading

import httpx
import pytest

from rollouts.api import result_wait
from rollouts.api.open_streams import HeldStream, Limits, StreamRefused, StreamSlots, client_gone, limits
from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl
from rollouts.models import Run
from rollouts.tokens import create_token

from .conftest import COUNTER_TASKS, wait_for

API = "/api/v1"
AGENT, ENV = "http://127.0.0.1:9102", "http://127.0.0.1:9101"


def running_run(name: str = "held") -> Run:
    """A launched run that stays running (no worker here)."""
    with COUNTER_TASKS.open("rb") as fh:
        run = runs.create_run(read_jsonl(fh), name=name, agent_url=AGENT, env_url=ENV)
    runs.launch(run)
    return run


# -- the limits ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("threads", "per_process", "per_user"), [(16, 12, 6), (4, 3, 1), (2, 1, 1), (1, 0, 1), (0, 12, 6)]
)
def test_the_default_limits_keep_a_quarter_of_the_threads_for_pages(settings, threads, per_process, per_user):
    settings.GYMWEB_WEB_THREADS = threads
    settings.GYMWEB_MAX_RESULT_STREAMS = None
    settings.GYMWEB_MAX_RESULT_STREAMS_PER_USER = None
    got = limits()
    assert (got.per_process, got.per_user) == (per_process, per_user)


def test_limits_set_explicitly_win_over_the_derived_ones(settings):
    settings.GYMWEB_WEB_THREADS = 16
    settings.GYMWEB_MAX_RESULT_STREAMS = 14
    settings.GYMWEB_MAX_RESULT_STREAMS_PER_USER = 2
    settings.GYMWEB_STREAM_RETRY_AFTER_S = 7
    assert limits() == Limits(14, 2, 7)


def test_a_limit_set_past_the_threads_is_held_to_leave_one_thread_for_pages(settings, caplog):
    settings.GYMWEB_WEB_THREADS = 4
    settings.GYMWEB_MAX_RESULT_STREAMS = 10
    settings.GYMWEB_MAX_RESULT_STREAMS_PER_USER = 10
    with caplog.at_level("WARNING", logger="gymweb.api"):
        got = limits()
        limits()
    assert got.per_process == 3
    warnings = [r.getMessage() for r in caplog.records if "GYMWEB_MAX_RESULT_STREAMS=10" in r.getMessage()]
    assert len(warnings) <= 1 and (not warnings or "held to 3" in warnings[0])


# -- counting --------------------------------------------------------------------------------------
def test_each_limit_refuses_with_its_own_status_and_a_freed_slot_is_taken_again():
    slots, limit = StreamSlots(), Limits(per_process=2, per_user=1, retry_after_s=5)
    first = slots.take("alice", limit)
    with pytest.raises(StreamRefused) as user_full:
        slots.take("alice", limit)
    assert user_full.value.status_code == 429
    assert user_full.value.body == {
        "limit": "per_user",
        "setting": "GYMWEB_MAX_RESULT_STREAMS_PER_USER",
        "value": 1,
        "retry_after_s": 5,
    }
    slots.take("bob", limit)
    with pytest.raises(StreamRefused) as process_full:
        slots.take("carol", limit)
    assert process_full.value.status_code == 503
    assert process_full.value.body["limit"] == "per_process" and process_full.value.body["value"] == 2
    assert process_full.value.retry_after == 5
    first.release()
    first.release()  # a second release gives nothing back twice
    assert (slots.total, slots.by_user) == (1, {"bob": 1})
    slots.take("carol", limit)
    with pytest.raises(StreamRefused):
        slots.take("dave", limit)


def _lines(fail: bool = False):
    yield b"a\n"
    if fail:
        raise RuntimeError("the database went away")
    yield b"b\n"


def _iterate_to_the_end(held):
    assert b"".join(held) == b"a\nb\n"


def _raise_midway(held):
    with pytest.raises(RuntimeError):
        list(held)


def _close_unstarted(held):
    iter(held)  # Django makes the iterator when the response is built; a refused write may close it unread
    held.close()


def _close_midway(held):
    # The server's write to a dropped client fails; it then closes the response.
    it = iter(held)
    next(it)
    next(it)
    held.close()


def _drop_unclosed(held):
    it = iter(held)
    next(it)
    del it


@pytest.mark.parametrize(
    "exit_path", [_iterate_to_the_end, _raise_midway, _close_unstarted, _close_midway, _drop_unclosed]
)
def test_a_held_stream_gives_its_slot_back_on_every_exit(exit_path):
    slots = StreamSlots()
    limit = Limits(per_process=1, per_user=1, retry_after_s=1)
    lines = _lines(fail=exit_path is _raise_midway)
    held = HeldStream(lines, slots.take("alice", limit))
    assert slots.total == 1
    exit_path(held)
    del held
    gc.collect()
    assert (slots.total, slots.by_user) == (0, {})
    slots.take("alice", limit)  # taken again


def test_closing_a_held_stream_closes_its_lines():
    closed = []

    def lines():
        try:
            yield b"x\n"
            yield b"y\n"
        finally:
            closed.append(True)

    held = HeldStream(lines(), StreamSlots().take("alice", Limits(1, 1, 1)))
    it = iter(held)
    assert next(it) == b""  # the head goes out at once
    assert next(it) == b"x\n"
    held.close()
    assert closed == [True]


# -- a client that went away -----------------------------------------------------------------------
def test_a_closed_connection_is_noticed_without_reading_from_it():
    server, client = socket.socketpair()
    try:
        gone = client_gone({"gunicorn.socket": server})
        assert gone() is False
        client.sendall(b"GET / HTTP/1.1\r\n")  # a pipelined request is not a goodbye, and stays unread
        assert gone() is False
        assert server.recv(100) == b"GET / HTTP/1.1\r\n"
        client.close()
        assert gone() is True
    finally:
        server.close()
    assert client_gone({})() is False  # another server: never says so


def test_a_waiting_stream_ends_once_its_client_is_gone(transactional_db, monkeypatch):
    from rollouts.api.trainer import result_lines

    monkeypatch.setattr(result_wait, "FALLBACK_S", 0.02)
    run = running_run()
    checks = []

    def gone() -> bool:
        checks.append(True)
        return len(checks) >= 3

    assert list(result_lines(run.pk, 0, True, gone)) == []  # returned although the run still runs
    assert len(checks) == 3
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


# -- the route -------------------------------------------------------------------------------------
@pytest.fixture
def slots(monkeypatch, settings):
    from rollouts.api import trainer

    settings.GYMWEB_MAX_RESULT_STREAMS = 2
    settings.GYMWEB_MAX_RESULT_STREAMS_PER_USER = 1
    settings.GYMWEB_STREAM_RETRY_AFTER_S = 3
    fresh = StreamSlots()
    monkeypatch.setattr(trainer, "SLOTS", fresh)
    return fresh


def _token(django_user_model, name: str) -> dict:
    user = django_user_model.objects.create_user(username=name, password="x")
    return {"HTTP_AUTHORIZATION": f"Bearer {create_token(user, 'trainer')[1]}"}


def test_streams_past_a_limit_get_503_or_429_with_retry_after_and_wait_0_is_not_counted(
    client, django_user_model, slots, transactional_db
):
    run = running_run()
    alice, bob, carol = (_token(django_user_model, n) for n in ("alice", "bob", "carol"))
    url = f"{API}/runs/{run.pk}/results?wait=1"
    held = client.get(url, **alice)
    assert held.status_code == 200 and slots.total == 1
    again = client.get(url, **alice)
    assert again.status_code == 429 and again["Retry-After"] == "3"
    assert again.json()["limit"] == "per_user" and again.json()["value"] == 1
    assert again.json()["setting"] == "GYMWEB_MAX_RESULT_STREAMS_PER_USER"
    held_too = client.get(url, **bob)
    assert held_too.status_code == 200
    full = client.get(url, **carol)
    assert full.status_code == 503 and full["Retry-After"] == "3"
    body = full.json()
    assert (body["limit"], body["setting"], body["value"], body["retry_after_s"]) == (
        "per_process",
        "GYMWEB_MAX_RESULT_STREAMS",
        2,
        3,
    )
    assert "GYMWEB_MAX_RESULT_STREAMS" in body["detail"]
    quick = client.get(f"{API}/runs/{run.pk}/results?wait=0", **carol)
    assert quick.status_code == 200 and slots.total == 2  # answered at once, not counted
    held.close()  # the server closes a response when its client goes away
    assert slots.total == 1
    assert client.get(url, **carol).status_code == 200


def test_a_stream_that_ends_by_itself_gives_its_slot_back(client, django_user_model, slots, transactional_db):
    run = running_run()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)
    alice = _token(django_user_model, "alice")
    for _ in range(3):  # more than the per-user limit, one after another
        response = client.get(f"{API}/runs/{run.pk}/results?wait=1", **alice)
        assert response.status_code == 200
        assert b"".join(response.streaming_content).strip() == b""
    assert slots.total == 0


def test_the_openapi_document_declares_the_503_and_429_answers(client):
    doc = client.get(f"{API}/openapi.json").json()
    answers = doc["paths"]["/api/v1/runs/{run_id}/results"]["get"]["responses"]
    for code in ("429", "503"):
        assert "Retry-After" in answers[code]["headers"]
        ref = answers[code]["content"]["application/json"]["schema"]["$ref"]
        fields = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"]
        assert {"detail", "limit", "setting", "value", "retry_after_s"} <= set(fields)


# -- under gunicorn --------------------------------------------------------------------------------
class RawStream:
    """A results stream read over a plain socket, so a test can drop it like a vanished client."""

    def __init__(self, base: str, run_id: int, token: str):
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.sendall(
            f"GET {API}/runs/{run_id}/results?wait=1 HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, f"the server closed the stream: {head!r}"
            head += chunk
        self.head = head.decode("latin-1")
        self.status = int(self.head.split(" ", 2)[1])

    def drop(self) -> None:
        self.sock.close()


def _tokens(django_user_model, n: int) -> list[str]:
    out = []
    for i in range(n):
        user = django_user_model.objects.create_user(username=f"trainer{i}", password="x")
        out.append(create_token(user, "trainer")[1])
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_under_gymweb_serve_the_streams_leave_threads_for_pages_and_a_dropped_client_frees_its_slot(
    gunicorn, django_user_model
):
    tokens = _tokens(django_user_model, 4)
    run = running_run()
    # 4 threads: 3 streams, 1 per user; keep-alives far apart, so only noticing the closed
    # socket can free a dropped client's slot within the test.
    base = gunicorn.start(
        workers=1,
        serve=True,
        args=("--threads", "4"),
        GYMWEB_STREAM_KEEPALIVE_S="600",
        GYMWEB_STREAM_RETRY_AFTER_S="1",
        GYMWEB_ALLOW_LOCAL_TARGETS="1",
    )
    held = [RawStream(base, run.pk, token) for token in tokens[:3]]
    try:
        assert [s.status for s in held] == [200, 200, 200], held[0].head
        health = httpx.get(f"{base}/healthz", timeout=20, trust_env=False)
        assert health.status_code == 200
        page = httpx.get(f"{base}/accounts/login/", timeout=20, trust_env=False)
        assert page.status_code == 200
        url = f"{base}{API}/runs/{run.pk}/results"
        full = httpx.get(url, headers={"Authorization": f"Bearer {tokens[3]}"}, timeout=20, trust_env=False)
        assert full.status_code == 503 and full.headers["Retry-After"] == "1"
        assert (full.json()["limit"], full.json()["value"]) == ("per_process", 3)
        quick = httpx.get(
            url + "?wait=0", headers={"Authorization": f"Bearer {tokens[3]}"}, timeout=20, trust_env=False
        )
        assert quick.status_code == 200
        own = httpx.get(url, headers={"Authorization": f"Bearer {tokens[0]}"}, timeout=20, trust_env=False)
        assert own.status_code == 429 and own.headers["Retry-After"] == "1"
        assert (own.json()["limit"], own.json()["value"]) == ("per_user", 1)
        held.pop(0).drop()

        def accepted():
            stream = RawStream(base, run.pk, tokens[3])
            if stream.status == 200:
                held.append(stream)
                return True
            stream.drop()
            return False

        wait_for(accepted, timeout=60, interval=0.5, what="a stream accepted after a client dropped its own")
    finally:
        for stream in held:
            stream.drop()
    assert "Traceback" not in gunicorn.logs()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_under_gymweb_serve_the_client_waits_out_a_503_and_then_reads(gunicorn, django_user_model):
    from gymweb.client import Client

    tokens = _tokens(django_user_model, 3)
    busy_run, run = running_run("busy"), running_run("mine")
    base = gunicorn.start(
        workers=1,
        serve=True,
        args=("--threads", "3"),  # 2 streams
        GYMWEB_STREAM_KEEPALIVE_S="600",
        GYMWEB_STREAM_RETRY_AFTER_S="1",
        GYMWEB_ALLOW_LOCAL_TARGETS="1",
    )
    held = [RawStream(base, busy_run.pk, token) for token in tokens[:2]]
    got: dict[str, object] = {}

    def read() -> None:
        with Client(base, tokens[2], busy_budget_s=120) as client:
            try:
                got["rows"] = list(client.results(run.pk))
            except Exception as exc:  # reported by the test below
                got["error"] = exc

    reader = threading.Thread(target=read, daemon=True)
    try:
        assert [s.status for s in held] == [200, 200]
        reader.start()
        mine = re.compile(rf'"GET {API}/runs/{run.pk}/results\S* HTTP/1.1" (\d+)')
        wait_for(lambda: "503" in mine.findall(gunicorn.logs()), timeout=60, what="the client's stream refused")
        held.pop().drop()  # a slot frees; the run then ends, so the client's stream, once accepted, ends too
        Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED)
        reader.join(120)
        assert not reader.is_alive()
        assert got == {"rows": []}, got
        answers = mine.findall(gunicorn.logs())
        assert answers[0] == "503" and answers[-1] == "200", answers
    finally:
        for stream in held:
            stream.drop()
