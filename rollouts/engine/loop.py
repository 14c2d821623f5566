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
import errno
import http.cookiejar
import ipaddress
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from rollouts.engine import nemo_request
from rollouts.engine.budget import ReplyBudget, ReplyOverBudget
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
from rollouts.engine.targets import (
    DEFAULT_MAX_REPLY_BYTES,
    PolicyAsyncTransport,
    PolicyResolver,
    ReplyTooLarge,
    TargetPolicy,
    find_refusal,
    find_too_large,
    parse_ip,
)

__all__ = [
    "FailureKind",
    "LoopSettings",
    "Observer",
    "RolloutOutcome",
    "StepRecord",
    "ItemRecord",
    "LoopClient",
    "RawReply",
    "RefusedBody",
    "make_client",
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


class FailureKind:
    """gymweb's finer failure classification (DESIGN.md, "Failure rows"). Values are stable strings."""

    AGENT_UNREACHABLE = "agent_unreachable"
    AGENT_TIMEOUT = "agent_timeout"
    AGENT_HTTP_ERROR = "agent_http_error"
    AGENT_REDIRECT = "agent_redirect"
    AGENT_BAD_JSON = "agent_bad_json"
    AGENT_INVALID_RESPONSE = "agent_invalid_response"
    SEED_FAILED = "seed_failed"
    TOOL_TRANSPORT_FAILED = "tool_transport_failed"
    VERIFY_FAILED = "verify_failed"
    ROLLOUT_TIMEOUT = "rollout_timeout"
    INTERNAL_ERROR = "internal_error"
    # The target policy refused to connect to the agent or the env (rollouts.engine.targets).
    TARGET_REFUSED = "target_refused"
    # A reply of the agent or the env was larger than GYMWEB_MAX_REPLY_BYTES.
    REPLY_TOO_LARGE = "reply_too_large"
    # The replies being read at once in the worker passed GYMWEB_REPLY_BUDGET_BYTES (not terminal).
    REPLY_OVER_BUDGET = "reply_over_budget"
    # Set by the dispatcher, never by the loop: part of the attempt could not be stored.
    STORAGE_FAILED = "storage_failed"

    ALL = (
        AGENT_UNREACHABLE,
        AGENT_TIMEOUT,
        AGENT_HTTP_ERROR,
        AGENT_REDIRECT,
        AGENT_BAD_JSON,
        AGENT_INVALID_RESPONSE,
        SEED_FAILED,
        TOOL_TRANSPORT_FAILED,
        VERIFY_FAILED,
        ROLLOUT_TIMEOUT,
        INTERNAL_ERROR,
        STORAGE_FAILED,
        TARGET_REFUSED,
        REPLY_TOO_LARGE,
        REPLY_OVER_BUDGET,
    )
    # Only an invalid Responses object is terminal: retrying cannot fix it (rule 3).
    TERMINAL = frozenset({AGENT_INVALID_RESPONSE})


@dataclass(frozen=True)
class LoopSettings:
    """What one rollout needs to know about its run.

    ``agent_base_url`` and ``env_base_url`` are absolute http(s) URLs without a trailing slash
    (see ``validate_base_url``). ``max_steps``: agent calls per rollout, None or 0 = unbounded
    (rule 10). Timeouts in seconds (rule 12). ``retry_pause_s``: pause between connection attempts
    (rule 11).
    """

    agent_base_url: str
    env_base_url: str
    max_steps: int | None = None
    remote_responses_timeout_s: float = DEFAULT_REMOTE_RESPONSES_TIMEOUT_S
    run_timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    connect_attempts: int = CONNECT_ATTEMPTS
    retry_pause_s: float = 0.5
    refused_reply_max_bytes: int = DEFAULT_REFUSED_REPLY_MAX_BYTES


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
    (a ``FailureKind`` value), ``error`` (the explained message), ``terminal``; ``response`` holds
    the partial merged response when at least one agent reply came. ``usage`` is the summed usage
    (rule 8) or None when the agent never reported any. ``refused_reply``: the agent reply that
    ended the rollout when gymweb refused it (``RefusedBody``), else None. ``agent_url``/``env_url``:
    the base URLs this rollout was driven against. Times in ms.
    """

    ok: bool
    reward: float | None = None
    verify_response: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    failure_kind: str | None = None
    error: str | None = None
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


class _Failure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def _kind(exc: _Failure, default: str) -> str:
    """The failure kind for a failed env call: its own kind when the target policy or the reply
    cap ended it, else ``default`` (the step's kind)."""
    return exc.kind if exc.kind in _OWN_KINDS else default


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


class _NoCookies(http.cookiejar.CookieJar):
    """A jar that never stores anything: cookies live in each rollout's own jars, never in the
    shared client, whose jar would not be scoped by port (DESIGN.md, known pitfalls)."""

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:  # noqa: D102
        return None

    def extract_cookies(self, response: Any, request: Any) -> None:  # noqa: D102
        return None


class LoopClient(httpx.AsyncClient):
    """The loop's shared client: an ``httpx.AsyncClient`` over the policy-wrapped aiohttp
    transport that also lends its aiohttp session to the loop's own calls (``post_bytes``).

    ``post_bytes`` skips httpx's request and response models (URL merging, auth and redirect
    machinery, header models, the byte-stream iterator), which cost CPU on every call (see
    benchmarks/README.md). It keeps everything the transport chain does: the
    target policy (IP-literal hosts judged before connecting, with the transport's own cache of
    passed (host, port) pairs; names judged by the connector's ``PolicyResolver``), the reply cap
    (``ReplyTooLarge`` from the declared length or the running count), the same headers httpx
    sends (the client's defaults: accept, accept-encoding, connection, user-agent), a
    ``Content-Encoding`` decoded by httpx's own decoders, and the same httpx errors for the same
    aiohttp errors (``httpx_aiohttp``'s map), so the loop's rules 11 and 14 behave as through
    ``post``.
    """

    def __init__(
        self,
        transport: PolicyAsyncTransport,
        aiohttp_transport: AiohttpTransport,
        budget: ReplyBudget | None = None,
        **kwargs: Any,
    ):
        super().__init__(transport=transport, **kwargs)
        self.budget = budget if budget is not None else ReplyBudget(None)
        self._policy_transport = transport
        self._aiohttp_transport = aiohttp_transport
        self._base_headers = {k.lower(): v for k, v in self.headers.items()}
        self._keys: dict[str, tuple[str, int]] = {}  # scheme://netloc -> (host, port) as httpx reads them

    def _session(self) -> aiohttp.ClientSession:
        t = self._aiohttp_transport
        if not isinstance(t.client, aiohttp.ClientSession):
            t.client = t.get_client()  # what the transport itself does on its first request
        return t.client

    def _check_target(self, url: str) -> None:
        origin = url[: url.find("/", url.find("//") + 2)] if url.count("/") > 2 else url
        key = self._keys.get(origin)
        if key is None:
            parsed = httpx.URL(url)
            key = (parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80))
            if len(self._keys) > 4096:
                self._keys.clear()
            self._keys[origin] = key
        pt = self._policy_transport
        if key not in pt._passed:
            pt.policy.check_literal(*key)  # raises TargetRefused
            if len(pt._passed) > 4096:
                pt._passed.clear()
            pt._passed.add(key)

    async def post_bytes(self, url: str, body: bytes, headers: dict[str, str]) -> RawReply:
        """POST ``body`` to ``url`` and read the whole reply. Raises ``targets.TargetRefused``
        (policy), ``targets.ReplyTooLarge`` (cap), the ``httpx.HTTPError`` subclasses the transport
        maps aiohttp's errors to (connection refused/reset/dropped: ``ConnectError``,
        ``ConnectTimeout`` or ``ReadError``; a resolver refusal stays in the cause chain, as
        ``targets.find_refusal`` reads it), or an unmapped ``aiohttp.ClientError`` when the peer does
        not speak HTTP; ``budget.ReplyOverBudget`` when the replies being read at once in this
        process pass the client's budget. Never follows redirects; sets no timeout (the caller bounds it)."""
        self._check_target(url)
        limit = self._policy_transport.max_reply_bytes
        sent = {**self._base_headers, **headers}
        with map_aiohttp_exceptions():
            async with self._session().request(
                "POST",
                url,
                data=body,
                headers=sent,
                allow_redirects=False,
                auto_decompress=False,
                compress=False,
                timeout=_NO_TIMEOUT,
            ) as resp:
                length = resp.headers.get("content-length", "")
                if length.isdigit() and int(length) > limit:
                    raise ReplyTooLarge(url, limit)
                chunks, seen = [], 0
                budget = self.budget
                try:
                    async for chunk in resp.content.iter_any():
                        seen += len(chunk)
                        if seen > limit:
                            raise ReplyTooLarge(url, limit)
                        if not budget.take(len(chunk)):
                            seen -= len(chunk)
                            raise ReplyOverBudget(url, budget.limit or 0)
                        chunks.append(chunk)
                finally:
                    budget.give(seen)
                status, raw_headers = resp.status, resp.headers
        return RawReply(status, raw_headers, chunks[0] if len(chunks) == 1 else b"".join(chunks))


_NO_TIMEOUT = aiohttp.ClientTimeout()  # every field None: the loop bounds each call itself (rule 12)


class RawReply:
    """A whole HTTP reply read by ``LoopClient.post_bytes``, with the parts of ``httpx.Response``
    the loop reads: ``status_code``, ``is_success``, ``headers`` (case-insensitive ``get``;
    ``get_list`` for repeated headers), ``content`` (bytes, ``Content-Encoding`` decoded as httpx
    decodes it; a bad encoding raises ``httpx.DecodingError``) and ``text`` (decoded by the
    ``Content-Type`` charset, else UTF-8, bad bytes replaced: httpx's rule)."""

    __slots__ = ("status_code", "headers", "content", "_text")

    def __init__(self, status: int, headers: Any, content: bytes):
        self.status_code = status
        self.headers = _Headers(headers)
        self._text: str | None = None
        encoding = headers.get("content-encoding")
        if encoding and encoding.strip().lower() != "identity":
            decoded = httpx.Response(status, headers=list(headers.items()), stream=httpx.ByteStream(content))
            decoded.read()  # httpx's own decoders (gzip, deflate, br, zstd), its errors
            content = decoded.content
        self.content = content

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        if self._text is None:
            ctype = self.headers.get("content-type") or ""
            if "charset" in ctype.lower():  # rare: let httpx read the charset exactly as it does
                self._text = httpx.Response(
                    self.status_code, headers={"content-type": ctype}, content=self.content
                ).text
            else:
                self._text = self.content.decode("utf-8", errors="replace")
        return self._text


class _Headers:
    """aiohttp's case-insensitive multidict with httpx's ``get_list``."""

    __slots__ = ("_h",)

    def __init__(self, h: Any):
        self._h = h

    def get(self, key: str, default: Any = None) -> Any:
        return self._h.get(key, default)

    def get_list(self, key: str) -> list[str]:
        return list(self._h.getall(key, ()))

    def __getitem__(self, key: str) -> str:
        return self._h[key]

    def __contains__(self, key: object) -> bool:
        return key in self._h


def make_client(
    concurrency: int = DEFAULT_CONCURRENCY,
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    reply_budget_bytes: int | None = None,
) -> LoopClient:
    """One shared HTTP client for a worker process: httpx over the aiohttp transport (a
    ``LoopClient``, whose ``post_bytes`` the loop uses).

    The connection pool is sized for ``concurrency`` in-flight rollouts (agent + env connections;
    aiohttp's default cap of 100 would throttle a larger run). Neither httpx nor aiohttp keeps
    cookies, reads proxy variables (rule 14) or follows redirects (rule 1); no client-side timeout
    is set because the loop bounds every call itself (rule 12). Must be created and used inside a
    running event loop; close it with ``await client.aclose()``.

    ``policy``: the target policy enforced on every connection (``rollouts.engine.targets``: the
    connector's resolver drops refused addresses, IP-literal hosts are judged before connecting);
    None means the strict default ``TargetPolicy()`` (public addresses only). Refusals raise
    ``targets.TargetRefused``. ``max_reply_bytes``: every reply body is counted as it streams and
    refused past this many bytes (``targets.ReplyTooLarge``). ``reply_budget_bytes``: the bytes all
    replies being read at once may hold together (``budget.ReplyBudget``; None: unbounded).
    """
    limit = max(4, 2 * int(concurrency) + 8)
    policy = policy if policy is not None else TargetPolicy()

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limit, limit_per_host=0, ttl_dns_cache=300, resolver=PolicyResolver(policy)
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=False,
            timeout=_NO_TIMEOUT,
        )

    inner = AiohttpTransport(client=session, trust_env=False)
    transport = PolicyAsyncTransport(inner, policy, max_reply_bytes)
    return LoopClient(
        transport,
        inner,
        budget=ReplyBudget(reply_budget_bytes),
        trust_env=False,
        follow_redirects=False,
        timeout=None,
        cookies=_NoCookies(),
    )


