"""A Python client of gymweb's API for training loops (httpx; sync ``Client`` and asyncio
``AsyncClient``). ``docs/trainer-api.md`` describes the routes it uses.

A training step in three lines::

    from gymweb.client import Client
    client = Client("http://gymweb:8000", token="gw_...")        # or GYMWEB_URL / GYMWEB_TOKEN
    for row, result in client.run_examples(rows, agent_url="http://agent:9102", env_url="http://env:9101"):
        ...

``run_examples`` sends the batch inline (``POST /api/v1/runs``), then reads the results stream
(``GET /api/v1/runs/{id}/results``) and yields ``(row, result)`` as each rollout finishes: ``row``
is the caller's own row object, ``result`` the NeMo Gym row (a success as ``rollouts.jsonl`` has
it, a failure as the failures sidecar has it: ``_ng_failure_class``, ``error``, ``reward`` 0.0).
It mirrors NeMo Gym's ``RolloutCollectionHelper.run_examples``: rows run as given (one rollout
each; repeat a row for more), results in finishing order. ``AsyncClient.run_examples`` returns,
like NeMo Gym's, an iterator of awaitables, each giving the next finished ``(row, result)``.

A dropped stream is reconnected with its cursor (every row exactly once), up to ``retries`` times
in a row with ``retry_pause_s`` between tries. A busy server's 503 or 429 with ``Retry-After`` (its
limits on open results streams, docs/production.md) is waited out and tried again, for up to
``busy_budget_s`` seconds of waiting in a row; then ``ServerBusy``. Settings the server refuses raise
``RefusedSettings`` (its message names the field, or the row and field); a bad token raises
``Unauthorized``; a run that ends without a result for every row (cancelled) raises ``RunEnded``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx

from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = [
    "AsyncClient",
    "Client",
    "GymwebError",
    "RefusedSettings",
    "ResultsInterrupted",
    "RunEnded",
    "ServerBusy",
    "Unauthorized",
]

API = "/api/v1"
FINAL = ("completed", "cancelled", "imported")


class GymwebError(Exception):
    """An answer of the gymweb server that is not what was asked for. ``status``: the HTTP status
    (None when the server could not be reached); ``detail``: its message; ``errors``: per field."""

    def __init__(self, message: str, status: int | None = None, detail: str = "", errors: dict | None = None):
        super().__init__(message)
        self.status = status
        self.detail = detail or message
        self.errors = errors or {}


class RefusedSettings(GymwebError):
    """The server refused the run (400/413/415): a setting or a row is wrong. ``str(exc)`` says
    which (e.g. ``rows[2] (row 3): the row has no 'responses_create_params'``); nothing was stored."""


class Unauthorized(GymwebError):
    """401: no token, or an unknown or revoked one (make one with ``manage.py api_token create``)."""


class ServerBusy(GymwebError):
    """The server answered 503 or 429 with ``Retry-After`` (busy: e.g. its limit on open results
    streams) for longer than the client's ``busy_budget_s``. ``limit``, ``value``: the limit the
    last answer named (``per_process``/``per_user`` and how many streams it allows; empty/None when
    it named none); ``waited_s``: seconds waited in all."""

    def __init__(self, message: str, status: int, detail: str, limit: str, value: int | None, waited_s: float):
        super().__init__(message, status, detail)
        self.limit = limit
        self.value = value
        self.waited_s = waited_s


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds a 503 or 429 answer asks to wait (``Retry-After``: seconds or an HTTP date); None
    for any other answer, or one without the header (nothing says a retry would help)."""
    if response.status_code not in (429, 503):
        return None
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class RunEnded(GymwebError):
    """The run became final (cancelled, or resumed nowhere) before every row had a result.
    ``run``: the run as the server describes it; ``received``: how many results came."""

    def __init__(self, message: str, run: dict, received: int):
        super().__init__(message)
        self.run = run
        self.received = received


def _decoded(response: httpx.Response, what: str) -> Any:
    """A 2xx answer's JSON body; ``GymwebError`` when it is no JSON (not gymweb's API answering)."""
    try:
        return response.json()
    except ValueError:
        raise GymwebError(
            f"{what}: HTTP {response.status_code}, but the answer is not JSON "
            f"({response.headers.get('content-type', 'no content type')}): is {response.url} gymweb's API?",
            response.status_code,
            response.text[:500],
        ) from None


