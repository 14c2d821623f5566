"""The Redis web cache, failing open: while Redis does not answer, every read is a miss and every
write is dropped, so pages are slower but never broken. The log says so once per outage."""

from __future__ import annotations

import functools
import logging
import threading

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from redis.exceptions import RedisError

log = logging.getLogger("gymweb.cache")

_state = threading.Lock()
_down = False


def _outage(exc: RedisError) -> None:
    global _down
    with _state:
        if _down:
            return
        _down = True
    log.warning(
        "the cache (Redis) is not answering (%s: %s); pages are served without it until it answers",
        exc.__class__.__name__,
        exc,
    )


def _answered() -> None:
    global _down
    if _down:
        with _state:
            if not _down:
                return
            _down = False
        log.warning("the cache (Redis) answers again")


def _fail_open(method, fallback):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            value = method(self, *args, **kwargs)
        except RedisError as exc:
            _outage(exc)
            return fallback(*args) if callable(fallback) else fallback
        _answered()
        return value

    return call


class FailOpenRedisCacheClient(RedisCacheClient):
    """Django's Redis client where a Redis error is a miss (reads) or a dropped write."""

    add = _fail_open(RedisCacheClient.add, False)
    get = _fail_open(RedisCacheClient.get, lambda key, default: default)
    set = _fail_open(RedisCacheClient.set, None)
    touch = _fail_open(RedisCacheClient.touch, False)
    delete = _fail_open(RedisCacheClient.delete, False)
    get_many = _fail_open(RedisCacheClient.get_many, {})
    has_key = _fail_open(RedisCacheClient.has_key, False)
    set_many = _fail_open(RedisCacheClient.set_many, [])
    delete_many = _fail_open(RedisCacheClient.delete_many, None)
    clear = _fail_open(RedisCacheClient.clear, False)

    def incr(self, key, delta):
        try:
            value = super().incr(key, delta)
        except RedisError as exc:
            _outage(exc)
            raise ValueError(f"Key '{key}' not found (the cache is not answering)") from None
        _answered()
        return value


class FailOpenRedisCache(RedisCache):
    """``BACKEND`` for ``GYMWEB_CACHE_URL=redis://...``: Django's Redis cache with short socket
    timeouts (a hung Redis costs a page at most about a second) that fails open."""

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = FailOpenRedisCacheClient
        self._options = {"socket_connect_timeout": 0.5, "socket_timeout": 0.5, **self._options}