class SessionJar:
    """One party's cookies for one rollout: name → value, kept up to date from every reply
    (``update``), sent back as one ``Cookie`` header (``headers``). DESIGN.md, "Cookies"."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def update(self, response: Any) -> None:
        """Take the ``Set-Cookie`` headers of ``response`` (an ``httpx.Response`` or a ``RawReply``)."""
        for header in response.headers.get_list("set-cookie"):
            first, _, attrs = header.partition(";")
            name, eq, value = first.partition("=")
            name = name.strip()
            if not eq or not name:
                continue
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if _expired(attrs):
                self.values.pop(name, None)
            else:
                self.values[name] = value

    def headers(self) -> dict[str, str]:
        if not self.values:
            return _JSON_HEADERS
        cookie = "; ".join(f"{k}={v}" for k, v in self.values.items())
        return {**_JSON_HEADERS, "cookie": cookie}


_JSON_HEADERS = {"content-type": "application/json"}


def _expired(attrs: str) -> bool:
    for attr in attrs.split(";"):
        key, _, val = attr.partition("=")
        key = key.strip().lower()
        if key == "max-age":
            try:
                return int(val.strip()) <= 0
            except ValueError:
                return False
        if key == "expires":
            try:
                return http.cookiejar.http2time(val.strip()) < time.time()  # type: ignore[attr-defined,operator]
            except TypeError:
                return False
    return False


# Errors that mean "refused, reset or dropped before a reply" (rule 11). With the aiohttp transport
# a reset or dropped connection surfaces as httpx.ConnectTimeout (aiohttp's ClientConnectionError
# family); the loop sets no client timeouts, so that class here never means a real timeout.
_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.CloseError,
)


# Any other transport error means the peer answered with something that is not HTTP (for example
# aiohttp's "Bad status line", raised unmapped through the httpx-aiohttp transport). Without this a
# service speaking another protocol ended as gymweb's own "internal_error".
_PROTOCOL_ERRORS = (httpx.HTTPError, aiohttp.ClientError)


def _describe_exc(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    inner = cause if isinstance(cause, aiohttp.ClientError) else exc
    text = str(inner) or inner.__class__.__name__
    return f"{inner.__class__.__name__}: {text}"


def _policy_failure(exc: BaseException, who: str, url: str) -> _Failure | None:
    """A ``_Failure`` of kind ``target_refused`` or ``reply_too_large`` when ``exc`` is (or was
    caused by) the target policy's refusal or the reply cap, else None."""
    refused = find_refusal(exc)
    if refused is not None:
        return _Failure(FailureKind.TARGET_REFUSED, f"gymweb did not connect to {who} at {url}: {refused}")
    too_large = find_too_large(exc)
    if isinstance(too_large, ReplyOverBudget):
        return _Failure(
            FailureKind.REPLY_OVER_BUDGET, f"{who} at {url}: {too_large.args[0]}; the rollout can run again"
        )
    if too_large is not None:
        return _Failure(
            FailureKind.REPLY_TOO_LARGE,
            f"{who} at {url} sent a reply larger than {too_large.limit:,} bytes "
            f"(GYMWEB_MAX_REPLY_BYTES); gymweb stopped reading it",
        )
    return None


