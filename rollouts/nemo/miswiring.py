"""The silent mis-wiring: an "agent URL" that is NeMo Gym's own agent server.

``gym env start`` prints one URL for ``remote_agent``: the URL of NeMo Gym's remote_agent *server*,
which itself calls the user's agent service (its ``agent_base_url``) and runs the environment's
tools in a session of its own. Pointed at it, gymweb gets replies whose ``function_call`` items
already carry their ``function_call_output``: gymweb's env session sees no tool call, ``/verify``
scores an untouched session, and every rollout "succeeds" at reward 0.0.

Two signs, both read here:

- the server: its OpenAPI document serves NeMo Gym's ``/run`` beside ``/v1/responses``
  (``SimpleResponsesAPIAgent``, ``nemo_gym/base_responses_api_agent.py``);
- the replies: tool results for the environment's own tools that the environment never executed
  through gymweb (``unexecuted_tool_results``).

No Django here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "FAILURE_CODE",
    "ROLLOUT_WARNING",
    "agent_server_routes",
    "declared_tools",
    "explain",
    "is_nemo_gym_agent_server",
    "rollout_warning",
    "unexecuted_tool_results",
]

FAILURE_CODE = "nemo_gym_agent_server"
# The start of the warning stored on a rollout whose agent reported results of the env's tools.
ROLLOUT_WARNING = "tool results the environment never executed"
AGENT_SERVER_ROUTES = ("/run", "/v1/responses")


def agent_server_routes(openapi: dict[str, Any] | None) -> list[str]:
    """NeMo Gym agent-server routes an OpenAPI document declares (``/run``, ``/v1/responses``,
    ``/aggregate_metrics``), in that order."""
    paths = (openapi or {}).get("paths")
    if not isinstance(paths, dict):
        return []
    return [p for p in ("/run", "/v1/responses", "/aggregate_metrics") if p in paths]


def is_nemo_gym_agent_server(openapi: dict[str, Any] | None) -> bool:
    """Whether an OpenAPI document is a NeMo Gym agent server's: it serves ``/run`` and
    ``/v1/responses`` (a plain agent service has no ``/run``)."""
    routes = agent_server_routes(openapi)
    return all(r in routes for r in AGENT_SERVER_ROUTES)


def explain(
    agent_url: str,
    *,
    agent_name: str | None = None,
    likely_url: str | None = None,
    head_url: str | None = None,
) -> str:
    """The plain-words explanation of the mis-wiring for ``agent_url``, naming the URL the user
    most likely meant (``likely_url``: the agent's ``agent_base_url`` in the head server's config)."""
    who = f"NeMo Gym's own agent server {agent_name!r}" if agent_name else "a NeMo Gym agent server (it serves /run)"
    text = (
        f"{agent_url} is {who}, not your agent service. NeMo Gym's agent server calls your agent "
        "itself and runs the environment's tools in a session of its own, so gymweb's environment "
        'session would see no tool call and every rollout would "succeed" at reward 0.0.'
    )
    if likely_url:
        source = (
            f" (agent_base_url of {agent_name!r} in the config of the head server at {head_url})"
            if head_url and agent_name
            else ""
        )
        text += f" Use your agent service's URL instead: {likely_url}{source}."
    else:
        text += (
            " Use your agent service's URL instead: the agent_base_url of the remote_agent block in your "
            "NeMo Gym config (or pass --config/--head-url and --agent-name, and no agent URL)."
        )
    return text


def unexecuted_tool_results(
    items: Iterable[tuple[dict[str, Any], str]], env_tools: Iterable[str] | None = None
) -> list[str]:
    """``call_id``s of tool results the agent reported for the environment's tools, which the
    environment never executed through gymweb.

    ``items``: a rollout's trajectory in order, as ``(item, origin)`` with origin ``"agent"`` (in a
    reply) or ``"gym"`` (gymweb ran the call on the env). ``env_tools``: the tool names the task
    declares (the env's tools); when empty or None, every agent-reported result counts. A result
    counts when the agent's own ``function_call_output`` answers one of its ``function_call``s for
    such a tool and gymweb ran no call with that ``call_id``.
    """
    tools = set(env_tools or ())
    names: dict[str, str] = {}
    ran: set[str] = set()
    reported: list[str] = []
    for item, origin in items:
        if not isinstance(item, dict):
            continue
        kind, call_id = item.get("type"), item.get("call_id")
        if not isinstance(call_id, str):
            continue
        if kind == "function_call" and origin == "agent":
            names[call_id] = str(item.get("name") or "")
        elif kind == "function_call_output":
            if origin == "gym":
                ran.add(call_id)
            elif call_id in names and (not tools or names[call_id] in tools):
                reported.append(call_id)
    return [c for c in dict.fromkeys(reported) if c not in ran]


def declared_tools(responses_create_params: Any) -> list[str]:
    """Names of the function tools a task declares (``responses_create_params.tools``)."""
    tools = (responses_create_params or {}).get("tools") if isinstance(responses_create_params, dict) else None
    if not isinstance(tools, list):
        return []
    return [str(t["name"]) for t in tools if isinstance(t, dict) and t.get("name")]


def rollout_warning(call_ids: list[str]) -> str:
    """The warning stored on a rollout (starts with ``ROLLOUT_WARNING``)."""
    return (
        f"{ROLLOUT_WARNING}: the agent's replies carry {len(call_ids)} result(s) of the environment's "
        "tools that gymweb never sent to the environment, so /verify scored a session the tools never "
        "touched. The agent URL is probably NeMo Gym's own agent server (remote_agent), not your agent service."
    )
