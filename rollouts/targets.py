"""The instance's target policy, built from the settings (the engine's ``rollouts.engine.targets``
takes it as plain data). Every path that sends a request to a user's agent or env gets its client
or its check from here: the forms (new run, check page, API), Retry, the dispatcher (workers and
``collect``), ``check_agent``, reverify and ``/aggregate_metrics``.

Settings (docs/production.md, "Which hosts a run may reach"): ``GYMWEB_ALLOWED_TARGET_HOSTS`` (list of entries),
``GYMWEB_ALLOW_LOCAL_TARGETS`` (bool), ``GYMWEB_MAX_REPLY_BYTES`` (int, bytes).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured

from rollouts.engine.http import LoopClient, make_client
from rollouts.engine.policy_transports import make_sync_client
from rollouts.engine.targets import InvalidAllowEntry, TargetPolicy, TargetRefused

__all__ = ["TargetRefused", "async_client", "check_url", "max_reply_bytes", "policy", "refused_services", "sync_client"]


def policy() -> TargetPolicy:
    """The policy of the current settings. Raises ``ImproperlyConfigured`` naming a bad entry of
    ``GYMWEB_ALLOWED_TARGET_HOSTS``."""
    try:
        return TargetPolicy.from_settings(settings.GYMWEB_ALLOW_LOCAL_TARGETS, settings.GYMWEB_ALLOWED_TARGET_HOSTS)
    except InvalidAllowEntry as exc:
        raise ImproperlyConfigured(str(exc)) from None


def refusal_of_misspelled(url: str) -> TargetRefused | None:
    """For a URL ``loop.validate_base_url`` refused: the policy's refusal of its host when the host
    is an IP literal (any spelling) or a name the policy refuses by itself, else None. A refused
    host is named as refused whatever else is wrong with its spelling: that is what to act on."""
    try:
        parts = urlsplit((url or "").strip())
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        current = policy()
    except (ValueError, ImproperlyConfigured):
        return None
    try:
        current.check_literal(host, port)
    except TargetRefused as exc:
        return exc
    return None


def max_reply_bytes() -> int:
    """``GYMWEB_MAX_REPLY_BYTES`` (default 64 MB), at least 1."""
    return max(1, int(settings.GYMWEB_MAX_REPLY_BYTES))


def check_url(url: str, *, resolve_names: bool = True) -> None:
    """Judge a target base URL now (``TargetPolicy.check_url``: literal spellings, metadata names,
    and a name's current addresses). Raises ``TargetRefused``; the connection-time checks still
    apply when requests are sent."""
    policy().check_url(url, resolve_names=resolve_names)


def refused_services(agent_url: str, env_url: str) -> list[str]:
    """Why the policy refuses a run's services now, one sentence per refused URL (empty: both
    allowed), e.g. for Retry of a run launched before the policy changed. Each sentence names the
    service, the rule and the setting to change."""
    out = []
    current = policy()
    for what, url in (("agent URL", agent_url), ("env URL", env_url)):
        if not url:
            continue
        try:
            current.check_url(url)
        except TargetRefused as exc:
            out.append(f"The run's {what} {url} is refused by this instance's target policy: {exc.reason}.")
    return out


def async_client(concurrency: int = 32) -> LoopClient:
    """``rollouts.engine.http.make_client`` with this instance's policy and reply cap (use inside an event loop)."""
    budget = settings.GYMWEB_REPLY_BUDGET_BYTES or None
    return make_client(
        concurrency,
        policy=policy(),
        max_reply_bytes=max_reply_bytes(),
        reply_budget_bytes=budget,
        keepalive_s=settings.GYMWEB_HTTP_KEEPALIVE_S,
    )


def sync_client(timeout_s: float | None = 30.0) -> httpx.Client:
    """A sync client with this instance's policy and reply cap (``engine.policy_transports.make_sync_client``)."""
    return make_sync_client(policy(), max_reply_bytes(), timeout_s=timeout_s)


@register("gymweb")
def check_target_settings(app_configs=None, **kwargs):
    """``manage.py check``: every ``GYMWEB_ALLOWED_TARGET_HOSTS`` entry parses."""
    try:
        policy()
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="entries are host, host:port, an IP, a CIDR range, or one of those with :port",
                id="gymweb.E010",
            )
        ]
    return []
