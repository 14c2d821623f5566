"""Sign-in throttling per client address, on top of django-axes' per user name and address lock.

django-axes (``AXES_LOCKOUT_PARAMETERS``) locks one user name from one address after
``GYMWEB_SIGNIN_FAILURE_LIMIT`` wrong passwords; spraying one password over many user names from
one address never reaches that. ``AddressLimitedHandler`` (``AXES_HANDLER``) also refuses an
address, whatever the user name, once its failed sign-ins within ``GYMWEB_SIGNIN_LOCKOUT_MINUTES``
reach ``GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT`` (0: no such limit). The address is axes' client
address (``rollouts.web.sessions.client_address``: the real client behind trusted proxies).
"""

from __future__ import annotations

from datetime import datetime

from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Max, Sum
from django.utils import timezone


def _address(request) -> str | None:
    return getattr(request, "axes_ip_address", None)


def address_failures(address: str | None) -> tuple[int, datetime | None]:
    """Failed sign-ins recorded from ``address`` within the cool-off window, over every user name,
    and the time of the latest (None without any)."""
    if not address or not settings.AXES_COOLOFF_TIME:
        return 0, None
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    row = AccessAttempt.objects.filter(ip_address=address, attempt_time__gte=since).aggregate(
        failures=Sum("failures_since_start"), latest=Max("attempt_time")
    )
    return int(row["failures"] or 0), row["latest"]


def address_locked_until(request) -> datetime | None:
    """When the request's address may sign in again, or None if the address is not refused."""
    limit = int(settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT)
    if limit <= 0:
        return None
    failures, latest = address_failures(_address(request))
    if failures < limit or latest is None:
        return None
    return latest + settings.AXES_COOLOFF_TIME


def pair_locked_until(request, credentials: dict | None) -> datetime | None:
    """When the user name in ``credentials`` may sign in again from the request's address (None
    when unknown)."""
    username = (credentials or {}).get("username")
    address = _address(request)
    if not username or not address or not settings.AXES_COOLOFF_TIME:
        return None
    latest = AccessAttempt.objects.filter(username=username, ip_address=address).aggregate(latest=Max("attempt_time"))[
        "latest"
    ]
    return latest + settings.AXES_COOLOFF_TIME if latest else None


class AddressLimitedHandler(AxesDatabaseHandler):
    """django-axes' database handler plus the per-address limit; marks the request
    ``gymweb_address_locked`` when that limit is what refused it."""

    def is_locked(self, request, credentials: dict | None = None) -> bool:
        if super().is_locked(request, credentials):
            return True
        if address_locked_until(request) is not None:
            request.gymweb_address_locked = True
            return True
        return False

    def user_login_failed(self, sender, credentials: dict, request=None, **kwargs):
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or getattr(request, "axes_locked_out", False):
            return
        if address_locked_until(request) is not None:
            # This failure reached the address's limit: this answer is already the lockout page.
            request.gymweb_address_locked = True
            request.axes_locked_out = True
            request.axes_credentials = credentials