_OWN_KINDS = (FailureKind.TARGET_REFUSED, FailureKind.REPLY_TOO_LARGE, FailureKind.REPLY_OVER_BUDGET)


# Connection tries that failed because this process had no file descriptor left, waited out (a
# pause of ``retry_pause_s`` each) before they count as attempts: at thousands in flight the agent
# and env connections can pass the open-file limit for a moment.
OUT_OF_FILES_WAITS = 60


def _out_of_files(exc: BaseException | None) -> bool:
    """True when ``exc`` or an exception in its cause chain is this process running out of file
    descriptors (EMFILE/ENFILE): then the peer is not to blame and the error text says so."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= BODY_EXCERPT_CHARS else text[:BODY_EXCERPT_CHARS] + "…"


def _redirect_message(status: int, url: str, location: str | None) -> str:
    """The failure message of a redirect (rule 1): where it pointed, resolved against ``url`` (the
    request's URL), and which setting to change: gymweb's agent URL, NeMo Gym's ``agent_base_url``."""
    fix = "point the agent URL (NeMo Gym's agent_base_url) at the final address"
    if not location:
        return f"the agent service answered HTTP {status} redirecting without a Location header; redirects are never followed"
    resolved = urljoin(url, location.strip())
    shown = resolved if resolved == location else f"{resolved} (Location: {_excerpt(location)})"
    if resolved.endswith("/v1/responses"):
        fix += f", {resolved[: -len('/v1/responses')]}"
    return f"the agent service answered HTTP {status} redirecting to {shown}; redirects are never followed: {fix}"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


# Stands for the input list while the rest of an agent request is serialised (``_agent_body``).
_INPUT_MARK = "\x00gymweb-input-" + __import__("uuid").uuid4().hex


class _Rollout:
    """State of one rollout: its two cookie jars, the conversation and the merged output."""

    def __init__(self, client: httpx.AsyncClient, row: dict[str, Any], settings: LoopSettings, observer: Observer):
        self.client = client
        self.fast = isinstance(client, LoopClient)  # else any httpx.AsyncClient, through httpx
        self.row = row
        self.s = settings
        self.obs = observer
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
    ) -> httpx.Response:
        """POST ``body`` to ``url`` with one party's cookies and read the whole reply.

        Connection refused, reset or dropped before a reply: ``connect_attempts`` tries with a pause
        between, then a failure naming the URL (rule 11; rule 15 for the env); a try that failed
        because this process had no file descriptor left is waited out (up to ``OUT_OF_FILES_WAITS``
        pauses) before it counts, and the failure then names the open-file limit. A peer that answers
        with something other than HTTP fails at once. ``timeout_s`` bounds each try (rule 12; None:
        only the rollout's own timeout). Raises ``_Failure`` with kind ``unreachable``, ``not_http``
        or ``timeout``, which callers turn into their own failure kind, or with ``target_refused``
        (the client's target policy refused the host: nothing was sent, not retried) or
        ``reply_too_large`` (the reply passed the client's cap; not read on), which they keep.
        """
        who = "the agent service" if party == "agent" else "the environment"
        last: BaseException | None = None
        failed = waits = 0  # tries that failed and count as attempts; tries waited out for a descriptor
        while failed < self.s.connect_attempts:
            try:
                async with asyncio.timeout(timeout_s):
                    if self.fast:
                        response = await self.client.post_bytes(url, body, jar.headers())  # type: ignore[attr-defined]
                    else:
                        response = await self.client.post(url, content=body, headers=jar.headers())
                        await response.aread()
            except TimeoutError:
                raise _Failure("timeout", f"{who} did not answer within {timeout_s:g} s") from None
            except _PROTOCOL_ERRORS as exc:
                own = _policy_failure(exc, who, url)
                if own is not None:  # refused by the target policy or over the reply cap: not retried
                    raise own from None
                if not isinstance(exc, _CONNECTION_ERRORS):  # answered, but not with HTTP: not retried (rule 11)
                    raise _Failure(
                        "not_http", f"{who} at {url} did not answer with valid HTTP ({_describe_exc(exc)})"
                    ) from None
                last = exc
                if waits < OUT_OF_FILES_WAITS and _out_of_files(exc):
                    # gymweb's own process is out of file descriptors (thousands in flight): not the
                    # peer's fault, so wait for one to free up without spending an attempt
                    waits += 1
                else:
                    failed += 1
                if failed < self.s.connect_attempts:
                    await asyncio.sleep(self.s.retry_pause_s)
                continue
            jar.update(response)
            return response
        hint = (
            f"Is your service running at {self.s.agent_base_url}?"
            if party == "agent"
            else f"Is your resources server running at {self.s.env_base_url}?"
        )
        if _out_of_files(last):
            hint = (
                "gymweb's own process ran out of open files (each rollout in flight may hold an agent and an "
                "env connection): raise its open-file limit (`ulimit -n`) or lower the concurrency"
            )
        raise _Failure(
            "unreachable",
            f"could not reach {who} after {self.s.connect_attempts} attempts ({_describe_exc(last)}). {hint}",
        )

    async def _post_env(self, route: str, payload: Any) -> httpx.Response:
        """POST to the env with its cookies (rule 15), bounded only by the rollout's own timeout.
        Raises ``_Failure`` on a dead env; the caller names the failure kind."""
        return await self._post(f"{self.s.env_base_url}/{route}", _dumps(payload), self.env_jar, "env")

    async def seed(self) -> None:
        started = time.perf_counter()
        try:
            response = await self._post_env("seed_session", self.record)
        except _Failure as exc:
            raise _Failure(_kind(exc, FailureKind.SEED_FAILED), f"seed_session failed: {exc.message}") from None
        if not response.is_success:
            raise _Failure(
                FailureKind.SEED_FAILED,
                f"seed_session failed: the environment answered HTTP {response.status_code}: {_excerpt(response.text)}",
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
            except _Failure as exc:
                raise _Failure(
                    _kind(exc, FailureKind.TOOL_TRANSPORT_FAILED), f"tool call {name!r} failed: {exc.message}"
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
        except _Failure as exc:
            raise _Failure(_kind(exc, FailureKind.VERIFY_FAILED), f"verify failed: {exc.message}") from None
        self.outcome.verify_ms = (time.perf_counter() - started) * 1000
        if not response.is_success:
            raise _Failure(
                FailureKind.VERIFY_FAILED,
                f"verify failed: the environment answered HTTP {response.status_code}: {_excerpt(response.text)}",
            )
        try:
            data = strict_loads(response.content)
        except NotJSON as exc:
            raise _Failure(
                FailureKind.VERIFY_FAILED, f"verify failed: the reply is not JSON ({exc}): {_excerpt(response.text)}"
            ) from None
        if not isinstance(data, dict):
            raise _Failure(
                FailureKind.VERIFY_FAILED,
                f"verify failed: the reply is JSON but not an object: {_excerpt(response.text)}",
            )
        reward = data.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise _Failure(
                FailureKind.VERIFY_FAILED,
                f"verify failed: the reply has no numeric 'reward' (got {json.dumps(reward)[:100]})",
            )
        self.outcome.reward = float(reward)
        self.outcome.verify_response = data

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
            except _Failure as exc:
                if exc.kind == "timeout":
                    raise _Failure(
                        FailureKind.AGENT_TIMEOUT,
                        f"the agent service did not answer within {timeout:g} s "
                        f"(remote_responses_timeout_s; NeMo Gym's remote_responses_timeout_secs) at {url}",
                    ) from None
                if exc.kind in _OWN_KINDS:
                    raise
                kind = FailureKind.AGENT_UNREACHABLE if exc.kind == "unreachable" else FailureKind.AGENT_HTTP_ERROR
                raise _Failure(kind, exc.message) from None
            step.http_status = response.status_code
            if 300 <= response.status_code < 400:  # rule 1
                self._keep_refused(response)
                raise _Failure(
                    FailureKind.AGENT_REDIRECT,
                    _redirect_message(response.status_code, url, response.headers.get("location")),
                )
            if not response.is_success:  # rule 2
                self._keep_refused(response)
                raise _Failure(
                    FailureKind.AGENT_HTTP_ERROR,
                    f"the agent service answered HTTP {response.status_code}: {_excerpt(response.text)}",
                )
            try:
                data = strict_loads(response.content)
            except NotJSON as exc:
                self._keep_refused(response)
                raise _Failure(
                    FailureKind.AGENT_BAD_JSON,
                    f"the agent service's reply is not JSON ({exc}): {_excerpt(response.text)}",
                ) from None
            if not isinstance(data, dict):
                self._keep_refused(response)
                raise _Failure(
                    FailureKind.AGENT_BAD_JSON,
                    f"the agent service's reply is JSON but not an object ({type(data).__name__}): {_excerpt(response.text)}",
                )
            try:
                parse_reply(data)  # rule 3
            except InvalidReply as exc:
                self._keep_refused(response, exc.errors)
                raise _Failure(
                    FailureKind.AGENT_INVALID_RESPONSE,
                    f"the agent service returned an invalid Responses API object: {exc}",
                ) from None
            self.replies += 1
            return data, step
        except _Failure as exc:
            step.error = exc.message
            raise
        finally:
            step.latency_ms = (time.perf_counter() - started) * 1000
            if step.error is not None:
                self.obs.on_step(step, [])

    def _keep_refused(self, response: Any, errors: list[dict[str, Any]] | None = None) -> None:
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
        parts = self._input_parts
        for item in self.input[len(parts) :]:
            parts.append(_dumps(item))
        head, tail = self._body_ends
        return b"".join((head, b"[", b",".join(parts), b"]", tail))

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
    client: httpx.AsyncClient,
    row: dict[str, Any],
    settings: LoopSettings,
    observer: Observer | None = None,
) -> RolloutOutcome:
    """Run one rollout of ``row`` (a materialised task row with ``responses_create_params``).

    The whole rollout (seed to verify) is bounded by ``settings.run_timeout_s`` (rule 12); the
    caller starts the clock only once a concurrency slot is free. Never raises for failures of the
    agent or the env: they come back as an outcome with ``failure_kind`` and ``error``. Raises
    ``asyncio.CancelledError`` when cancelled.
    """
    started = time.perf_counter()
    try:
        rollout = _Rollout(client, row, settings, observer or _NullObserver())
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
    except _Failure as exc:
        outcome.failure_kind = exc.kind
        outcome.error = exc.message
    except TimeoutError:
        outcome.failure_kind = FailureKind.ROLLOUT_TIMEOUT
        outcome.error = (
            f"the rollout did not finish within {settings.run_timeout_s:g} s "
            "(run_timeout_s; NeMo Gym's run_timeout_secs)"
        )
    except Exception as exc:  # a gymweb bug must still end as data, never crash the run
        outcome.failure_kind = FailureKind.INTERNAL_ERROR
        outcome.error = f"gymweb internal error: {exc.__class__.__name__}: {exc}"
    outcome.terminal = outcome.failure_kind in FailureKind.TERMINAL
    outcome.usage = rollout.usage
    if not rollout.usage_seen and rollout.replies:  # only where a reply arrived, and none had usage
        outcome.warnings.append("the agent service reported no usage; token metrics are empty")
    if not outcome.ok:
        outcome.reward = None
        outcome.verify_response = None
    outcome.response = rollout.merged_response()
    outcome.num_agent_calls = rollout.agent_calls
    outcome.num_tool_calls = rollout.tool_calls
    outcome.total_ms = (time.perf_counter() - started) * 1000
    return outcome
