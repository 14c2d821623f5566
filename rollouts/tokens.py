"""Per-user API tokens (``Authorization: Bearer gw_…``). Only a token's SHA-256 is stored: the
token is shown once, when it is made, and cannot be read back; deleting it revokes it at once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone

from rollouts.models import ApiToken

PREFIX = "gw_"
LAST_USED_GRANULARITY = timedelta(minutes=1)  # don't write a row on every request


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(user, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user``: ``(row, token)``; the token text exists only in this return value."""
    token = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user, name=(name or "").strip()[:100] or "API token", prefix=token[:10], digest=digest(token)
    )
    return row, token


def user_for_token(token: str | None):
    """The active user a token belongs to, or None (unknown token, revoked, or inactive user).
    Records when the token was last used (at most once a minute)."""
    if not token or not token.startswith(PREFIX) or len(token) > 200:
        return None
    row = ApiToken.objects.select_related("user").filter(digest=digest(token)).first()
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used is None or now - row.last_used > LAST_USED_GRANULARITY:
        ApiToken.objects.filter(pk=row.pk).update(last_used=now)
    return row.user
