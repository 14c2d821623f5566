"""The engine's one HTTP client: ``LoopClient`` (an ``httpx.AsyncClient`` over the policy-wrapped
aiohttp transport; ``post_bytes`` reads a whole reply straight from aiohttp as a ``RawReply``), built
by ``make_client``; ``SessionJar``, one party's cookies for one rollout; and
``LoopClient.post_with_attempts``, the one place where transport errors (aiohttp's, httpx's, the
operating system's, the target policy's and the reply cap's) become the engine's ``Failure`` kinds.
"""

from __future__ import annotations

import asyncio
import errno
import http.cookiejar
import time
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from rollouts.engine.budget import ReplyBudget, ReplyOverBudget
from rollouts.engine.failures import NOT_HTTP, TIMEOUT, UNREACHABLE, Failure, FailureKind
from rollouts.engine.policy_transports import PolicyAsyncTransport, PolicyResolver
from rollouts.engine.targets import DEFAULT_MAX_REPLY_BYTES, ReplyTooLarge, TargetPolicy, find_refusal, find_too_large

__all__ = ["OUT_OF_FILES_WAITS", "LoopClient", "RawReply", "SessionJar", "make_client", "out_of_files"]


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
                except BaseException:
                    # A refusal's traceback keeps this frame (and the failure that wraps it lives on
                    # until its row is written, in garbage cycles the collector reaches late): it
                    # must not keep the bytes read, which the budget is about to count as given back.
                    chunks.clear()
                    raise
                finally:
                    budget.give(seen)
                status, raw_headers, reason = resp.status, resp.headers, resp.reason
        return RawReply(status, raw_headers, chunks[0] if len(chunks) == 1 else b"".join(chunks), reason)

    async def post_with_attempts(
        self,
        url: str,
        body: bytes,
        jar: SessionJar,
        *,
        who: str,
        attempts: int,
        pause_s: float,
        hint: str,
        timeout_s: float | None = None,
        budget_s: float = 0.0,
    ) -> RawReply:
        """POST ``body`` to ``url`` with one party's cookies (``jar``, updated from the reply) and
        read the whole reply; ``who`` names the party in messages.

        Connection refused, reset or dropped before a reply: ``attempts`` tries with a pause of
        ``pause_s`` between, then a failure naming the URL and ending with ``hint`` (rule 11; rule 15
        for the env); a try that failed because this process had no file descriptor left is waited
        out (up to ``OUT_OF_FILES_WAITS`` pauses) before it counts, and the failure then names the
        open-file limit instead. ``budget_s`` > 0 (``GYMWEB_CONNECT_RETRY_BUDGET_S``): once those
        attempts have failed, go on trying while fewer than ``budget_s`` seconds have passed since the
        first failure, the pause doubling up to ``MAX_RETRY_PAUSE_S`` (a service restarting for a few
        seconds costs no rollout). A peer that answers with something other than HTTP fails at once.
        ``timeout_s`` bounds each try (rule 12; None: only the rollout's own timeout). Raises
        ``Failure`` with kind ``UNREACHABLE``, ``NOT_HTTP`` or ``TIMEOUT``, which callers turn into
        their own failure kind, or with ``target_refused`` (the target policy refused the host:
        nothing was sent, not retried), ``reply_too_large`` (the reply passed the cap; not read on)
        or ``reply_over_budget``, which they keep.
        """
        last: BaseException | None = None
        failed = waits = 0  # tries that failed and count as attempts; tries waited out for a descriptor
        first_failure: float | None = None
        pause = pause_s

        def more() -> bool:
            if failed < attempts:
                return True
            return first_failure is not None and time.monotonic() - first_failure < budget_s

        while more():
            try:
                async with asyncio.timeout(timeout_s):
                    response = await self.post_bytes(url, body, jar.headers())
            except TimeoutError:
                raise Failure(TIMEOUT, f"{who} did not answer within {timeout_s:g} s") from None
            except _PROTOCOL_ERRORS as exc:
                own = _policy_failure(exc, who, url)
                if own is not None:  # refused by the target policy or over the reply cap: not retried
                    raise own from None
                if not isinstance(exc, _CONNECTION_ERRORS):  # answered, but not with HTTP: not retried (rule 11)
                    raise Failure(
                        NOT_HTTP,
                        f"{who} at {url} did not answer with valid HTTP ({_describe_exc(exc)})",
                        cause=transport_error(exc),
                    ) from None
                last = exc
                if waits < OUT_OF_FILES_WAITS and out_of_files(exc):
                    # gymweb's own process is out of file descriptors (thousands in flight): not the
                    # peer's fault, so wait for one to free up without spending an attempt
                    waits += 1
                else:
                    failed += 1
                    if first_failure is None:
                        first_failure = time.monotonic()
                if failed >= attempts and more():  # past the contract's attempts, within the budget: back off
                    pause = min(pause * 2, MAX_RETRY_PAUSE_S)
                    remaining = budget_s - (time.monotonic() - (first_failure or 0.0))
                    await asyncio.sleep(max(0.0, min(pause, remaining)))
                elif failed < attempts:
                    await asyncio.sleep(pause_s)
                continue
            jar.update(response)
            return response
        if out_of_files(last):
            hint = (
                "gymweb's own process ran out of open files (each rollout in flight may hold an agent and an "
                "env connection): raise its open-file limit (`ulimit -n`) or lower the concurrency"
            )
        tries = f"{failed} attempts" + (f" over {budget_s:g} s" if failed > attempts else "")
        raise Failure(
            UNREACHABLE,
            f"could not reach {who} after {tries} ({_describe_exc(last)}). {hint}",
            cause=transport_error(last) if last is not None else None,
            attempts=failed,
        )


