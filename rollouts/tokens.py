"""Per-user API tokens (``Authorization: Bearer gw_…``). Only a token's SHA-256 is stored: the
token is shown once, when it is made, and cannot be read back; deleting it revokes it at once.

A token has a scope (``read``: the API's GET routes only; ``write``: every route) and an optional
expiry (refused from then on, with a message saying so). Wrong tokens are counted per client
address in the cache: past ``GYMWEB_API_BAD_TOKENS_PER_MINUTE`` in a minute, the address is
answered 429 until the minute ends (``bad_token_wait``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from rollouts.models import ApiToken

PREFIX = "gw_"
LAST_USED_GRANULARITY = timedelta(minutes=1)  # don't write a row on every request
WINDOW_S = 60  # the rate limit's window for wrong tokens
SCOPES = ("read", "write")  # ApiToken.Scope's values


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(
    user, name: str, scope: str = "write", expires: datetime | None = None, team=None
) -> tuple[ApiToken, str]:
    """A new token for ``user``: ``(row, token)``; the token text exists only in this return value.
    ``scope``: ``read`` or ``write`` (ValueError otherwise); ``expires``: when it stops working
    (None: never); ``team``: the one team it sees (None: all the user's)."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: read or write")
    token = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user,
        name=(name or "").strip()[:100] or "API token",
        prefix=token[:10],
        digest=digest(token),
        scope=scope,
        expires=expires,
        team=team,
    )
    return row, token


@dataclass(frozen=True)
class TokenCheck:
    """What a presented token is: its row and user when it works, else why not (``unknown``:
    no such token, revoked or its user inactive; ``expired``)."""

    row: ApiToken | None = None
    refused: str = ""

    @property
    def user(self):
        return self.row.user if self.row is not None else None


def check_token(token: str | None) -> TokenCheck:
    """Check a presented token. Records when a working token was last used (at most once a minute)."""
    if not token or not token.startswith(PREFIX) or len(token) > 200:
        return TokenCheck(refused="unknown")
    row = ApiToken.objects.select_related("user").filter(digest=digest(token)).first()
    if row is None or not row.user.is_active:
        return TokenCheck(refused="unknown")
    now = timezone.now()
    if row.expires is not None and row.expires <= now:
        return TokenCheck(refused="expired")
    if row.last_used is None or now - row.last_used > LAST_USED_GRANULARITY:
        ApiToken.objects.filter(pk=row.pk).update(last_used=now)
    return TokenCheck(row=row)


def user_for_token(token: str | None):
    """The active user a working token belongs to, or None (unknown, revoked, expired, or an
    inactive user)."""
    return check_token(token).user


def _bad_key(address: str | None) -> tuple[str, int]:
    window = int(time.time()) // WINDOW_S
    return f"gymweb:bad-token:{address or '-'}:{window}", window


def bad_token_wait(address: str | None) -> int:
    """Seconds until ``address`` may try tokens again (0: it may now): after
    ``GYMWEB_API_BAD_TOKENS_PER_MINUTE`` wrong tokens in the current minute, the rest of it."""
    key, window = _bad_key(address)
    if (cache.get(key) or 0) < int(settings.GYMWEB_API_BAD_TOKENS_PER_MINUTE):
        return 0
    return max(1, (window + 1) * WINDOW_S - int(time.time()))


def count_bad_token(address: str | None) -> None:
    """Count one wrong token from ``address`` in the current minute's counter."""
    key, _ = _bad_key(address)
    if cache.add(key, 1, WINDOW_S + 5):
        return
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, WINDOW_S + 5)
