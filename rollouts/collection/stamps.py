"""NeMo Gym's routing stamps on result rows, and the environment server name they carry.

NeMo Gym 0.7.0's collector (``rollout_collection.py``) ends every result of a remote_agent run with
``_ng_environment_server`` (the ``legacy_agent`` environment server it generates in front of the
agent, named by ``global_config.legacy_environment_server_name``) and ``_ng_result_type:
"legacy_agent"`` (that server's type); see ``eval_0.7.0/runA/rollouts.jsonl``. Its aggregation,
resume and health check group rows by the first. Pure Python (no Django): the export and the
aggregate-metrics code both use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AGENT_TYPE",
    "ENVIRONMENT_SERVER_KEY",
    "RESULT_TYPE",
    "RESULT_TYPE_KEY",
    "environment_server_name",
    "stamp",
]

AGENT_TYPE = "remote_agent"  # the agent server type gymweb stands in for
RESULT_TYPE = "legacy_agent"  # the environment server type NeMo Gym puts in front of it
ENVIRONMENT_SERVER_KEY = "_ng_environment_server"
RESULT_TYPE_KEY = "_ng_result_type"


def environment_server_name(agent_name: str) -> str:
    """The environment server NeMo Gym 0.7.0 generates in front of an agent of type ``remote_agent``
    (``global_config.legacy_environment_server_name``): the agent type, else a trailing ``_agent``,
    is stripped from the agent name and ``_environment_server`` appended. ``remote_agent`` (gymweb's
    default agent name) → ``remote_agent_environment_server``; ``my_agent`` → ``my_environment_server``;
    ``counter_remote_agent`` → ``counter_environment_server``."""
    stem = agent_name.removesuffix(f"_{AGENT_TYPE}").removesuffix(AGENT_TYPE).rstrip("_")
    if stem == agent_name:
        stem = agent_name.removesuffix("_agent").rstrip("_")
    return f"{stem or AGENT_TYPE}_environment_server"


def stamp(row: dict[str, Any], agent_ref: Any, add: bool, move: bool | None = None) -> dict[str, Any]:
    """Put the two stamps last on ``row`` (in place), where NeMo Gym's collector puts them, and
    return it. Values the row carries are kept; missing ones are added only with ``add`` (a run
    gymweb collected): the environment server of the ``agent_ref`` name (``remote_agent`` when it
    has none) and ``legacy_agent``. ``move`` (default: ``add``) False leaves the row untouched, stamps
    where they came: an imported success row is stored as it came, so its export gives the line back;
    an imported failure row is rebuilt from its task row, so its stamps are moved last (``move=True``)
    to give NeMo Gym's sidecar line back."""
    if not (add if move is None else move):
        return row
    server = row.pop(ENVIRONMENT_SERVER_KEY, None)
    result_type = row.pop(RESULT_TYPE_KEY, None)
    if add and not isinstance(server, str):
        name = agent_ref.get("name") if isinstance(agent_ref, dict) else None
        server = environment_server_name(name if isinstance(name, str) and name else AGENT_TYPE)
    if server is not None:
        row[ENVIRONMENT_SERVER_KEY] = server
    if add and not isinstance(result_type, str):
        result_type = RESULT_TYPE
    if result_type is not None:
        row[RESULT_TYPE_KEY] = result_type
    return row
