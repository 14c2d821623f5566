"""The loop of one rollout: seed → agent ⟲ gym-executed tools → verify (DESIGN.md, "Parties and the loop").

A plain async module with no Django in it, so a test can drive it against two local HTTP servers.
Persistence happens around it: the loop reports each step to an ``Observer`` as it happens and
returns a ``RolloutOutcome``. Failures of the agent or the env are *data* (an outcome with a
``failure_kind`` and an explained ``error``); the loop never raises for them. Only cancellation
(``asyncio.CancelledError``) propagates, since a cancelled or killed rollout is not an attempt.

Contract rules are numbered as in DESIGN.md ("Contract rules") and cited where they are applied.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

from rollouts.engine import nemo_errors, nemo_request
from rollouts.engine.contract import (
    InvalidReply,
    NotJSON,
    add_usage,
    find_asks,
    has_assistant_message,
    parse_reply,
    refused_tool_output,
    strict_loads,
)
from rollouts.engine.env_gate import EnvGate
from rollouts.engine.failures import NOT_HTTP, OWN_KINDS, TIMEOUT, UNREACHABLE, Failure, FailureKind, kind_for_step
from rollouts.engine.http import LoopClient, RawReply, SessionJar
from rollouts.engine.targets import parse_ip

__all__ = [
    "InvalidBaseURL",
    "ItemRecord",
    "LoopSettings",
    "Observer",
    "RefusedBody",
    "RolloutOutcome",
    "StepRecord",
    "run_rollout",
    "validate_base_url",
]

# NeMo Gym keeps the first 500 characters of a failing reply's body (rule 2).
BODY_EXCERPT_CHARS = 500
DEFAULT_REMOTE_RESPONSES_TIMEOUT_S = 1800.0
DEFAULT_RUN_TIMEOUT_S = 2100.0
DEFAULT_CONCURRENCY = 32
CONNECT_ATTEMPTS = 3
# How much of an agent reply gymweb refused is kept for the user to read (NeMo Gym keeps 500 characters).
DEFAULT_REFUSED_REPLY_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LoopSettings:
    """What one rollout needs to know about its run.

    ``agent_base_url`` and ``env_base_url`` are absolute http(s) URLs without a trailing slash
    (see ``validate_base_url``). ``max_steps``: agent calls per rollout, None or 0 = unbounded
    (rule 10). Timeouts in seconds (rule 12). ``retry_pause_s``: pause between connection attempts
    (rule 11); ``connect_retry_budget_s``: seconds more of tries with backoff once those attempts
    failed (0: none; ``LoopClient.post_with_attempts``). ``env_max_in_flight``: the run's own bound
    on its calls in flight to the env per worker process (0: the worker's ``EnvGate`` default).
    """

    agent_base_url: str
    env_base_url: str
    max_steps: int | None = None
    remote_responses_timeout_s: float = DEFAULT_REMOTE_RESPONSES_TIMEOUT_S
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    connect_attempts: int = CONNECT_ATTEMPTS
    retry_pause_s: float = 0.5
    connect_retry_budget_s: float = 0.0
    refused_reply_max_bytes: int = DEFAULT_REFUSED_REPLY_MAX_BYTES
    env_max_in_flight: int = 0


@dataclass
class StepRecord:
    """One agent call. ``index`` is 0-based; ``started_at`` epoch seconds; ``latency_ms`` wall time
    of the call including connection retries; ``usage`` the reply's usage (tokens) or None;
    ``error`` set when the call failed."""

    index: int
    started_at: float
    latency_ms: float
    http_status: int | None = None
    response_id: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    incomplete_details: Any = None
    num_asks: int = 0
    error: str | None = None


@dataclass
class ItemRecord:
    """One item of the merged trajectory, in order (``seq`` 0-based).

    ``origin`` is ``"agent"`` (an item of a reply) or ``"gym"`` (a ``function_call_output`` gymweb
    added after executing an ask). For an agent ``function_call``: ``asked`` is True when it was an
    unpaired ask (rule 4). For an agent ``function_call_output``: ``paired`` True (the agent's own
    tool record). For a gym output: ``latency_ms`` of the env call, ``tool_status`` its HTTP status
    (None when it was never sent, rules 5 and 6) and ``refused`` when gymweb did not send it.
    """

    seq: int
    step: int
    item: dict[str, Any]
    origin: str
    asked: bool = False
    paired: bool = False
    latency_ms: float | None = None
    tool_status: int | None = None
    refused: bool = False

    @property
    def kind(self) -> str:
        return str(self.item.get("type") or "")


class Observer(Protocol):
    """Receives a rollout's steps as they happen. Methods must not block the event loop (queue the
    work; see ``rollouts.workers``)."""

    def on_seeded(self, latency_ms: float) -> None: ...

    def on_step(self, step: StepRecord, items: list[ItemRecord]) -> None: ...

    def on_items(self, items: list[ItemRecord]) -> None: ...


class _NullObserver:
    def on_seeded(self, latency_ms: float) -> None:
        pass

    def on_step(self, step: StepRecord, items: list[ItemRecord]) -> None:
        pass

    def on_items(self, items: list[ItemRecord]) -> None:
        pass


@dataclass
class RefusedBody:
    """An agent reply gymweb refused (redirect, HTTP error, not JSON, invalid Responses object), as
    it arrived: ``status`` (HTTP), ``content_type`` (the header, "" when absent), ``body`` (the first
    ``refused_reply_max_bytes`` bytes), ``size`` (the whole body's length in bytes), ``truncated``,
    and for an invalid object ``errors`` (``contract.ReplyError``: JSON path and message)."""

    status: int
    content_type: str
    body: bytes
    size: int
    truncated: bool
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RolloutOutcome:
    """The end of one rollout.

    On success: ``reward`` (float), ``verify_response`` (the env's ``/verify`` reply as it came,
    a dict), ``response`` (the merged Responses object, rule 9). On failure: ``failure_kind``
    (a ``FailureKind`` value), ``error`` (the explained message), ``nemo_error`` (NeMo Gym 0.7.0's
    ``error`` text for the same failure, ``nemo_errors``; None: the same as ``error``, or NeMo Gym
    has none), ``terminal``; ``response`` holds
    the partial merged response when at least one agent reply came. ``usage`` is the summed usage
    (rule 8) or None when the agent never reported any. ``refused_reply``: the agent reply that
    ended the rollout when gymweb refused it (``RefusedBody``), else None. ``agent_url``/``env_url``:
    the base URLs this rollout was driven against. ``verify_accepted``: on success, whether NeMo
    Gym's verify-response model takes ``verify_response`` whole (``nemo_request.verify_refusal`` is
    None, echoed params included). Times in ms.
    """

    ok: bool
    reward: float | None = None
    verify_response: dict[str, Any] | None = None
    verify_accepted: bool | None = None
    response: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    failure_kind: str | None = None
    error: str | None = None
    nemo_error: str | None = None
    terminal: bool = False
    num_agent_calls: int = 0
    num_tool_calls: int = 0
    seed_ms: float | None = None
    verify_ms: float | None = None
    total_ms: float = 0.0
    warnings: list[str] = field(default_factory=list)
    refused_reply: RefusedBody | None = None
    agent_url: str | None = None
    env_url: str | None = None


class InvalidBaseURL(ValueError):
    """A base URL breaks rule 13. The message never echoes embedded credentials."""


def _mask_credentials(text: str) -> str:
    """``text`` with anything that may be a credential (up to the last ``@``) masked, for messages."""
    if "@" not in text:
        return text
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    masked = "***@" + rest.rsplit("@", 1)[-1]
    return f"{scheme}://{masked}" if sep else masked


_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


def _host_problem(host: str, text: str) -> str | None:
    """Why a URL's host cannot be used the same way by a form and by a worker, or None.

    IP addresses must be written canonically (``127.0.0.1``, not ``2130706433``, ``0177.0.0.1``,
    ``127.1`` or ``127.0.0.1.``): the legacy spellings that the C resolver accepts are read
    differently by the HTTP clients, so one is refused where the other would be accepted. Names
    must be IDNA-encodable to ASCII labels; a ``%`` (zone index or escape) is refused."""
    if "%" in host or "%" in text.split("//", 1)[-1].split("/", 1)[0]:
        return "has a '%' in its host, which is not accepted (no zone index or escape)"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "has a host that is not a valid IPv6 address"
        return None
    addr = parse_ip(host)
    if addr is not None:
        canonical = str(addr)
        if canonical != host:
            return f"spells the IP address {host!r} in a legacy form; write it as {canonical}"
        return None
    try:
        ascii_name = host.rstrip(".").encode("idna").decode("ascii")
    except (UnicodeError, ValueError):
        return f"has a host name {host!r} that is not a valid (IDNA) host name"
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        return f"has a host name {host!r} that is not a valid host name (letters, digits, '-', '_' and dots)"
    return None


def validate_base_url(url: str, what: str = "agent_base_url") -> str:
    """Check and normalise a service base URL (contract rule 13, DESIGN.md).

    Returns the URL without its trailing slash. Raises ``InvalidBaseURL`` when it is not an
    absolute http(s) URL with a host, or carries a query, a fragment or credentials (the message
    then shows the URL with the credentials masked).
    """
    text = (url or "").strip()
    shown = _mask_credentials(text)  # a password may hold '/', '#' or '?': never echo raw text
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        detail = f"{exc}; " if "@" not in text else ""
        raise InvalidBaseURL(f"{what} is not a valid URL ({detail}got {shown!r})") from None
    del port
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[-1]
        raise InvalidBaseURL(
            f"{what} must not embed credentials (got {parts.scheme}://***@{host}{parts.path}); "
            "gymweb sends no credential to the service"
        )
    if parts.scheme not in ("http", "https"):
        raise InvalidBaseURL(f"{what} must be an absolute http:// or https:// URL (got {shown!r})")
    if not parts.hostname:
        raise InvalidBaseURL(f"{what} has no host (got {shown!r})")
    host_problem = _host_problem(parts.hostname, text)
    if host_problem:
        raise InvalidBaseURL(f"{what} {host_problem} (got {shown!r})")
    if parts.query or text.endswith("?"):
        raise InvalidBaseURL(f"{what} must not have a query string (got {shown!r})")
    if parts.fragment or "#" in text:
        raise InvalidBaseURL(f"{what} must not have a fragment (got {shown!r})")
    return text.rstrip("/")


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= BODY_EXCERPT_CHARS else text[:BODY_EXCERPT_CHARS] + "…"


def _redirect_message(status: int, url: str, location: str | None) -> str:
    """The failure message of a redirect (rule 1): where it pointed, resolved against ``url`` (the
    request's URL), and which setting to change: gymweb's agent URL, NeMo Gym's ``agent_base_url``."""
    fix = "point the agent URL (NeMo Gym's agent_base_url) at the final address"
    if not location:
        return (
            f"the agent service answered HTTP {status} redirecting without a Location header; "
            "redirects are never followed"
        )
    resolved = urljoin(url, location.strip())
    shown = resolved if resolved == location else f"{resolved} (Location: {_excerpt(location)})"
    if resolved.endswith("/v1/responses"):
        fix += f", {resolved[: -len('/v1/responses')]}"
    return f"the agent service answered HTTP {status} redirecting to {shown}; redirects are never followed: {fix}"


def _agent_nemo(response: RawReply, validation_text: str | None = None) -> str | None:
    """NeMo Gym's text for an agent reply gymweb refused (``nemo_errors.agent_reply``)."""
    return nemo_errors.agent_reply(
        response.status_code, response.headers.get("location"), response.content or b"", validation_text
    )


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


# Stands for the input list while the rest of an agent request is serialised (``_agent_body``).
_INPUT_MARK = "\x00gymweb-input-" + uuid.uuid4().hex


class _Rollout:
    """State of one rollout: its two cookie jars, the conversation and the merged output."""

    def __init__(
        self,
        client: LoopClient,
        row: dict[str, Any],
        settings: LoopSettings,
        observer: Observer,
        gate: EnvGate | None = None,
    ):
        self.client = client
        self.row = row
        self.s = settings
        self.obs = observer
        self.gate = gate
        self.started = time.monotonic()  # the env gate's priority: the oldest rollout's call goes first
        self.env_jar = SessionJar()
        self.agent_jar = SessionJar()
        # What NeMo Gym's remote_agent sends: the agent gets the params it was given, the env the
        # materialised record (``nemo_request``).
        params = nemo_request.as_sent(dict(row.get("responses_create_params") or {}))
        self.params = params
        self.input: list[Any] = nemo_request.sent_input(params)  # a string input as one message (rule 7)
        self.record = nemo_request.run_record(row)
        # The conversation is re-sent on every agent call; each item is serialised once and the
        # body joined from the pieces (byte for byte what ``_dumps`` of the whole would give), so
        # step k costs a join of k pieces, not a json.dumps of the whole conversation.
        self._input_parts: list[bytes] = []
        self._input_sent = 0  # items of ``input`` already in ``_input_parts``
        self._body_ends: tuple[bytes, bytes] | None = None
        self.merged: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.usage_seen = False
        self.replies = 0  # valid replies received
        self.last_reply: dict[str, Any] | None = None
        self.agent_calls = 0
        self.tool_calls = 0
        self.outcome = RolloutOutcome(ok=False)

    # -- env ---------------------------------------------------------------------------------
    async def _post(
        self, url: str, body: bytes, jar: SessionJar, party: str, timeout_s: float | None = None
    ) -> RawReply:
        """POST ``body`` to ``url`` with one party's cookies and read the whole reply, with the
        connection attempts of the rollout's settings (rules 11, 12, 15; ``LoopClient.post_with_attempts``).
        Raises ``Failure``."""
        hint = (
            f"Is your service running at {self.s.agent_base_url}?"
            if party == "agent"
            else f"Is your resources server running at {self.s.env_base_url}?"
        )
        return await self.client.post_with_attempts(
            url,
            body,
            jar,
            who="the agent service" if party == "agent" else "the environment",
            attempts=self.s.connect_attempts,
            pause_s=self.s.retry_pause_s,
            hint=hint,
            timeout_s=timeout_s,
            budget_s=self.s.connect_retry_budget_s,
        )

    async def _post_env(self, route: str, payload: Any) -> RawReply:
        """POST to the env with its cookies (rule 15), bounded only by the rollout's own timeout.
        Raises ``Failure`` on a dead env; the caller names the failure kind. With an env gate, the
        call waits for its turn first (``env_gate``)."""
        body = _dumps(payload)
        if self.gate is None:
            return await self._post(f"{self.s.env_base_url}/{route}", body, self.env_jar, "env")
        async with self.gate.turn(self.s.env_base_url, self.started, self.s.env_max_in_flight):
            return await self._post(f"{self.s.env_base_url}/{route}", body, self.env_jar, "env")

    def _env_nemo(self, exc: Failure) -> str | None:
        """NeMo Gym's text for an env call that failed in the transport: its client retries an
        internal call until the rollout's run bound ends it (``nemo_errors.run_timeout``)."""
        return nemo_errors.run_timeout(self.s.run_timeout_s) if exc.kind in (UNREACHABLE, NOT_HTTP) else None

    def _env_status_nemo(self, route: str, response: RawReply) -> str:
        return nemo_errors.env_status(route, response.status_code, response.reason, f"{self.s.env_base_url}/{route}")

    async def seed(self) -> None:
        started = time.perf_counter()
        try:
            response = await self._post_env("seed_session", self.record)
        except Failure as exc:
            raise Failure(
                kind_for_step(exc, FailureKind.SEED_FAILED), f"seed_session failed: {exc.message}", self._env_nemo(exc)
            ) from None
        if not response.is_success:
            raise Failure(
                FailureKind.SEED_FAILED,
                f"seed_session failed: the environment answered HTTP {response.status_code}: {_excerpt(response.text)}",
                self._env_status_nemo("seed_session", response),
            )
        self.outcome.seed_ms = (time.perf_counter() - started) * 1000
        self.obs.on_seeded(self.outcome.seed_ms)

    async def run_tool(self, call: dict[str, Any], step: int) -> ItemRecord:
        """Execute one ask against the env (rules 5, 6, 15); returns the gym's output record."""
        name = call.get("name", "")
        record = ItemRecord(seq=-1, step=step, item={}, origin="gym")
        args, refusal = refused_tool_output(name, call.get("arguments", ""))
        if refusal is not None:
            output = refusal
            record.refused = True
        else:
            started = time.perf_counter()
            try:
                response = await self._post_env(name, args)
            except Failure as exc:
                raise Failure(
                    kind_for_step(exc, FailureKind.TOOL_TRANSPORT_FAILED),
                    f"tool call {name!r} failed: {exc.message}",
                    self._env_nemo(exc),
                ) from None
            record.latency_ms = (time.perf_counter() - started) * 1000
            record.tool_status = response.status_code
            # Any status: the body text is the call's output and the rollout goes on (rules 5, 15).
            output = response.text
            self.tool_calls += 1
        record.item = nemo_request.function_call_output(call["call_id"], output)
        return record

    async def verify(self) -> None:
        body = dict(self.record)
        body["response"] = nemo_request.materialize_response(self.merged_response())
        started = time.perf_counter()
        try:
            response = await self._post_env("verify", body)
        except Failure as exc:
            raise Failure(
                kind_for_step(exc, FailureKind.VERIFY_FAILED), f"verify failed: {exc.message}", self._env_nemo(exc)
            ) from None
        self.outcome.verify_ms = (time.perf_counter() - started) * 1000
        if not response.is_success:
            raise Failure(
                FailureKind.VERIFY_FAILED,
                f"verify failed: the environment answered HTTP {response.status_code}: {_excerpt(response.text)}",
                self._env_status_nemo("verify", response),
            )
        # NeMo Gym's remote_agent reads the reply with orjson and validates it with its verify-response
        # model (lax: ``true`` and ``"0.5"`` are rewards); its run() catches either refusal and writes a
        # failure row (rule 15) whose ``error`` is its own text, which the message here is.
        try:
            data = strict_loads(response.content)
        except NotJSON as exc:
            nemo_text = nemo_request.verify_json_error(response.content)
            raise Failure(
                FailureKind.VERIFY_FAILED,
                nemo_text
                or f"verify failed: the reply is not JSON gymweb can store ({exc}): {_excerpt(response.text)}",
            ) from None
        # (a task whose own params that model refuses is not held against the env's echo of them)
        own_refusal = nemo_request.params_refusal(self.record.get("responses_create_params"))
        if nemo_request.verify_refusal(data, check_params=own_refusal is None) is not None:
            raise Failure(FailureKind.VERIFY_FAILED, nemo_request.verify_refusal_error(data, own_refusal is None))
        reward = nemo_request.verify_reward(data)
        if not math.isfinite(reward):
            raise Failure(
                FailureKind.VERIFY_FAILED,
                f"verify failed: the reward is not a finite number (got {json.dumps(data.get('reward'))[:100]})",
            )
        self.outcome.reward = reward
        self.outcome.verify_response = data
        # All of NeMo Gym's model but the echoed params has passed above: check those too (when
        # the task's own were not), so the writer's ``agent_result`` need not validate it all again.
        self.outcome.verify_accepted = (
            own_refusal is None or nemo_request.params_refusal(data["responses_create_params"]) is None
        )

    # -- agent -------------------------------------------------------------------------------
    async def call_agent(self) -> tuple[dict[str, Any], StepRecord]:
        """One agent call (rules 1, 2, 3, 11, 12). Returns the raw reply dict and its step record."""
        index = self.agent_calls
        self.agent_calls += 1
        step = StepRecord(index=index, started_at=time.time(), latency_ms=0.0)
        started = time.perf_counter()
        body = self._agent_body()
        url = f"{self.s.agent_base_url}/v1/responses"
        timeout = self.s.remote_responses_timeout_s
        try:
            try:
                response = await self._post(url, body, self.agent_jar, "agent", timeout)
            except Failure as exc:
                if exc.kind == TIMEOUT:
                    raise Failure(
                        FailureKind.AGENT_TIMEOUT,
                        f"the agent service did not answer within {timeout:g} s "
                        f"(remote_responses_timeout_s; NeMo Gym's remote_responses_timeout_secs) at {url}",
                        nemo_errors.agent_timeout(timeout),
                    ) from None
                if exc.kind in OWN_KINDS:
                    raise
                if exc.kind == UNREACHABLE:
                    nemo = nemo_errors.agent_unreachable(exc.attempts, exc.cause, self.s.agent_base_url)
                    raise Failure(FailureKind.AGENT_UNREACHABLE, exc.message, nemo) from None
                nemo = nemo_errors.agent_transport(exc.cause) if exc.cause is not None else None
                raise Failure(FailureKind.AGENT_HTTP_ERROR, exc.message, nemo) from None
            step.http_status = response.status_code
            if 300 <= response.status_code < 400:  # rule 1
                self._keep_refused(response)
                raise Failure(
                    FailureKind.AGENT_REDIRECT,
                    _redirect_message(response.status_code, url, response.headers.get("location")),
                    _agent_nemo(response),
                )
            if not response.is_success:  # rule 2
                self._keep_refused(response)
                raise Failure(
                    FailureKind.AGENT_HTTP_ERROR,
                    f"the agent service answered HTTP {response.status_code}: {_excerpt(response.text)}",
                    _agent_nemo(response),
                )
            try:
                data = strict_loads(response.content)
            except NotJSON as exc:
                self._keep_refused(response)
                raise Failure(
                    FailureKind.AGENT_BAD_JSON,
                    f"the agent service's reply is not JSON ({exc}): {_excerpt(response.text)}",
                    _agent_nemo(response),
                ) from None
            if not isinstance(data, dict):
                self._keep_refused(response)
                raise Failure(
                    FailureKind.AGENT_BAD_JSON,
                    f"the agent service's reply is JSON but not an object ({type(data).__name__}): "
                    f"{_excerpt(response.text)}",
                    _agent_nemo(response),
                )
            try:
                parse_reply(data)  # rule 3
            except InvalidReply as exc:
                self._keep_refused(response, exc.errors)
                raise Failure(
                    FailureKind.AGENT_INVALID_RESPONSE,
                    f"the agent service returned an invalid Responses API object: {exc}",
                    _agent_nemo(response, exc.validation_text),
                ) from None
            self.replies += 1
            return data, step
        except Failure as exc:
            step.error = exc.message
            raise
        finally:
            step.latency_ms = (time.perf_counter() - started) * 1000
            if step.error is not None:
                self.obs.on_step(step, [])

    def _keep_refused(self, response: Any, errors: Sequence[dict[str, Any]] | None = None) -> None:
        """Keep the reply being refused (up to ``refused_reply_max_bytes``) on the outcome."""
        content = response.content or b""
        cap = max(0, self.s.refused_reply_max_bytes)
        self.outcome.refused_reply = RefusedBody(
            status=response.status_code,
            content_type=str(response.headers.get("content-type") or "")[:200],
            body=content[:cap],
            size=len(content),
            truncated=len(content) > cap,
            errors=list(errors or []),
        )

    def _agent_body(self) -> bytes:
        """``_dumps({**params, "input": self.input})`` (the key order of the row's params kept),
        serialising only the items added since the last call."""
        if self._body_ends is None:
            params = dict(self.params)
            params["input"] = _INPUT_MARK
            head, mark, tail = _dumps(params).partition(_dumps(_INPUT_MARK))
            self._body_ends = (head, tail) if mark else None
            if not mark:  # cannot happen (the mark is a fresh string); stay correct anyway
                params["input"] = self.input
                return _dumps(params)
        # ``parts`` holds the items with their commas between ([i0, b",", i1, ...]): the body is
        # built by one join, so a long conversation is copied once per call, not twice.
        parts = self._input_parts
        for item in self.input[self._input_sent :]:
            if parts:
                parts.append(b",")
            parts.append(_dumps(item))
        self._input_sent = len(self.input)
        head, tail = self._body_ends
        return b"".join((head, b"[", *parts, b"]", tail))

    # -- the loop ----------------------------------------------------------------------------
    def merged_response(self) -> dict[str, Any] | None:
        """The last reply with every item of every step and the summed usage (rule 9)."""
        if self.last_reply is None:
            return None
        merged = dict(self.last_reply)
        merged["output"] = list(self.merged)
        merged["usage"] = self.usage
        return merged

    async def drive(self) -> None:
        await self.seed()
        max_steps = self.s.max_steps or 0
        while True:
            reply, step = await self.call_agent()
            self.last_reply = reply
            output: list[dict[str, Any]] = reply.get("output") or []
            if reply.get("usage") is not None:
                self.usage_seen = True
                self.usage = add_usage(self.usage, reply["usage"])  # rule 8
            asks = find_asks(output)
            ask_ids = {id(a) for a in asks}
            answered = {i.get("call_id") for i in output if i.get("type") == "function_call_output"}
            step.response_id = reply.get("id")
            step.model = reply.get("model")
            step.usage = reply.get("usage")
            step.incomplete_details = reply.get("incomplete_details")
            step.num_asks = len(asks)
            records = []
            for item in output:
                kind = item.get("type")
                records.append(
                    ItemRecord(
                        seq=len(self.merged),
                        step=step.index,
                        item=item,
                        origin="agent",
                        asked=kind == "function_call" and id(item) in ask_ids,
                        paired=(kind == "function_call" and item.get("call_id") in answered)
                        or kind == "function_call_output",
                    )
                )
                self.merged.append(item)
            self.input.extend(nemo_request.sent_item(item) for item in output)
            self.obs.on_step(step, records)

            # A reply with incomplete_details ends the loop before its asks run: they stay in the
            # trajectory unanswered, as NeMo Gym's remote_agent leaves them (rule 10).
            if reply.get("incomplete_details"):
                break
            # Asks run even when this is the last step by max_steps (rule 10); one at a time, in
            # order, because they share the env session and their order is the agent's intent.
            for call in asks:
                record = await self.run_tool(call, step.index)
                record.seq = len(self.merged)
                self.merged.append(record.item)
                self.input.append(record.item)
                self.obs.on_items([record])

            if not asks and has_assistant_message(output):
                break
            if max_steps and self.agent_calls >= max_steps:
                break
        await self.verify()


async def run_rollout(
    client: LoopClient,
    row: dict[str, Any],
    settings: LoopSettings,
    observer: Observer | None = None,
    gate: EnvGate | None = None,
) -> RolloutOutcome:
    """Run one rollout of ``row`` (a materialised task row with ``responses_create_params``).

    The whole rollout (seed to verify) is bounded by ``settings.run_timeout_s`` (rule 12); the
    caller starts the clock only once a concurrency slot is free. ``gate``: the worker process's
    bound on calls in flight to one env (``env_gate.EnvGate``; None: no bound). Never raises for failures of the
    agent or the env: they come back as an outcome with ``failure_kind`` and ``error``. Raises
    ``asyncio.CancelledError`` when cancelled.
    """
    started = time.perf_counter()
    try:
        rollout = _Rollout(client, row, settings, observer or _NullObserver(), gate)
    except Exception as exc:  # a row the loop cannot use is a failure of this rollout, not a crash
        return RolloutOutcome(
            ok=False,
            failure_kind=FailureKind.INTERNAL_ERROR,
            error=f"gymweb could not start this rollout from its row: {exc.__class__.__name__}: {exc}",
            total_ms=(time.perf_counter() - started) * 1000,
            agent_url=settings.agent_base_url,
            env_url=settings.env_base_url,
        )
    outcome = rollout.outcome
    outcome.agent_url, outcome.env_url = settings.agent_base_url, settings.env_base_url
    try:
        async with asyncio.timeout(settings.run_timeout_s):
            await rollout.drive()
        outcome.ok = True
    except Failure as exc:
        outcome.failure_kind = exc.kind
        outcome.error = exc.message
        outcome.nemo_error = exc.nemo
    except TimeoutError:
        outcome.failure_kind = FailureKind.ROLLOUT_TIMEOUT
        outcome.error = (
            f"the rollout did not finish within {settings.run_timeout_s:g} s "
            "(run_timeout_s; NeMo Gym's run_timeout_secs)"
        )
        outcome.nemo_error = nemo_errors.run_timeout(settings.run_timeout_s)
    except Exception as exc:  # a gymweb bug must still end as data, never crash the run
        outcome.failure_kind = FailureKind.INTERNAL_ERROR
        outcome.error = f"gymweb internal error: {exc.__class__.__name__}: {exc}"
        outcome.nemo_error = nemo_errors.internal_error(exc)
    outcome.terminal = outcome.failure_kind in FailureKind.TERMINAL
    outcome.usage = rollout.usage
    if not rollout.usage_seen and rollout.replies:  # only where a reply arrived, and none had usage
        outcome.warnings.append("the agent service reported no usage; token metrics are empty")
    if not outcome.ok:
        outcome.reward = None
        outcome.verify_response = None
        outcome.verify_accepted = None
    outcome.response = rollout.merged_response()
    outcome.num_agent_calls = rollout.agent_calls
    outcome.num_tool_calls = rollout.tool_calls
    outcome.total_ms = (time.perf_counter() - started) * 1000
    return outcome