def _cut(what: str, method: str, exc: httpx.HTTPError) -> GymwebError:
    """A request the server took and then dropped (``status`` None). A POST is not sent again: the
    server may have done it (a run launched), so the message says where to look."""
    after = " (not sent again: the run may have been launched; see GET /api/v1/runs)" if method == "POST" else ""
    return GymwebError(f"{what}: {exc.__class__.__name__}: {exc}{after}")


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = str(body.get("detail") or response.text[:500] or response.reason_phrase)
    errors = body.get("errors") or {}
    message = f"{what}: HTTP {response.status_code}: {detail}"
    if response.status_code == 401:
        raise Unauthorized(message, 401, detail, errors)
    if response.status_code in (400, 413, 415, 422):
        raise RefusedSettings(message, response.status_code, detail, errors)
    raise GymwebError(message, response.status_code, detail, errors)


def _keyed_rows(rows: Iterable[dict]) -> tuple[list[dict], list[dict], dict[tuple[int, int], int]]:
    """``(originals, rows to send, {(task index, rollout index): position})``. A row without
    ``_ng_task_index`` gets one of its own (never one that another row carries), so every row is
    one rollout; rows sharing a task index are that task's rollouts 0, 1, ... in order (the
    server's rule, ``rollouts.collection.datasets.materialize``)."""
    originals = list(rows)
    if not originals:
        raise RefusedSettings("run_examples needs at least one row")
    explicit = {
        r[TASK_INDEX_KEY_NAME] for r in originals if isinstance(r, dict) and isinstance(r.get(TASK_INDEX_KEY_NAME), int)
    }
    sent, keys, seen = [], {}, {}
    fresh = 0
    for position, row in enumerate(originals):
        if not isinstance(row, dict):
            raise RefusedSettings(f"rows[{position}] is a {type(row).__name__}, not a dict (a NeMo Gym task row)")
        task = row.get(TASK_INDEX_KEY_NAME)
        if not isinstance(task, int) or isinstance(task, bool):
            while fresh in explicit:
                fresh += 1
            task = fresh
            fresh += 1
            row = {**row, TASK_INDEX_KEY_NAME: task}
        index = seen.get(task, 0)
        seen[task] = index + 1
        keys[(task, index)] = position
        sent.append(row)
    return originals, sent, keys


def _run_body(
    sent: list[dict],
    agent_url: str | None,
    env_url: str | None,
    head_url: str | None,
    agent_name: str | None,
    settings: dict[str, Any],
) -> dict[str, Any]:
    if head_url is not None or (agent_url is None or env_url is None):
        raise RefusedSettings(
            "give agent_url= and env_url= (this gymweb server does not find environments by name through a head server)"
        )
    for name, instead in (("num_repeats", "repeat a row for more rollouts of it"), ("limit", "send fewer rows")):
        if name in settings:
            raise RefusedSettings(f"run_examples runs each row once: {name}= is not taken here; {instead}")
    # As NeMo Gym's run_examples, a batch does not ask the env's /aggregate_metrics (a NeMo Gym env
    # computes it in its event loop, stalling the next batch's rollouts); settings may ask for it.
    # And as there, each row is run once (one attempt; max_attempts= asks for more): the server's
    # automatic retry would otherwise run a failed row again after its failure was handed out.
    body = {
        "rows": sent,
        "agent_url": agent_url,
        "env_url": env_url,
        "concurrency": min(len(sent), 4096),
        "env_aggregate_metrics": False,
        "max_attempts": 1,
        **settings,
    }
    if agent_name:
        body["agent_name"] = agent_name
    return body


