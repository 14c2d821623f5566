"""Which hosts a run may reach: the target policy, enforced at connection time (the settings and
what a user sees: docs/production.md, "Which hosts a run may reach").

The policy as plain data (no Django: ``rollouts.targets`` builds it from the settings):
``TargetPolicy``, the rules (its docstring states them); ``check(host, port, address)`` decides one
resolved address. The hooks that enforce it on every connection are ``rollouts.engine.policy_transports``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Union
from urllib.parse import urlsplit

import httpx

__all__ = [
    "ALLOWED_HOSTS_SETTING",
    "ALLOW_LOCAL_SETTING",
    "AllowEntry",
    "DEFAULT_MAX_REPLY_BYTES",
    "InvalidAllowEntry",
    "MAX_REPLY_SETTING",
    "METADATA_ADDRESSES",
    "METADATA_NAMES",
    "RefusedOSError",
    "ReplyTooLarge",
    "TargetPolicy",
    "TargetRefused",
    "classify",
    "find_refusal",
    "find_too_large",
    "host_name",
    "parse_ip",
    "resolve",
]

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
ALLOW_LOCAL_SETTING = "GYMWEB_ALLOW_LOCAL_TARGETS"
ALLOWED_HOSTS_SETTING = "GYMWEB_ALLOWED_TARGET_HOSTS"
MAX_REPLY_SETTING = "GYMWEB_MAX_REPLY_BYTES"
DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024  # 64 MB
# Cloud instance-metadata endpoints (AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean: 169.254.169.254;
# AWS ECS task metadata 169.254.170.2, AWS DNS/NTP 169.254.169.253/.123; AWS IPv6 IMDS fd00:ec2::254;
# Alibaba Cloud 100.100.100.200; Oracle Cloud's legacy 192.0.0.192).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.169.253",
        "169.254.169.123",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "100.100.100.200",
        "192.0.0.192",
    )
)
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.internal",
        "metadata.tencentyun.com",
        "metadata.platformequinix.com",
        "metadata.packet.net",
    }
)
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
_UNSPECIFIED = (ipaddress.ip_network("0.0.0.0/8"), ipaddress.ip_network("::/128"))
_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_PRIVATE = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "198.18.0.0/15",
        "fc00::/7",
        "fec0::/10",
    )
)
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
# Classes of an address (``classify``).
PUBLIC = "public"
LOCAL_CLASSES = {"loopback", "unspecified", "private"}
SELF_CLASSES = {"loopback", "unspecified"}  # gymweb's own machine
ALWAYS_REFUSED = {"metadata", "link-local", "not unicast"}
_HINT_LOCAL = (
    f"loopback, unspecified and private addresses are allowed only when the instance sets {ALLOW_LOCAL_SETTING}=1 "
    f"(a local single-user set-up) or lists the target in {ALLOWED_HOSTS_SETTING}"
)
_HINT_ALWAYS = (
    f"link-local and cloud-metadata addresses are refused unless listed explicitly in {ALLOWED_HOSTS_SETTING}"
)


class TargetRefused(httpx.ConnectError):
    """The target policy refused a connection. ``host``/``port``: as in the URL; ``reason``: why
    (names the rule and the setting to change). Raised before any byte is sent to the target."""

    def __init__(self, host: str, port: int | None, reason: str, request: httpx.Request | None = None):
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        where = f"{shown}:{port}" if port else shown
        super().__init__(f"gymweb's target policy refused {where}: {reason}", request=request)
        self.host = host
        self.port = port
        self.reason = reason


class ReplyTooLarge(httpx.TransportError):
    """A reply's body is larger than the cap (bytes). Raised as soon as the running count passes
    the cap (or at once when Content-Length says so); what was read is dropped."""

    def __init__(self, url: str, limit: int, request: httpx.Request | None = None):
        super().__init__(
            f"the reply from {url} is larger than {limit:,} bytes (the cap {MAX_REPLY_SETTING}); "
            "gymweb stopped reading it",
            request=request,
        )
        self.url = url
        self.limit = limit


class RefusedOSError(OSError):
    """What ``PolicyResolver`` raises inside aiohttp (which wraps resolver errors that are
    ``OSError``); ``PolicyAsyncTransport`` turns it back into ``TargetRefused``."""

    def __init__(self, refused: TargetRefused):
        super().__init__(str(refused))
        self.refused = refused


def find_refusal(exc: BaseException) -> TargetRefused | None:
    """The ``TargetRefused`` in ``exc`` or its chain of causes, or None."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, TargetRefused):
            return exc
        if isinstance(exc, RefusedOSError):
            return exc.refused
        os_error = getattr(exc, "os_error", None)  # aiohttp's ClientConnectorError keeps it here
        if isinstance(os_error, RefusedOSError):
            return os_error.refused
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def find_too_large(exc: BaseException) -> ReplyTooLarge | None:
    """The ``ReplyTooLarge`` in ``exc`` or its chain of causes, or None."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ReplyTooLarge):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def parse_ip(host: str) -> IPAddress | None:
    """The address a URL host denotes when it is an IP literal in any spelling the C library's
    resolver accepts, else None (a name). Handles ``[v6]``, a zone (``fe80::1%eth0``), and the legacy
    IPv4 forms of ``inet_aton``: ``2130706433``, ``0x7f000001``, ``127.1``, ``0177.0.0.1``."""
    text = (host or "").strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.rstrip(".") if ":" not in text else text
    if not text:
        return None
    if ":" in text:
        try:
            addr = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return None
        return addr
    if not re.fullmatch(r"[0-9a-fA-FxX.]+", text):
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def _plain(addr: IPAddress) -> IPAddress:
    """An IPv6 address that carries an IPv4 address as the IPv4 address it carries (IPv4-mapped,
    6to4 ``2002::/16``, Teredo's client, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48`` with the IPv4
    address in the last 32 bits, RFC 6052/8215); any other as it is."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return addr
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if any(addr in n for n in _NAT64):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