_NO_TIMEOUT = aiohttp.ClientTimeout()  # every field None: the loop bounds each call itself (rule 12)


class RawReply:
    """A whole HTTP reply read by ``LoopClient.post_bytes``, with the parts of ``httpx.Response``
    the loop reads: ``status_code``, ``reason`` (the reason phrase as sent, None when not known),
    ``is_success``, ``headers`` (case-insensitive ``get``;
    ``get_list`` for repeated headers), ``content`` (bytes, ``Content-Encoding`` decoded as httpx
    decodes it; a bad encoding raises ``httpx.DecodingError``) and ``text`` (decoded by the
    ``Content-Type`` charset, else UTF-8, bad bytes replaced: httpx's rule)."""

    __slots__ = ("status_code", "reason", "headers", "content", "_text")

    def __init__(self, status: int, headers: Any, content: bytes, reason: str | None = None):
        self.status_code = status
        self.reason = reason
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


def make_client(
    concurrency: int,
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    reply_budget_bytes: int | None = None,
    keepalive_s: float = 15.0,
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
    ``keepalive_s``: how long an idle connection stays in the pool for the next call to the same
    host (default aiohttp's 15 s). A rollout's env connection idles through each agent call: with a
    keep-alive shorter than the agent's latency, every env call after an agent call opens a new
    connection (CPU), with a longer one each rollout in flight holds an idle env connection beside
    its agent connection (open files: at 10,000 in flight they reached a 20,000 limit). A server
    that closes idle connections sooner is noticed when it does (the closed connection leaves the
    pool).
    """
    limit = max(4, 2 * int(concurrency) + 8)
    policy = policy if policy is not None else TargetPolicy()

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limit,
            limit_per_host=0,
            ttl_dns_cache=300,
            resolver=PolicyResolver(policy),
            keepalive_timeout=keepalive_s,
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


def transport_error(exc: BaseException) -> BaseException:
    """The exception as aiohttp raised it (e.g. ``ClientConnectorError``) behind the httpx error the
    transport mapped it to, else ``exc`` itself."""
    cause = exc.__cause__ or exc.__context__
    return cause if isinstance(cause, aiohttp.ClientError) else exc


def _describe_exc(exc: BaseException) -> str:
    inner = transport_error(exc)
    text = str(inner) or inner.__class__.__name__
    return f"{inner.__class__.__name__}: {text}"


def _policy_failure(exc: BaseException, who: str, url: str) -> Failure | None:
    """A ``Failure`` of kind ``target_refused`` or ``reply_too_large`` when ``exc`` is (or was
    caused by) the target policy's refusal or the reply cap, else None."""
    refused = find_refusal(exc)
    if refused is not None:
        return Failure(FailureKind.TARGET_REFUSED, f"gymweb did not connect to {who} at {url}: {refused}")
    too_large = find_too_large(exc)
    if isinstance(too_large, ReplyOverBudget):
        return Failure(FailureKind.REPLY_OVER_BUDGET, f"{who} at {url}: {too_large.args[0]}; the rollout can run again")
    if too_large is not None:
        return Failure(
            FailureKind.REPLY_TOO_LARGE,
            f"{who} at {url} sent a reply larger than {too_large.limit:,} bytes "
            f"(GYMWEB_MAX_REPLY_BYTES); gymweb stopped reading it",
        )
    return None


# Connection tries that failed because this process had no file descriptor left, waited out (a
# pause of ``retry_pause_s`` each) before they count as attempts: at thousands in flight the agent
# and env connections can pass the open-file limit for a moment.
OUT_OF_FILES_WAITS = 60
# the longest pause between tries once the contract's attempts are spent and a retry budget is set
MAX_RETRY_PAUSE_S = 5.0


def out_of_files(exc: BaseException | None) -> bool:
    """True when ``exc`` or an exception in its cause chain is this process running out of file
    descriptors (EMFILE/ENFILE): then the peer is not to blame and the error text says so."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
