"""The hooks that enforce the target policy (``rollouts.engine.targets``) and the reply cap on every
connection:

- ``PolicyResolver``: an aiohttp resolver that resolves a name itself and drops every address the
  policy refuses, so a name that resolves to 127.0.0.1 is judged by 127.0.0.1 (DNS tricks do not
  pass); nothing left raises ``TargetRefused``.
- ``PolicyAsyncTransport`` / ``PolicySyncTransport``: httpx transports that judge IP-literal hosts
  in every spelling the C library accepts (``0x7f000001``, ``2130706433``, ``127.1``, ``0177.0.0.1``,
  ``[::ffff:127.0.0.1]``) before anything connects, and cap every reply (``max_reply_bytes``: the
  body is counted as it streams and never buffered past the cap; over it ``ReplyTooLarge``).
  The sync transport connects through ``PolicyNetworkBackend`` (httpcore), which resolves, judges
  and then connects to the judged address itself.

Names resolve through ``targets.resolve`` (looked up on that module at each call, so a test can
replace it).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from rollouts.engine import targets
from rollouts.engine.targets import (
    DEFAULT_MAX_REPLY_BYTES,
    RefusedOSError,
    ReplyTooLarge,
    TargetPolicy,
    TargetRefused,
    find_refusal,
    host_name,
    parse_ip,
)

__all__ = [
    "PolicyAsyncTransport",
    "PolicyNetworkBackend",
    "PolicyResolver",
    "PolicySyncTransport",
    "make_sync_client",
]


class PolicyResolver(AbstractResolver):
    """An aiohttp resolver (``TCPConnector(resolver=PolicyResolver(policy))``) that resolves with
    ``resolve`` in a thread and returns only the addresses ``policy`` allows, so aiohttp connects
    to a judged address. Raises ``RefusedOSError`` (an ``OSError``, which aiohttp wraps in
    ``ClientConnectorDNSError``) when none is allowed or the name is refused as such."""

    def __init__(self, policy: TargetPolicy):
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        why = self.policy.check_name(host, port)
        if why:
            raise RefusedOSError(TargetRefused(host_name(host), port, why))
        loop = asyncio.get_running_loop()
        addresses = await loop.run_in_executor(None, targets.resolve, host, port)
        if family in (socket.AF_INET, socket.AF_INET6):
            addresses = [a for a in addresses if (a.version == 4) == (family == socket.AF_INET)] or addresses
        allowed, reason = self.policy.refusal(host, port, addresses)
        if not allowed:
            raise RefusedOSError(TargetRefused(host_name(host), port, reason or "the name resolved to no address"))
        return [
            {
                "hostname": host,
                "host": str(a),
                "port": port,
                "family": socket.AF_INET if a.version == 4 else socket.AF_INET6,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
            for a in allowed
        ]

    async def close(self) -> None:
        return None


def _port_of(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


class _CappedAsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int, request: httpx.Request):
        self.inner, self.limit, self.request = inner, limit, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                await self.inner.aclose()
                raise ReplyTooLarge(str(self.request.url), self.limit, request=self.request)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedSyncStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, limit: int, request: httpx.Request):
        self.inner, self.limit, self.request = inner, limit, request

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                self.inner.close()
                raise ReplyTooLarge(str(self.request.url), self.limit, request=self.request)
            yield chunk

    def close(self) -> None:
        self.inner.close()


def _declared_too_large(response: httpx.Response, limit: int) -> bool:
    length = response.headers.get("content-length", "")
    return length.isdigit() and int(length) > limit


class PolicyAsyncTransport(httpx.AsyncBaseTransport):
    """Wraps an async httpx transport: judges IP-literal hosts before ``inner`` connects (names
    are judged by the connector's ``PolicyResolver``), turns a resolver refusal into
    ``TargetRefused`` and caps every reply at ``max_reply_bytes`` (``ReplyTooLarge``)."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, policy: TargetPolicy, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES
    ):
        self.inner, self.policy, self.max_reply_bytes = inner, policy, int(max_reply_bytes)
        # (host, port) pairs whose literal check passed: the policy is immutable and the check
        # needs no DNS, so a run's thousands of calls to one address judge it once.
        self._passed: set[tuple[str, int]] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = (request.url.host, _port_of(request.url))
        if key not in self._passed:
            try:
                self.policy.check_literal(*key)
            except TargetRefused as exc:
                exc.request = request
                raise
            if len(self._passed) > 4096:
                self._passed.clear()
            self._passed.add(key)
        try:
            response = await self.inner.handle_async_request(request)
        except Exception as exc:
            refused = find_refusal(exc)
            if refused is not None:
                raise TargetRefused(refused.host, refused.port, refused.reason, request=request) from None
            raise
        if _declared_too_large(response, self.max_reply_bytes):
            await response.aclose()
            raise ReplyTooLarge(str(request.url), self.max_reply_bytes, request=request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CappedAsyncStream(response.stream, self.max_reply_bytes, request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class PolicyNetworkBackend:
    """An httpcore network backend (sync) that resolves a name with ``resolve``, drops the
    addresses ``policy`` refuses and connects to the first allowed one that answers; an IP-literal
    host is judged as such. TLS still verifies against the URL's host name (httpcore passes it as
    ``server_hostname``). Raises ``TargetRefused``."""

    def __init__(self, policy: TargetPolicy):
        import httpcore

        self.policy = policy
        self.inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> Any:
        self.policy.check_literal(host, port)
        if parse_ip(host) is not None:
            return self.inner.connect_tcp(
                str(parse_ip(host)), port, timeout=timeout, local_address=local_address, socket_options=socket_options
            )
        import httpcore

        try:
            addresses = targets.resolve(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"could not resolve {host}: {exc}") from exc
        allowed, reason = self.policy.refusal(host, port, addresses)
        if not allowed:
            raise TargetRefused(host_name(host), port, reason or "the name resolved to no address")
        last: Exception | None = None
        for addr in allowed:
            try:
                return self.inner.connect_tcp(
                    str(addr), port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except Exception as exc:  # try the next allowed address, as a resolver-driven connect would
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        raise TargetRefused("unix socket", None, "gymweb connects only to http(s) hosts")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class PolicySyncTransport(httpx.BaseTransport):
    """A sync httpx transport enforcing ``policy`` at connection time (``PolicyNetworkBackend``)
    and capping every reply at ``max_reply_bytes`` (``ReplyTooLarge``). Proxies are never used."""

    def __init__(self, policy: TargetPolicy, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES, **kwargs: Any):
        self.policy, self.max_reply_bytes = policy, int(max_reply_bytes)
        self.inner = httpx.HTTPTransport(**kwargs)
        pool = getattr(self.inner, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            raise RuntimeError("httpx/httpcore changed: cannot install gymweb's target policy on the sync transport")
        pool._network_backend = PolicyNetworkBackend(policy)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = self.inner.handle_request(request)
        except TargetRefused as exc:
            exc.request = request
            raise
        if _declared_too_large(response, self.max_reply_bytes):
            response.close()
            raise ReplyTooLarge(str(request.url), self.max_reply_bytes, request=request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _CappedSyncStream(response.stream, self.max_reply_bytes, request)
        return response

    def close(self) -> None:
        self.inner.close()


def make_sync_client(
    policy: TargetPolicy, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES, *, timeout_s: float | None = 30.0
) -> httpx.Client:
    """A sync httpx client for requests to a user's service (the env's ``/aggregate_metrics``,
    ``/reverify_mode``...): the target policy at connection time, replies capped, no proxies
    (contract rule 14), no redirects followed (rule 1). Close it after use."""
    return httpx.Client(
        transport=PolicySyncTransport(policy, max_reply_bytes),
        trust_env=False,
        follow_redirects=False,
        timeout=timeout_s,
    )