def _json_body(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as request arguments: JSON with non-ASCII escaped, so a lone surrogate in a row
    reaches the server (which refuses it, naming the row) instead of failing to encode here.
    ``RefusedSettings`` naming the row or setting when a value is no JSON (bytes, a set, NaN or
    infinity: JSON has no such number), before anything is sent."""
    try:
        text = json.dumps(body, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise RefusedSettings(f"{_unsendable(body)}: not JSON ({exc})") from None
    return {"content": text.encode("ascii"), "headers": {"Content-Type": "application/json"}}


def _unsendable(body: dict[str, Any]) -> str:
    """Where in ``body`` the first value JSON cannot carry is: ``rows[2] (row 3)`` or a setting's name."""
    for name, value in body.items():
        parts = enumerate(value) if name == "rows" and isinstance(value, list) else [(None, value)]
        for i, part in parts:
            try:
                json.dumps(part, allow_nan=False)
            except (TypeError, ValueError, RecursionError):
                return name if i is None else f"rows[{i}] (row {i + 1})"
    return "the request"


class _Finals:
    """Which streamed rows are a row's final result. A success is; a failure is when it is terminal
    (``_ng_failure_terminal``) or its key's ``max_attempts``-th. Any other failure may be followed
    by another attempt of its key (the server's automatic retry): it is held, a later row of the
    key replaces it, and the ones still held when the run has ended are final."""

    def __init__(self, max_attempts: int):
        self.max_attempts = max_attempts
        self.failures: dict[tuple[Any, Any], int] = {}
        self.held: dict[tuple[Any, Any], dict] = {}

    def take(self, result: dict) -> dict | None:
        """``result`` when it is final now, else None (held)."""
        key = (result.get(TASK_INDEX_KEY_NAME), result.get(ROLLOUT_INDEX_KEY_NAME))
        self.held.pop(key, None)
        if "_ng_failure_class" not in result or result.get("_ng_failure_terminal"):
            return result
        self.failures[key] = self.failures.get(key, 0) + 1
        if self.failures[key] >= self.max_attempts:
            return result
        self.held[key] = result
        return None

    def left(self) -> list[dict]:
        """The held failures, final once the run has ended."""
        held, self.held = list(self.held.values()), {}
        return held


class _Batch:
    """One ``run_examples`` batch: its rows by (task, rollout) key, the launch's body, and which of
    the run's streamed rows are final (``_Finals``). ``take`` and ``left`` give the ``(row,
    result)`` pairs to hand out; ``done`` once every row has its result."""

    def __init__(self, rows, agent_url, env_url, head_url, agent_name, settings: dict[str, Any]):
        self.originals, sent, self.keys = _keyed_rows(rows)
        self.body = _run_body(sent, agent_url, env_url, head_url, agent_name, settings)
        attempts = self.body["max_attempts"]
        # A value that is no whole number is the server's to refuse (RefusedSettings) at the launch.
        self.finals = _Finals(attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 1)
        self.run_id = 0  # set once launched

    @property
    def done(self) -> bool:
        return not self.keys

    def _pair(self, result: dict) -> tuple[dict, dict]:
        key = (result.get(TASK_INDEX_KEY_NAME), result.get(ROLLOUT_INDEX_KEY_NAME))
        if key not in self.keys:
            raise GymwebError(
                f"run {self.run_id} sent a result for task {key[0]} rollout {key[1]}, which no row asked for"
            )
        return self.originals[self.keys.pop(key)], result

    def take(self, result: dict) -> list[tuple[dict, dict]]:
        """The pair for a streamed row when it is final, else none (held)."""
        final_row = self.finals.take(result)
        return [] if final_row is None else [self._pair(final_row)]

    def left(self) -> list[tuple[dict, dict]]:
        """The pairs of the failures held when the stream ended (the run has ended)."""
        return [self._pair(result) for result in self.finals.left()]

    def ended(self, run: dict) -> RunEnded:
        got = len(self.originals) - len(self.keys)
        return RunEnded(
            f"run {self.run_id} ended ({run['status']}) with {got} of {len(self.originals)} results", run, got
        )


class ResultsInterrupted(GymwebError):
    """The results stream could not be read again after ``retries`` tries. ``run_id`` and
    ``after`` (the rows read) resume it: ``client.results(run_id, after=after)``."""

    def __init__(self, message: str, run_id: int, after: int):
        super().__init__(message)
        self.run_id, self.after = run_id, after


MAX_RETRY_PAUSE_S = 5.0


class _Lines:
    """Complete NDJSON lines out of byte chunks: a line cut by a dropped connection never counts."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, chunk: bytes) -> list[dict]:
        data = self.rest + chunk
        *lines, self.rest = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


class _Base:
    def __init__(
        self, url: str | None, token: str | None, retries: int, retry_pause_s: float, busy_budget_s: float = 300.0
    ):
        url = url or os.environ.get("GYMWEB_URL") or ""
        if not url:
            raise ValueError("give the gymweb server's URL (or set GYMWEB_URL)")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("GYMWEB_TOKEN", "")
        self.retries = retries
        self.retry_pause_s = retry_pause_s
        self.busy_budget_s = busy_budget_s

    STREAM_READ_TIMEOUT_S = 120.0  # the server sends a keep-alive line after 15 s of silence

    def _stream_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=self.STREAM_READ_TIMEOUT_S)

    def _busy_pause(self, response: httpx.Response, what: str, waited: float) -> float | None:
        """Seconds to wait before sending ``response``'s request again when it is a busy answer
        (503/429 with ``Retry-After``), None when it is not; raises ``ServerBusy`` when that wait
        would take the waiting in a row (``waited``) past ``busy_budget_s``."""
        pause = _retry_after(response)
        if pause is None:
            return None
        pause = max(pause, 0.05)
        if waited + pause <= self.busy_budget_s:
            return pause
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        detail = str(body.get("detail") or response.text[:500] or response.reason_phrase)
        value = body.get("value")
        raise ServerBusy(
            f"{what}: HTTP {response.status_code}: {detail} (gave up after waiting {waited:g} s in all, "
            f"busy_budget_s={self.busy_budget_s:g})",
            response.status_code,
            detail,
            str(body.get("limit") or ""),
            value if isinstance(value, int) else None,
            waited,
        )

    def _pause(self, failures: int) -> float:
        """The wait before try ``failures + 1``: ``retry_pause_s``, doubling, at most
        ``MAX_RETRY_PAUSE_S`` (a web server restarting takes seconds)."""
        return min(self.retry_pause_s * 2 ** max(0, failures - 1), max(self.retry_pause_s, MAX_RETRY_PAUSE_S))

    def _lost(self, run_id: int, after: int, reason: str) -> ResultsInterrupted:
        return ResultsInterrupted(
            f"reading run {run_id}'s results: {reason}; {after} row(s) read: "
            f"resume with results({run_id}, after={after})",
            run_id,
            after,
        )

    def _unreached(self, run_id: int, after: int, exc: GymwebError) -> GymwebError:
        """What to raise when the run's status could not be read after its stream closed: a
        server that could not be reached (``status`` None) cut the stream too, so the cursor is
        kept (``ResultsInterrupted``); any other answer is raised as it is."""
        return exc if exc.status is not None else self._lost(run_id, after, str(exc))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


class Client(_Base):
    """Synchronous client. ``url``: the server (default ``GYMWEB_URL``); ``token``: an API token
    (default ``GYMWEB_TOKEN``); ``timeout``: seconds for one request (the stream's reads wait
    longer: it may stay quiet while rollouts run); ``retries``: reconnections in a row after a
    dropped connection, ``retry_pause_s`` apart at first, doubling up to ``MAX_RETRY_PAUSE_S`` (about
    38 s of tries by default: a web server restarting takes seconds); ``busy_budget_s``: seconds of
    waiting out busy answers (503/429 with ``Retry-After``) in a row before ``ServerBusy``. Use as a
    context manager or call ``close()``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 10,
        retry_pause_s: float = 0.5,
        busy_budget_s: float = 300.0,
        http: httpx.Client | None = None,
    ):
        super().__init__(url, token, retries, retry_pause_s, busy_budget_s)
        self.timeout = timeout
        self.http = http or httpx.Client(timeout=httpx.Timeout(timeout, read=None), headers=self._headers())

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- single calls ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        failures, waited = 0, 0.0
        # A POST is tried again only when it never reached the server (a second run otherwise);
        # a busy answer (503/429 with Retry-After) did nothing, so it is tried again whatever the method.
        retryable = (httpx.ConnectError, httpx.ConnectTimeout) if method == "POST" else (httpx.TransportError,)
        while True:
            try:
                response = self.http.request(method, self.url + API + path, timeout=self.timeout, **kwargs)
            except retryable as exc:
                failures += 1
                if failures > self.retries:
                    raise GymwebError(f"{what}: {exc.__class__.__name__}: {exc} ({failures} tries)") from exc
                time.sleep(self._pause(failures))
                continue
            except httpx.HTTPError as exc:
                raise _cut(what, method, exc) from exc
            pause = self._busy_pause(response, what, waited)
            if pause is not None:
                time.sleep(pause)
                waited += pause
                continue
            _raise_for(response, what)
            return _decoded(response, what)

    def submit(self, rows: list[dict], *, agent_url: str, env_url: str, **settings: Any) -> dict:
        """Launch a run on ``rows`` (sent inline); returns the run as ``GET /runs/{id}`` shows it.
        ``settings``: the run's other fields (num_repeats, concurrency, max_steps, overrides, ...)."""
        body = {"rows": list(rows), "agent_url": agent_url, "env_url": env_url, **settings}
        return self._request("POST", "/runs", "launching the run", **_json_body(body))

    def run(self, run_id: int) -> dict:
        """The run's status, progress and aggregates."""
        return self._request("GET", f"/runs/{run_id}", f"reading run {run_id}")

    def rollout(self, rollout_id: int, nemo_gym: bool = False) -> dict:
        """One rollout whole (trajectory, steps, verify reply), or only its NeMo Gym row."""
        params = {"format": "nemo_gym"} if nemo_gym else None
        return self._request("GET", f"/rollouts/{rollout_id}", f"reading rollout {rollout_id}", params=params)

    # -- the results stream ------------------------------------------------------------------------
    def results(self, run_id: int, after: int = 0, wait: bool = True) -> Iterator[dict]:
        """The run's NeMo Gym rows from position ``after`` in finishing order, each once; with
        ``wait``, until the run is final, reconnecting after a dropped connection."""
        failures, waited = 0, 0.0
        what = f"reading run {run_id}'s results"
        while True:
            got_any, busy = False, None
            try:
                with self.http.stream(
                    "GET",
                    f"{self.url}{API}/runs/{run_id}/results",
                    timeout=self._stream_timeout(),
                    params={"after": after, "wait": int(wait)},
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        busy = self._busy_pause(response, what, waited)
                        if busy is None:
                            _raise_for(response, what)
                    else:
                        waited = 0.0
                        lines = _Lines()
                        for chunk in response.iter_bytes():
                            for row in lines.feed(chunk):
                                after += 1
                                got_any = True
                                yield row
            except httpx.TransportError as exc:
                failures = 0 if got_any else failures + 1
                if failures > self.retries:
                    raise self._lost(run_id, after, f"{exc.__class__.__name__}: {exc} ({failures} tries)") from exc
                time.sleep(self._pause(failures))
                continue
            if busy is not None:
                time.sleep(busy)
                waited += busy
                continue
            failures = 0
            if not wait:
                return
            try:
                final = self.run(run_id)["status"] in FINAL
            except GymwebError as exc:
                raise self._unreached(run_id, after, exc) from exc
            if final:
                wait = False  # one last look from the cursor: a stream cut short closes like one that ended
            elif not got_any:
                time.sleep(self.retry_pause_s)

    def run_examples(
        self,
        rows: Iterable[dict],
        *,
        agent_url: str | None = None,
        env_url: str | None = None,
        head_url: str | None = None,
        agent_name: str | None = None,
        **settings: Any,
    ) -> Iterator[tuple[dict, dict]]:
        """Run each row once and yield ``(row, result)`` as each rollout finishes (NeMo Gym's
        ``run_examples``). ``settings``: other run fields (max_steps, overrides, timeouts,
        concurrency: default the batch size; env_max_in_flight: a bound on the env calls in flight, for an env
        that is one process). Raises ``RefusedSettings`` before anything runs when
        the server refuses a row or a setting; ``RunEnded`` when the run ends short."""
        batch = _Batch(rows, agent_url, env_url, head_url, agent_name, settings)
        batch.run_id = self._request("POST", "/runs", "launching the run", **_json_body(batch.body))["id"]
        for result in self.results(batch.run_id):
            yield from batch.take(result)
            if batch.done:
                return
        yield from batch.left()
        if not batch.done:
            raise batch.ended(self.run(batch.run_id))


class AsyncClient(_Base):
    """The asyncio client: the same methods as ``Client``, awaited. ``run_examples`` returns an
    iterator of awaitables as NeMo Gym's does (``for f in client.run_examples(...): row, result = await f``);
    ``iter_examples`` is the same as an async iterator."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 10,
        retry_pause_s: float = 0.5,
        busy_budget_s: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ):
        super().__init__(url, token, retries, retry_pause_s, busy_budget_s)
        self.timeout = timeout
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(timeout, read=None), headers=self._headers())

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        failures, waited = 0, 0.0
        retryable = (httpx.ConnectError, httpx.ConnectTimeout) if method == "POST" else (httpx.TransportError,)
        while True:
            try:
                response = await self.http.request(method, self.url + API + path, timeout=self.timeout, **kwargs)
            except retryable as exc:
                failures += 1
                if failures > self.retries:
                    raise GymwebError(f"{what}: {exc.__class__.__name__}: {exc} ({failures} tries)") from exc
                await asyncio.sleep(self._pause(failures))
                continue
            except httpx.HTTPError as exc:
                raise _cut(what, method, exc) from exc
            pause = self._busy_pause(response, what, waited)
            if pause is not None:
                await asyncio.sleep(pause)
                waited += pause
                continue
            _raise_for(response, what)
            return _decoded(response, what)

    async def submit(self, rows: list[dict], *, agent_url: str, env_url: str, **settings: Any) -> dict:
        body = {"rows": list(rows), "agent_url": agent_url, "env_url": env_url, **settings}
        return await self._request("POST", "/runs", "launching the run", **_json_body(body))

    async def run(self, run_id: int) -> dict:
        return await self._request("GET", f"/runs/{run_id}", f"reading run {run_id}")

    async def rollout(self, rollout_id: int, nemo_gym: bool = False) -> dict:
        params = {"format": "nemo_gym"} if nemo_gym else None
        return await self._request("GET", f"/rollouts/{rollout_id}", f"reading rollout {rollout_id}", params=params)

    async def results(self, run_id: int, after: int = 0, wait: bool = True) -> AsyncIterator[dict]:
        failures, waited = 0, 0.0
        what = f"reading run {run_id}'s results"
        while True:
            got_any, busy = False, None
            try:
                async with self.http.stream(
                    "GET",
                    f"{self.url}{API}/runs/{run_id}/results",
                    timeout=self._stream_timeout(),
                    params={"after": after, "wait": int(wait)},
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        busy = self._busy_pause(response, what, waited)
                        if busy is None:
                            _raise_for(response, what)
                    else:
                        waited = 0.0
                        lines = _Lines()
                        async for chunk in response.aiter_bytes():
                            for row in lines.feed(chunk):
                                after += 1
                                got_any = True
                                yield row
            except httpx.TransportError as exc:
                failures = 0 if got_any else failures + 1
                if failures > self.retries:
                    raise self._lost(run_id, after, f"{exc.__class__.__name__}: {exc} ({failures} tries)") from exc
                await asyncio.sleep(self._pause(failures))
                continue
            if busy is not None:
                await asyncio.sleep(busy)
                waited += busy
                continue
            failures = 0
            if not wait:
                return
            try:
                final = (await self.run(run_id))["status"] in FINAL
            except GymwebError as exc:
                raise self._unreached(run_id, after, exc) from exc
            if final:
                wait = False
            elif not got_any:
                await asyncio.sleep(self.retry_pause_s)

    async def iter_examples(
        self,
        rows: Iterable[dict],
        *,
        agent_url: str | None = None,
        env_url: str | None = None,
        head_url: str | None = None,
        agent_name: str | None = None,
        **settings: Any,
    ) -> AsyncIterator[tuple[dict, dict]]:
        """``async for row, result in client.iter_examples(rows, ...)``: as ``Client.run_examples``."""
        batch = _Batch(rows, agent_url, env_url, head_url, agent_name, settings)
        run = await self._request("POST", "/runs", "launching the run", **_json_body(batch.body))
        batch.run_id = run["id"]
        async for result in self.results(batch.run_id):
            for pair in batch.take(result):
                yield pair
            if batch.done:
                return
        for pair in batch.left():
            yield pair
        if not batch.done:
            raise batch.ended(await self.run(batch.run_id))

    def run_examples(self, rows: Iterable[dict], **kwargs: Any) -> Iterator[Awaitable[tuple[dict, dict]]]:
        """NeMo Gym's shape: one awaitable per row, each giving the next ``(row, result)`` to
        finish. The batch is sent when the first one is awaited; an error is raised by every
        awaitable from then on."""
        rows = list(rows)
        if not rows:  # as the other entry points: refused at once, not an empty iterator
            raise RefusedSettings("run_examples needs at least one row")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        state: dict[str, Any] = {}

        async def pump() -> None:
            try:
                async for pair in self.iter_examples(rows, **kwargs):
                    queue.put_nowait(pair)
            except Exception as exc:
                queue.put_nowait(exc)

        async def next_result() -> tuple[dict, dict]:
            if "task" not in state:
                state["task"] = asyncio.ensure_future(pump())
            item = await queue.get()
            if isinstance(item, Exception):
                queue.put_nowait(item)
                raise item
            return item

        return (next_result() for _ in rows)
