"""When a session or a form's CSRF token has run out: send the user to sign in and back to the
page they were on, never into a fragment or an action URL.

- ``SignInRedirectMiddleware``: ``@login_required`` answers a signed-out request with a 302 to
  the sign-in page whose ``next`` is the request's own URL. That is right for a page, wrong for

  * an HTMX request (a poll, a lazy chart, a filter change): HTMX would follow the 302 and paste
    the whole sign-in page into the target. It gets ``HX-Redirect`` (the browser navigates) to
    the sign-in page with ``next`` = the page in the address bar (``HX-Current-URL``);
  * a POST action (Retry, Cancel): after signing in, ``next`` would GET the action URL (405).
    ``next`` becomes the page the form was on (``Referer``) or the run's page.

- ``locked_out`` (``AXES_LOCKOUT_CALLABLE``): the page django-axes shows a throttled sign-in.
- ``csrf_failure`` (``CSRF_FAILURE_VIEW``): a form sent with a stale CSRF token (signed out or in
  again in another tab, cookies cleared) gets a page that says nothing was done and links back
  to the page (or to sign in, then back), instead of Django's bare 403.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect

SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


def _local_path(request, url: str) -> str | None:
    """``url`` (absolute or not) as a path with its query, when it points at this site; else None."""
    if not url or not url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return None
    parts = urlsplit(url)
    if not parts.path.startswith("/"):
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def page_of(request) -> str:
    """The page the user was looking at when they sent ``request``: the address bar of an HTMX
    request (``HX-Current-URL``), else the ``Referer`` (same site only), else the run's page for
    a URL under ``/runs/<id>/``, else the runs list. A plain GET of a page is that page."""
    if request.method in SAFE_METHODS and not _is_htmx(request):
        return request.get_full_path()
    for header in ("HX-Current-URL", "Referer") if _is_htmx(request) else ("Referer",):
        path = _local_path(request, request.headers.get(header, ""))
        if path:
            return path
    match = getattr(request, "resolver_match", None)
    run_id = match.kwargs.get("run_id") if match else None
    return reverse("run", args=[run_id]) if run_id is not None else reverse("runs")


def _is_sign_in_redirect(response) -> bool:
    if response.status_code != 302:
        return False
    location = urlsplit(response.get("Location", ""))
    return location.path == urlsplit(resolve_url(settings.LOGIN_URL)).path


class SignInRedirectMiddleware:
    """Rewrites ``@login_required``'s redirect of an HTMX request or a POST action (see the module
    docstring). Must come after ``AuthenticationMiddleware``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if not _is_sign_in_redirect(response) or (user is not None and user.is_authenticated):
            return response
        htmx = _is_htmx(request)
        if not htmx and request.method in SAFE_METHODS:
            return response
        url = redirect_to_login(page_of(request)).url
        if htmx:
            # A 200 with HX-Redirect: HTMX swaps nothing and navigates the whole window.
            return HttpResponseClientRedirect(url)
        return HttpResponseRedirect(url)


def csrf_failure(request, reason: str = ""):
    """``CSRF_FAILURE_VIEW``: 403 with a page that says the form was not acted on and links back to
    the page it came from (through sign-in when the session is gone). ``reason`` is Django's."""
    back = page_of(request)
    signed_in = bool(getattr(request, "user", None) and request.user.is_authenticated)
    context = {
        "back": back,
        "signed_in": signed_in,
        "sign_in_url": redirect_to_login(back).url,
        "reason": reason,
    }
    return render(request, "403_csrf.html", context, status=403)


def locked_out(request, original_response=None, credentials=None):
    """``AXES_LOCKOUT_CALLABLE``: a throttled sign-in (django-axes) gets 429, a ``Retry-After``
    header (seconds) and a page saying why (this user name from this address, or this address over
    many user names), when to try again (``GYMWEB_SIGNIN_LOCKOUT_MINUTES`` after the latest
    failure) and how to unlock."""
    from django.utils import timezone

    from rollouts.web.signin_limits import address_locked_until, pair_locked_until

    cooloff = settings.AXES_COOLOFF_TIME
    minutes = round(cooloff.total_seconds() / 60) if cooloff else None
    address_until = address_locked_until(request)
    by_address = bool(getattr(request, "gymweb_address_locked", False)) and address_until is not None
    until = address_until if by_address else pair_locked_until(request, credentials)
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "address_limit": settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT,
        "by_address": by_address,
        "minutes": minutes,
        "until": until,
    }
    response = render(request, "registration/locked_out.html", context, status=429)
    if until is not None:
        response["Retry-After"] = str(max(1, int((until - timezone.now()).total_seconds()) + 1))
    return response


def client_address(request) -> str | None:
    """The client's address for the sign-in lockout (django-axes' ``AXES_CLIENT_IP_CALLABLE``).

    With ``GYMWEB_TRUSTED_PROXIES`` = N > 0, the N-th address from the right of ``X-Forwarded-For``:
    each proxy appends the address it was reached from, so the right-most N entries are the trusted
    proxies' own writing and anything further left is what the client sent (and could forge). With
    fewer entries than N, or N = 0, the connection's own address (``REMOTE_ADDR``)."""
    trusted = int(settings.GYMWEB_TRUSTED_PROXIES)
    if trusted > 0:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
        if len(hops) >= trusted:
            return hops[-trusted]
    return request.META.get("REMOTE_ADDR")
