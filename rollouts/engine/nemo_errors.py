"""NeMo Gym 0.7.0's ``error`` texts: what its remote_agent writes in a failure row for each failure.

gymweb shows its own explained message (``Failure.message``) in the database, the pages and the
API; the failures sidecar and the results stream carry NeMo Gym's text, built here from what gymweb
saw (the status, reason phrase and URL of a refused env call, the agent's reply, the exception of a
failed connection) and stored with the attempt (``Rollout.nemo_error``). Source:
``responses_api_agents/remote_agent/app.py`` (``run``, ``_run_once``, ``_post_agent_responses``) and
``nemo_gym/server_utils.py`` (``raise_for_status``, the exception middleware, the request retries),
recorded from NeMo Gym's own ``gym eval run`` in ``tests/data/failure_text_rows.json``
(``scripts/record_failure_text_rows.py``).

- The env (``/seed_session``, ``/verify``) answering an error status: ``/{route} on the resources
  server failed: ClientResponseError: {status}, message={reason!r}, url={url!r}`` (aiohttp's
  ``ClientResponseError`` text, the URL as aiohttp writes it).
- The env not reachable, or not speaking HTTP, at any step: NeMo Gym's client retries an internal
  call for ever, so the rollout ends at its run bound: ``run_timeout``.
- The agent service failing: its ``/v1/responses`` hop raises ``RemoteAgentError`` (or
  ``RemoteAgentTerminalError`` for an invalid Responses object), which reaches ``run()`` as the
  JSON-encoded ``repr`` in a 500 body: ``agent loop failed: "RemoteAgentError('...')"``, the body cut
  at 500 characters (``agent_loop``).

No Django here.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import yarl

__all__ = [
    "INVALID_REPLY",
    "agent_loop",
    "agent_reply",
    "agent_timeout",
    "agent_transport",
    "agent_unreachable",
    "env_status",
    "internal_error",
    "run_timeout",
]

_EXCERPT = 500  # NeMo Gym keeps the first 500 bytes of an agent's error body, 500 characters of a detail
AGENT_ERROR = "RemoteAgentError"
TERMINAL_ERROR = "RemoteAgentTerminalError"
INVALID_REPLY = "remote service returned an invalid Responses API object: "


def env_status(route: str, status: int, reason: str | None, url: str) -> str:
    """The text for the env answering ``status`` (with ``reason``, the reply's reason phrase) to
    ``url``, the URL gymweb called (``route``: ``seed_session`` or ``verify``). NeMo Gym raises only
    for a status of 400 and more (it follows a redirect); gymweb writes the same text for any status
    it refuses."""
    real_url = str(yarl.URL(url))
    return (
        f"/{route} on the resources server failed: ClientResponseError: "
        f"{status}, message={reason or ''!r}, url={real_url!r}"
    )


def run_timeout(run_timeout_s: float) -> str:
    """The text for a rollout past its run bound (``run_timeout_secs``, seconds), and for an env that
    cannot be reached: NeMo Gym retries an internal call until the bound ends the rollout."""
    return f"/run exceeded run_timeout_secs={float(run_timeout_s)!r}s (seed + agent/tool loop + verify)"


def internal_error(exc: BaseException) -> str:
    """The text for an unexpected exception in the rollout (NeMo Gym's ``run()`` catch-all)."""
    return f"unexpected error: {type(exc).__name__}: {exc}"


def agent_loop(message: str, error_class: str = AGENT_ERROR) -> str:
    """The text ``run()`` writes when its ``/v1/responses`` hop raised ``error_class(message)``: the
    exception middleware's 500 body (``JSONResponse(repr(e))``) cut at 500 characters."""
    body = json.dumps(f"{error_class}({message!r})", ensure_ascii=False, separators=(",", ":"))
    return "agent loop failed: " + body[:_EXCERPT]


def agent_timeout(timeout_s: float) -> str:
    """The text for an agent service that did not answer within ``remote_responses_timeout_secs``."""
    return agent_loop(
        f"remote /v1/responses timed out after {float(timeout_s)!r}s "
        "(remote_responses_timeout_secs; raise it if agent calls legitimately run longer)"
    )


def agent_unreachable(attempts: int, exc: BaseException | None, agent_base_url: str) -> str:
    """The text for an agent service that could not be reached in ``attempts`` tries, the last one
    failing with ``exc`` (aiohttp's exception, e.g. ``ClientConnectorError``)."""
    return agent_loop(
        f"could not reach the remote service after {attempts} tries ({type(exc).__name__}: {exc}). "
        f"Is your service running at {agent_base_url}?"
    )


def agent_transport(exc: BaseException) -> str:
    """The text for an agent call that failed in the transport other than by a refused or dropped
    connection (e.g. a reply that is not HTTP): NeMo Gym's ``{type}: {e}``."""
    return agent_loop(f"{type(exc).__name__}: {exc}")


def agent_reply(status: int, location: str | None, content: bytes, validation_text: str | None = None) -> str | None:
    """The text for an agent reply NeMo Gym refuses (checked in its order: a status of 300 or more,
    a body orjson cannot read, a JSON value that is not an object, an invalid Responses object), or
    None when it takes the reply. ``location``: the reply's first ``Location`` header; ``content``:
    its body; ``validation_text``: the validation error's text when the reply is not a valid
    Responses object (``contract.InvalidReply.validation_text``), None when it is valid."""
    if status >= 300 or status < 200:
        redirect = f" (redirect to {location}; fix agent_base_url to point at the final address)" if location else ""
        return agent_loop(f"HTTP {status}{redirect}: {content[:_EXCERPT].decode(errors='replace')}")
    try:
        data: Any = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        return agent_loop(f"response is not valid JSON: {exc}")
    if not isinstance(data, dict):
        return agent_loop(f"expected a JSON object from /v1/responses, got {type(data).__name__}")
    if validation_text is not None:
        return agent_loop(INVALID_REPLY + validation_text[:_EXCERPT], TERMINAL_ERROR)
    return None
