"""The two HTMX rules every page with live parts follows (DESIGN.md, known pitfalls)."""

from __future__ import annotations

from django.utils.cache import patch_vary_headers


def wants_partial(request) -> bool:
    """An HTMX request that swaps part of a page; a history restore needs the whole page."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request


def vary_on_htmx(response):
    """Mark a response that differs by ``HX-Request`` so no cache serves a partial as a page."""
    patch_vary_headers(response, ("HX-Request",))
    return response
