"""Open results streams (``GET /api/v1/runs/{id}/results`` that wait): how many one web process
holds at once, and noticing that a stream's client went away.

A waiting stream holds one of its web process's threads until the run ends (or
``GYMWEB_STREAM_MAX_S``). Without a bound, workers × threads open streams take every thread and
every page and ``/healthz`` stall. So each process counts its open streams (``SLOTS``):

- ``GYMWEB_MAX_RESULT_STREAMS`` per process (default: the process's threads,
  ``GYMWEB_WEB_THREADS``, less a quarter of them, at least one, kept for pages and health checks);
  past it, 503;
- ``GYMWEB_MAX_RESULT_STREAMS_PER_USER`` per user in that process, all their tokens together
  (default: half the process's limit, at least 1), so one trainer cannot take them all; past it, 429.

Both answers carry ``Retry-After`` (``GYMWEB_STREAM_RETRY_AFTER_S``) and a body naming the limit,
its setting and value (``StreamRefused``). Reads with ``?wait=0`` answer at once and are not counted.

A slot is given back when the stream's body is closed (the WSGI server calls ``close()`` at the
end of the response, on a write to a dropped client too), when the iteration ends or raises, and,
should a response be dropped unclosed, when it is garbage-collected (``HeldStream``).
``client_gone`` lets a waiting stream notice a client that closed its connection without waiting
for its next write (a keep-alive comes only every ``GYMWEB_STREAM_KEEPALIVE_S``).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.conf import settings
from ninja.errors import HttpError

log = logging.getLogger("gymweb.api")

__all__ = ["SLOTS", "HeldStream", "Limits", "Slot", "StreamRefused", "StreamSlots", "client_gone", "limits"]

# What an unknown thread count is taken as: `gymweb serve`'s default --threads.
DEFAULT_THREADS = 16


@dataclass(frozen=True)
class Limits:
    """The limits in force: ``per_process`` and ``per_user`` open streams, ``retry_after_s``."""

    per_process: int
    per_user: int
    retry_after_s: int


def limits() -> Limits:
    """The limits from the settings, with the defaults derived from the thread count: threads
    less ``max(1, threads // 4)`` per process (12 of 16, 3 of 4, 0 of 1: a `sync` worker has no
    thread to spare), half of that per user (at least 1). A per-process limit set above the
    threads less one is held to that (logged once): one thread always stays for pages and
    health checks."""
    threads = int(settings.GYMWEB_WEB_THREADS) or DEFAULT_THREADS
    per_process = settings.GYMWEB_MAX_RESULT_STREAMS
    if per_process is None:
        per_process = threads - max(1, threads // 4)
    elif per_process > threads - 1:
        _warn_once(
            f"GYMWEB_MAX_RESULT_STREAMS={per_process} would let open results streams take all "
            f"{threads} threads of this web process (GYMWEB_WEB_THREADS, gymweb serve --threads); "
            f"held to {max(0, threads - 1)}, so pages and /healthz keep a thread"
        )
        per_process = max(0, threads - 1)
    per_user = settings.GYMWEB_MAX_RESULT_STREAMS_PER_USER
    if per_user is None:
        per_user = max(1, per_process // 2)
    return Limits(max(0, int(per_process)), max(0, int(per_user)), max(1, int(settings.GYMWEB_STREAM_RETRY_AFTER_S)))


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class StreamRefused(HttpError):
    """A waiting results stream refused by a limit: 503 (``limit`` = ``per_process``) or 429
    (``per_user``). ``retry_after``: seconds (the ``Retry-After`` header); ``body``: the fields
    added to the error body (``limit``, ``setting``, ``value``, ``retry_after_s``)."""

    SETTINGS = {"per_process": "GYMWEB_MAX_RESULT_STREAMS", "per_user": "GYMWEB_MAX_RESULT_STREAMS_PER_USER"}

    def __init__(self, limit: str, value: int, retry_after_s: int):
        setting = self.SETTINGS[limit]
        if limit == "per_process" and value == 0:
            status = 503
            message = (
                f"this web process allows no open results streams ({setting} is 0, or its threads leave none to "
                f"spare: serve with more --threads): read with ?wait=0"
            )
        elif limit == "per_process":
            status = 503
            message = (
                f"this web process already holds its {value} open results streams ({setting}): "
                f"try again in {retry_after_s} s, or read with ?wait=0"
            )
        else:
            status = 429
            message = (
                f"you already hold {value} open results streams in this web process ({setting}): close one, "
                f"or try again in {retry_after_s} s"
            )
        super().__init__(status, message)
        self.retry_after = retry_after_s
        self.body = {"limit": limit, "setting": setting, "value": value, "retry_after_s": retry_after_s}


class Slot:
    """One open stream counted in its ``StreamSlots``; ``release()`` gives it back (once; later
    calls do nothing)."""

    def __init__(self, owner: StreamSlots, user_key: object):
        self._owner = owner
        self._user_key = user_key
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._owner._give_back(self._user_key)


class StreamSlots:
    """A process's count of open streams, in all and per user (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.by_user: dict[object, int] = {}

    def take(self, user_key: object, limit: Limits | None = None) -> Slot:
        """Count one more stream of ``user_key``; raises ``StreamRefused`` (429 when that user
        holds ``per_user`` already, else 503 when the process holds ``per_process``)."""
        limit = limit or limits()
        with self._lock:
            if self.by_user.get(user_key, 0) >= limit.per_user:
                raise StreamRefused("per_user", limit.per_user, limit.retry_after_s)
            if self.total >= limit.per_process:
                raise StreamRefused("per_process", limit.per_process, limit.retry_after_s)
            self.total += 1
            self.by_user[user_key] = self.by_user.get(user_key, 0) + 1
        return Slot(self, user_key)

    def _give_back(self, user_key: object) -> None:
        with self._lock:
            self.total -= 1
            left = self.by_user.get(user_key, 0) - 1
            if left > 0:
                self.by_user[user_key] = left
            else:
                self.by_user.pop(user_key, None)