def classify(addr: IPAddress) -> str:
    """One of ``metadata``, ``link-local``, ``not unicast``, ``loopback``, ``unspecified``,
    ``private`` or ``public`` (see ``TargetPolicy``)."""
    addr = _plain(addr)
    if addr in METADATA_ADDRESSES:
        return "metadata"
    if any(addr in n for n in _LINK_LOCAL if n.version == addr.version):
        return "link-local"
    if any(addr in n for n in _UNSPECIFIED if n.version == addr.version):
        return "unspecified"
    if any(addr in n for n in _LOOPBACK if n.version == addr.version):
        return "loopback"
    if any(addr in n for n in _PRIVATE if n.version == addr.version):
        return "private"
    if addr.is_multicast or addr.is_reserved or addr == _BROADCAST:
        return "not unicast"
    if addr.version == 6 and addr in _V4_COMPATIBLE:
        return "not unicast"  # IPv4-compatible (deprecated) addresses
    return PUBLIC


class InvalidAllowEntry(ValueError):
    """An entry of ``GYMWEB_ALLOWED_TARGET_HOSTS`` that is not ``host``, ``host:port``, an IP,
    a CIDR range or one of those with a port; the message names the entry."""


@dataclass(frozen=True)
class AllowEntry:
    """One allowlist entry: a host ``name`` (lower case, no trailing dot) or a ``network`` (an IP is
    a /32 or /128), and ``port`` (None: any port). ``text`` is the entry as written."""

    text: str
    name: str | None = None
    network: IPNetwork | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> AllowEntry:
        """Parse ``host``, ``host:port``, ``10.1.2.3``, ``10.1.2.3:8000``, ``10.0.0.0/8``,
        ``10.0.0.0/8:8000``, ``[::1]``, ``[::1]:8000``, ``[fd00::/8]:8000`` or a bare IPv6 address
        or range. Raises ``InvalidAllowEntry`` naming the entry."""
        raw = text.strip()
        entry = raw.lower()
        bad = f"{ALLOWED_HOSTS_SETTING} entry {raw!r}"
        if not entry:
            raise InvalidAllowEntry(f"{bad} is empty")
        if "://" in entry:
            raise InvalidAllowEntry(f"{bad} must be a host, host:port or CIDR range, not a URL")
        port: int | None = None
        if entry.startswith("["):
            inside, sep, rest = entry[1:].partition("]")
            if not sep:
                raise InvalidAllowEntry(f"{bad} has no closing ']'")
            host = inside
            if rest:
                if not rest.startswith(":"):
                    raise InvalidAllowEntry(f"{bad}: expected ':port' after ']'")
                port = _port(rest[1:], bad)
        elif entry.count(":") == 1:
            host, _, port_text = entry.partition(":")
            port = _port(port_text, bad)
        else:
            host = entry  # a name, an IPv4 address or range, or a bare IPv6 address or range
        if not host:
            raise InvalidAllowEntry(f"{bad} has no host")
        if "/" in host:
            try:
                return cls(text=raw, network=ipaddress.ip_network(host, strict=False), port=port)
            except ValueError as exc:
                raise InvalidAllowEntry(f"{bad} is not a valid CIDR range ({exc})") from None
        addr = parse_ip(host)
        if addr is not None:
            return cls(text=raw, network=ipaddress.ip_network(addr), port=port)
        if ":" in host:
            raise InvalidAllowEntry(f"{bad} is not a valid IPv6 address (write it as [address] or [address]:port)")
        name = host.rstrip(".")
        if not re.fullmatch(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?", name):
            raise InvalidAllowEntry(f"{bad} is not a valid host name")
        return cls(text=raw, name=name, port=port)

    def matches_port(self, port: int | None) -> bool:
        return self.port is None or self.port == port


def _port(text: str, bad: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidAllowEntry(f"{bad} has a bad port {text!r} (expected 1-65535)")
    return int(text)


def host_name(host: str) -> str:
    host = (host or "").strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


@dataclass(frozen=True)
class TargetPolicy:
    """Which hosts gymweb may connect to.

    ``allow_local``: loopback, unspecified and private addresses are allowed (``GYMWEB_ALLOW_LOCAL_TARGETS``).
    ``allowed``: the parsed ``GYMWEB_ALLOWED_TARGET_HOSTS``; when not empty only listed targets
    are allowed. The default policy (``TargetPolicy()``) is the strict one: public addresses only.

    The rules, in order:

    1. An address in ``GYMWEB_ALLOWED_TARGET_HOSTS`` (an IP or CIDR entry, with its port if it names
       one) is allowed, whatever its class, except that an entry without a port does not open every
       port of gymweb's own machine (loopback, unspecified) unless ``allow_local``: ``localhost:9102``
       allows that port, a bare ``localhost`` does not reach Redis on 6379 (this holds for rule 3 too).
    2. Link-local (169.254.0.0/16, fe80::/10) and cloud-metadata addresses (``METADATA_ADDRESSES``),
       and addresses that are not unicast (multicast, reserved, broadcast), are refused unless rule 1
       allowed them; a metadata host name (``METADATA_NAMES``) is refused unless listed as a name.
    3. When the allowlist is not empty, a host name listed there (as ``host`` or ``host:port``) is
       allowed on any other address; everything else is refused ("only listed targets").
    4. With an empty allowlist, loopback (127.0.0.0/8, ::1), unspecified (0.0.0.0/8, ::) and private
       addresses (RFC 1918, 100.64.0.0/10 CGNAT, fc00::/7, fec0::/10, 198.18.0.0/15) are allowed only
       with ``allow_local`` (``GYMWEB_ALLOW_LOCAL_TARGETS=1``); every other (public) address is allowed.

    IPv4-mapped IPv6 addresses (``::ffff:127.0.0.1``) are judged as the IPv4 address they carry.
    """

    allow_local: bool = False
    allowed: tuple[AllowEntry, ...] = field(default_factory=tuple)

    @classmethod
    def from_settings(cls, allow_local: Any, allowed_hosts: str | Iterable[str] | None) -> TargetPolicy:
        """Build a policy from the two settings' values: ``allow_local`` a bool or a string
        (``1``/``true``/``yes``/``on`` are true), ``allowed_hosts`` a list of entries or one
        comma-separated string. Raises ``InvalidAllowEntry`` naming a bad entry."""
        if isinstance(allow_local, str):
            allow_local = allow_local.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(allowed_hosts, str):
            allowed_hosts = allowed_hosts.split(",")
        entries = tuple(AllowEntry.parse(h) for h in (allowed_hosts or ()) if h and h.strip())
        return cls(allow_local=bool(allow_local), allowed=entries)

    def describe(self) -> str:
        """One line for messages: what this instance allows."""
        if self.allowed:
            return f"only {', '.join(e.text for e in self.allowed)} ({ALLOWED_HOSTS_SETTING})"
        if self.allow_local:
            return (
                f"public, loopback and private addresses ({ALLOW_LOCAL_SETTING}=1); never link-local or cloud metadata"
            )
        return f"public addresses only (loopback and private need {ALLOW_LOCAL_SETTING}=1)"

    def _address_entries(self, addr: IPAddress, port: int | None) -> list[AllowEntry]:
        """IP and CIDR entries holding ``addr`` (or the IPv4 address it maps) on ``port``."""
        found = []
        for candidate in {addr, _plain(addr)}:
            for e in self.allowed:
                if (
                    e.network is not None
                    and e.network.version == candidate.version
                    and candidate in e.network
                    and e.matches_port(port)
                ):
                    found.append(e)
        return found

    def _listed_address(self, addr: IPAddress, port: int | None) -> bool:
        return bool(self._address_entries(addr, port))

    def _name_entries(self, name: str, port: int | None) -> list[AllowEntry]:
        return [e for e in self.allowed if e.name == name and e.matches_port(port)]

    def _listed_name(self, name: str, port: int | None) -> bool:
        return bool(self._name_entries(name, port))

    def _opens(self, entries: list[AllowEntry], kind: str) -> bool:
        """Whether matching ``entries`` allow an address of class ``kind``: an entry without a port
        does not open every port of gymweb's own machine (loopback, unspecified) unless local
        targets are allowed; ``localhost:9102`` does."""
        return bool(entries) and (
            kind not in SELF_CLASSES or self.allow_local or any(e.port is not None for e in entries)
        )

    @staticmethod
    def _self_reason(target: str, kind: str, entries: list[AllowEntry]) -> str:
        listed = ", ".join(e.text for e in entries)
        return (
            f"{target} is on gymweb's own machine ({kind}) and {ALLOWED_HOSTS_SETTING} lists it without a port "
            f"({listed}), which does not open every port of this machine: list it as host:port, or set "
            f"{ALLOW_LOCAL_SETTING}=1 on a local single-user set-up"
        )

    def check_name(self, host: str, port: int | None) -> str | None:
        """The reason to refuse the host *name* before resolving it, or None. Only metadata names
        are refused by name (an explicitly listed one is allowed)."""
        name = host_name(host)
        if name in METADATA_NAMES and not self._listed_name(name, port):
            return f"{name} is a cloud-metadata host; {_HINT_ALWAYS}"
        return None

    def check(self, host: str, port: int | None, addr: IPAddress) -> str | None:
        """The reason to refuse connecting to ``addr`` (resolved from ``host``, or ``host`` itself
        when it is a literal) on ``port``, or None when allowed."""
        name = host_name(host)
        kind = classify(addr)
        target = f"{name}:{port}" if port else name
        by_address = self._address_entries(addr, port)
        if by_address:
            return None if self._opens(by_address, kind) else self._self_reason(target, kind, by_address)
        shown = str(_plain(addr))
        about = shown if parse_ip(host) is not None else f"{name} resolves to {shown}, which"
        if kind in ALWAYS_REFUSED:
            if kind != "not unicast" and name in METADATA_NAMES and self._listed_name(name, port):
                return None
            what = {
                "metadata": "a cloud-metadata address",
                "link-local": "a link-local address",
                "not unicast": "not a unicast address",
            }[kind]
            return f"{about} is {what}; {_HINT_ALWAYS}"
        if self.allowed:
            by_name = self._name_entries(name, port) if parse_ip(host) is None else []
            if by_name:
                return None if self._opens(by_name, kind) else self._self_reason(target, kind, by_name)
            listed = ", ".join(e.text for e in self.allowed)
            return f"{target} is not in {ALLOWED_HOSTS_SETTING} ({listed}); only listed targets are allowed"
        if kind in LOCAL_CLASSES and not self.allow_local:
            article = "an" if kind[0] in "aeiou" else "a"
            return f"{about} is {article} {kind} address; {_HINT_LOCAL}"
        return None

    def refusal(
        self, host: str, port: int | None, addresses: Iterable[IPAddress]
    ) -> tuple[list[IPAddress], str | None]:
        """Split ``addresses`` of ``host``: ``(allowed ones, the first reason to refuse)``."""
        allowed, reason = [], None
        for addr in addresses:
            why = self.check(host, port, addr)
            if why is None:
                allowed.append(addr)
            elif reason is None:
                reason = why
        return allowed, reason

    def check_literal(self, host: str, port: int | None) -> None:
        """Raise ``TargetRefused`` when ``host`` is an IP literal (any spelling, ``parse_ip``) or a
        name the policy refuses by name. Names are judged further when resolved."""
        addr = parse_ip(host)
        if addr is not None:
            why = self.check(host, port, addr)
        else:
            if ":" in host.strip("[]"):
                why = "not a valid IP address"
            else:
                why = self.check_name(host, port)
        if why:
            raise TargetRefused(host_name(host) if addr is None else host, port, why)

    def check_url(self, url: str, *, resolve_names: bool = True, timeout_s: float = 3.0) -> None:
        """Judge a base URL now, as a form does before storing it: the literal or name check, then,
        for a name (``resolve_names``), its addresses as the resolver sees them now. A name that
        does not resolve within ``timeout_s`` is judged at connection time instead (unless the
        allowlist is not empty and does not list it). Raises ``TargetRefused``."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.check_literal(host, port)
        if parse_ip(host) is not None or not resolve_names:
            return
        try:
            addresses = _resolve_with_timeout(host, port, timeout_s)
        except (OSError, TimeoutError):
            addresses = []
        if not addresses:
            name = host_name(host)
            if self.allowed and not self._listed_name(name, port):
                listed = ", ".join(e.text for e in self.allowed)
                raise TargetRefused(
                    name,
                    port,
                    f"{name}:{port} is not in {ALLOWED_HOSTS_SETTING} ({listed}); only listed targets are allowed",
                )
            return
        allowed, reason = self.refusal(host, port, addresses)
        if not allowed:
            raise TargetRefused(host_name(host), port, reason or "no address allowed")


def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses of ``host`` (``getaddrinfo``, TCP), in the resolver's order, without
    duplicates. Raises ``OSError`` (``socket.gaierror``) when it does not resolve. Tests replace
    this function to make a name resolve where they want (``PolicyResolver`` and
    ``PolicyNetworkBackend`` call it through the module)."""
    try:
        infos = socket.getaddrinfo(host_name(host), port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
    except socket.gaierror:
        infos = socket.getaddrinfo(host_name(host), port, type=socket.SOCK_STREAM)
    out: list[IPAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if addr not in out:
            out.append(addr)
    return out


def _resolve_with_timeout(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(lambda: resolve(host, port)).result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"{host} did not resolve within {timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)
