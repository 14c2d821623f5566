"""How a rollout fails: ``FailureKind`` (the stable strings stored with a failed attempt) and
``Failure``, the exception that carries one through the engine until the loop turns it into data.

A ``Failure`` raised by the HTTP client (``rollouts.engine.http``) has either one of the kinds the
client names itself (``OWN_KINDS``: the target policy, the reply cap, the reply budget), kept as they
are, or a transport kind (``UNREACHABLE``, ``NOT_HTTP``, ``TIMEOUT``) that the loop turns into the
kind of the step that failed.
"""

from __future__ import annotations

__all__ = ["OWN_KINDS", "NOT_HTTP", "TIMEOUT", "UNREACHABLE", "Failure", "FailureKind", "kind_for_step"]


class FailureKind:
    """gymweb's finer failure classification (DESIGN.md, "Failure rows"). Values are stable strings."""

    AGENT_UNREACHABLE = "agent_unreachable"
    AGENT_TIMEOUT = "agent_timeout"
    AGENT_HTTP_ERROR = "agent_http_error"
    AGENT_REDIRECT = "agent_redirect"
    AGENT_BAD_JSON = "agent_bad_json"
    AGENT_INVALID_RESPONSE = "agent_invalid_response"
    SEED_FAILED = "seed_failed"
    TOOL_TRANSPORT_FAILED = "tool_transport_failed"
    VERIFY_FAILED = "verify_failed"
    ROLLOUT_TIMEOUT = "rollout_timeout"
    INTERNAL_ERROR = "internal_error"
    # The target policy refused to connect to the agent or the env (rollouts.engine.targets).
    TARGET_REFUSED = "target_refused"
    # A reply of the agent or the env was larger than GYMWEB_MAX_REPLY_BYTES.
    REPLY_TOO_LARGE = "reply_too_large"
    # The replies being read at once in the worker passed GYMWEB_REPLY_BUDGET_BYTES (not terminal).
    REPLY_OVER_BUDGET = "reply_over_budget"
    # Set by the dispatcher, never by the loop: part of the attempt could not be stored.
    STORAGE_FAILED = "storage_failed"

    ALL = (
        AGENT_UNREACHABLE,
        AGENT_TIMEOUT,
        AGENT_HTTP_ERROR,
        AGENT_REDIRECT,
        AGENT_BAD_JSON,
        AGENT_INVALID_RESPONSE,
        SEED_FAILED,
        TOOL_TRANSPORT_FAILED,
        VERIFY_FAILED,
        ROLLOUT_TIMEOUT,
        INTERNAL_ERROR,
        STORAGE_FAILED,
        TARGET_REFUSED,
        REPLY_TOO_LARGE,
        REPLY_OVER_BUDGET,
    )
    # Only an invalid Responses object is terminal: retrying cannot fix it (rule 3).
    TERMINAL = frozenset({AGENT_INVALID_RESPONSE})


# The kinds the HTTP client names itself; every caller keeps them as they are.
OWN_KINDS = (FailureKind.TARGET_REFUSED, FailureKind.REPLY_TOO_LARGE, FailureKind.REPLY_OVER_BUDGET)

# Transport kinds: never stored, always turned into the failing step's kind by the loop.
UNREACHABLE = "unreachable"  # refused, reset or dropped before a reply, every attempt (rule 11)
NOT_HTTP = "not_http"  # the peer answered with something that is not HTTP (not retried)
TIMEOUT = "timeout"  # no reply within the call's own bound (rule 12)


class Failure(Exception):
    """A rollout step failed: ``kind`` (a ``FailureKind`` value or a transport kind), ``message``
    (the explained error shown to the user) and ``nemo`` (NeMo Gym's ``error`` text for the same
    failure, ``rollouts.engine.nemo_errors``; None: the same as ``message``, or NeMo Gym has none).
    A transport failure (``UNREACHABLE``, ``NOT_HTTP``) also carries ``cause``, the last transport
    exception as aiohttp raised it, and ``attempts``, the connection tries that failed."""

    def __init__(
        self,
        kind: str,
        message: str,
        nemo: str | None = None,
        cause: BaseException | None = None,
        attempts: int = 0,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.nemo = nemo
        self.cause = cause
        self.attempts = attempts


def kind_for_step(exc: Failure, default: str) -> str:
    """The failure kind for a failed env call: its own kind when the target policy, the reply cap or
    the reply budget ended it, else ``default`` (the step's kind)."""
    return exc.kind if exc.kind in OWN_KINDS else default