SLOTS = StreamSlots()  # this process's


class HeldStream:
    """A streaming response's body that holds ``slot`` while it is open: iterates ``lines`` (after
    an empty first chunk) and releases the slot when they end or raise, when ``close()`` is called (Django registers it
    with the response, which the WSGI server closes) or when this object is collected unclosed."""

    def __init__(self, lines: Iterator[bytes], slot: Slot):
        self._lines = lines
        self._slot = slot
        weakref.finalize(self, slot.release)

    def __iter__(self) -> Iterator[bytes]:
        try:
            # Nothing to send: the server sends the response's head at once, so the client knows
            # its stream was accepted before the first row or keep-alive.
            yield b""
            yield from self._lines
        finally:
            self._slot.release()

    def close(self) -> None:
        try:
            close = getattr(self._lines, "close", None)
            if close is not None:
                close()
        finally:
            self._slot.release()


_PEEK_FLAGS = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)


def _never() -> bool:
    return False


def client_gone(meta: dict) -> Callable[[], bool]:
    """A check, for the request whose ``META`` is ``meta``, that says True once the client closed
    its connection: a peek (nothing is read) at the connection's socket, which gunicorn hands over
    as ``gunicorn.socket``, returns end-of-file. Without that socket (another server), on TLS
    straight to gunicorn (the peek would see encrypted bytes) or without ``MSG_DONTWAIT``: a check
    that never says so (the stream then ends at its next failed write)."""
    sock = meta.get("gunicorn.socket")
    if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket) or not hasattr(socket, "MSG_DONTWAIT"):
        return _never

    def gone() -> bool:
        try:
            return sock.recv(1, _PEEK_FLAGS) == b""
        except (BlockingIOError, InterruptedError):  # open, nothing sent: the usual case
            return False
        except OSError:  # reset, or the socket is closed already
            return True

    return gone
