"""A run's settings checked in one place: the limits and defaults of every knob a run takes (the
new-run form, the API and ``collect`` all check with these functions). A refusal is a
``SettingError`` naming the field; its message names the setting as the caller spells it
(``what``: ``--concurrency`` on the command line, nothing on a form field)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from rollouts.engine.contract import NotJSON, strict_loads
from rollouts.engine.loop import (
    DEFAULT_CONCURRENCY,
    DEFAULT_REMOTE_RESPONSES_TIMEOUT_S,
    DEFAULT_RUN_TIMEOUT_S,
    InvalidBaseURL,
    validate_base_url,
)

# The reason kept on a run launched with ``env_aggregate_metrics`` off (the API's run setting):
# its env is never asked for ``/aggregate_metrics`` and no task is queued for it. A NeMo Gym env
# computes the reply in its event loop, so the call stalls every rollout the env is serving
# meanwhile (a training loop's next batch).
NOT_ASKED = (
    "not called: the run was launched with env_aggregate_metrics off "
    "(as NeMo Gym's run_examples, which never calls /aggregate_metrics)"
)


class SettingError(ValueError):
    """A run setting is refused: ``field`` (the ``Run`` field), ``message`` (what is wrong, whole),
    ``code`` (a short kind, as Django's validation error codes)."""

    def __init__(self, field: str, message: str, code: str = "invalid"):
        super().__init__(message)
        self.field, self.message, self.code = field, message, code


@dataclass(frozen=True)
class Limit:
    """The range of a numeric setting: ``minimum`` and ``maximum`` included (None: unbounded)."""

    kind: type
    minimum: float
    maximum: float | None
    default: Any
    unit: str = ""


DEFAULT_MAX_ATTEMPTS = 3
MAX_STORED_INT = 2_147_483_647  # a PositiveIntegerField's largest value on PostgreSQL (a 32-bit integer)
DEFAULT_AGENT_NAME = "remote_agent"
NAME_MAX_CHARS = 200

LIMITS: dict[str, Limit] = {
    # at most GYMWEB_MAX_RUN_CONCURRENCY: ``maximum``
    "concurrency": Limit(int, 1, None, DEFAULT_CONCURRENCY),
    "max_steps": Limit(int, 0, MAX_STORED_INT, None),  # None or 0: unbounded
    "num_repeats": Limit(int, 1, 100_000, 1),
    "limit": Limit(int, 1, MAX_STORED_INT, None),  # None: every row
    "max_attempts": Limit(int, 1, 100, DEFAULT_MAX_ATTEMPTS),
    "remote_responses_timeout_s": Limit(float, 0.001, 1e9, DEFAULT_REMOTE_RESPONSES_TIMEOUT_S, " s"),
    # at most GYMWEB_MAX_RUN_TIMEOUT_S: ``maximum``
    "run_timeout_s": Limit(float, 0.001, None, DEFAULT_RUN_TIMEOUT_S, " s"),
    # the run's calls out to its env at once (rollouts.engine.env_gate); 0: the server's bound
    "env_max_in_flight": Limit(int, 0, 100_000, 0),
}

RESPONSES_PATH = "/v1/responses"


def max_run_timeout_s() -> float:
    """The largest ``run_timeout_s`` a run may have: django-q2's cluster timeout is derived from it
    so a long rollout is never killed mid-flight (DESIGN.md, known pitfalls)."""
    return float(settings.GYMWEB_MAX_RUN_TIMEOUT_S)


def maximum(field: str) -> float | None:
    """The largest value of numeric setting ``field`` on this server (None: unbounded)."""
    if field == "run_timeout_s":
        return max_run_timeout_s()
    if field == "concurrency":
        return int(settings.GYMWEB_MAX_RUN_CONCURRENCY)
    return LIMITS[field].maximum


def default(field: str) -> Any:
    """The value a run takes when ``field`` is not given (``run_timeout_s``: 2100 s, or the
    server's maximum when that is lower)."""
    if field == "run_timeout_s":
        return min(DEFAULT_RUN_TIMEOUT_S, max_run_timeout_s())
    return LIMITS[field].default


def say(what: str | None, problem: str) -> str:
    """``problem`` (``must be …``) as a whole message: after ``what`` when given, else capitalised."""
    return f"{what} {problem}" if what else problem[:1].upper() + problem[1:]


def _n(number: float) -> str:
    """A limit or value as a person reads it: whole numbers in full (100000000, not 1e+08), up to
    30 digits (a longer one as ``1.181e+21``; ints past a float's range too)."""
    if isinstance(number, int) or (math.isfinite(number) and number.is_integer()):
        whole = int(number)
        return str(whole) if abs(whole) < 10**30 else format(Decimal(whole), ".3e")
    return f"{number:g}"


def check_number(field: str, value: Any, what: str | None = None) -> Any:
    """``value`` of numeric setting ``field`` within its limits (None stays None where the setting
    is optional); raises ``SettingError`` otherwise."""
    limit = LIMITS[field]
    if value is None and limit.default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingError(field, say(what, f"must be a number, got {value!r}"), "invalid")
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingError(field, say(what, f"must be a finite number, got {value}"), "invalid")
    if limit.kind is int and isinstance(value, float) and not value.is_integer():
        raise SettingError(field, say(what, f"must be a whole number, got {value!r}"), "invalid")
    # Compared before converting: Python compares an int past a float's range with a float exactly.
    if value < limit.minimum:
        raise SettingError(
            field, say(what, f"must be at least {_n(limit.minimum)}{limit.unit}, got {_n(value)}"), "min_value"
        )
    top = maximum(field)
    if top is not None and value > top:
        where = {
            "run_timeout_s": " on this server (GYMWEB_MAX_RUN_TIMEOUT_S)",
            "concurrency": " on this server (GYMWEB_MAX_RUN_CONCURRENCY)",
        }.get(field, "")
        raise SettingError(
            field, say(what, f"must be at most {_n(top)}{limit.unit}{where}, got {_n(value)}"), "max_value"
        )
    return limit.kind(value)


def check_agent_name(value: str, what: str | None = None) -> str:
    """The agent's name in the output rows (``agent_ref.name``): not empty, at most 200 characters."""
    if not value or not value.strip():
        raise SettingError("agent_name", say(what, "must not be empty"), "required")
    if len(value) > NAME_MAX_CHARS:
        raise SettingError(
            "agent_name", say(what, f"must be at most {NAME_MAX_CHARS} characters, got {len(value)}"), "max_length"
        )
    return value


def check_url(field: str, raw: str, what: str) -> str:
    """A service's base URL (``agent_url``, ``env_url``, ``head_url``): ``loop.validate_base_url``
    (absolute http(s), no credentials, query or fragment; trailing slash dropped); an agent's must
    not end in ``/v1/responses``, which gymweb appends itself (DESIGN.md, the contract). Messages
    start with ``what`` and never echo credentials. The target policy is judged apart (the pages
    and the API refuse up front; ``collect``'s rollouts fail with ``target_refused``)."""
    try:
        url = validate_base_url(raw, what)
    except InvalidBaseURL as exc:
        raise SettingError(field, str(exc), "invalid_url") from None
    if field == "agent_url":
        check_agent_path(url)
    return url


def check_agent_path(url: str, field: str = "agent_url") -> str:
    """Refuse an agent base URL ending in ``/v1/responses`` (it would be called as
    ``…/v1/responses/v1/responses``); the message names the base URL to enter."""
    if url.rstrip("/").endswith(RESPONSES_PATH):
        base = url.rstrip("/")[: -len(RESPONSES_PATH)]
        raise SettingError(
            field,
            f"Enter the agent's base URL without {RESPONSES_PATH}: gymweb appends {RESPONSES_PATH} "
            f"itself (it would call {url}{RESPONSES_PATH}). Did you mean {base}?",
            "responses_path",
        )
    return url


def check_overrides(value: Any, what: str | None = None) -> dict[str, Any]:
    """Overrides merged into every row's ``responses_create_params``: JSON text or a parsed value,
    an object whose ``input`` (if any) is a string or list and whose ``tools`` (if any) is a list.
    Empty text or None: ``{}``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, (str, bytes)):
        try:
            value = strict_loads(value)
        except NotJSON as exc:
            raise SettingError("overrides", say(what, f"not valid JSON: {exc}"), "invalid_json") from None
    if not isinstance(value, dict):
        raise SettingError(
            "overrides",
            say(what, f'must be a JSON object like {{"temperature": 0.2}}, not a {type(value).__name__}'),
            "not_object",
        )
    if "input" in value and not isinstance(value["input"], (str, list)):
        raise SettingError("overrides", say(what, "'input' must be a string or a list of items"), "invalid_overrides")
    if "tools" in value and not isinstance(value["tools"], list):
        raise SettingError("overrides", say(what, "'tools' must be a list"), "invalid_overrides")
    return value


def check_numbers(values: dict[str, Any], what: dict[str, str] | None = None) -> dict[str, Any]:
    """Every numeric setting of ``values`` (``LIMITS``' keys) checked, the others kept; ``what``
    names a setting as the caller spells it. Raises the first ``SettingError``."""
    out = dict(values)
    for field in LIMITS:
        if field in values:
            out[field] = check_number(field, values[field], (what or {}).get(field))
    return out
