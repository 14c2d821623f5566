"""The agent conformance check's rules: what each finding code means (``CHECKS``: severity, rule,
how to fix it) and ``check_reply``, which finds every breach in one decoded reply (no I/O).

No Django here. ``rollouts.evaluation.conformance`` sends the probes and reports what this finds.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rollouts.engine.contract import (
    RESERVED_ENV_ROUTES,
    InvalidReply,
    Usage,
    arguments_problem,
    find_asks,
    has_assistant_message,
    parse_reply,
    tool_name_problem,
)
from rollouts.nemo.miswiring import unexecuted_tool_results

__all__ = ["CHECKS", "ERROR", "WARNING", "Check", "check_reply", "usable_items"]

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Check:
    """What a finding code means: its severity, the rule it comes from and how to fix it."""

    severity: str
    rule: str
    how_to_fix: str


_TOP_LEVEL = (
    'id (string), created_at (number, seconds), model (string), object: "response", output (list), '
    'parallel_tool_calls (bool), tool_choice ("auto" or an object) and tools (list)'
)

CHECKS: dict[str, Check] = {
    "target_refused": Check(
        ERROR,
        'gymweb\'s target policy (README, "Which hosts a run may reach")',
        "gymweb refused to connect to this host under its target policy; runs against it fail with "
        "target_refused. An administrator can allow it: list it in GYMWEB_ALLOWED_TARGET_HOSTS (host, host:port "
        "or CIDR), or, for loopback and private addresses on a local single-user set-up, "
        "set GYMWEB_ALLOW_LOCAL_TARGETS=1.",
    ),
    "reply_too_large": Check(
        ERROR,
        'gymweb\'s reply cap (README, "Which hosts a run may reach")',
        "The reply is larger than GYMWEB_MAX_REPLY_BYTES; gymweb stopped reading it and a rollout would fail with "
        "reply_too_large. Send smaller replies, or raise the cap.",
    ),
    "unreachable": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 11",
        "Start the service and check the URL: gymweb POSTs to {base_url}/v1/responses. It tries 3 times, then "
        'fails the rollout with "is your service running at ...?". Mind that HTTP_PROXY/HTTPS_PROXY are ignored.',
    ),
    "connection_dropped": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 11",
        "The service accepted the connection but closed it without an HTTP reply. Look for a crash in its logs "
        "(an exception in the handler, a worker killed for memory). gymweb retries 3 times, then fails the rollout.",
    ),
    "not_http": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 11",
        "Something answered that does not speak HTTP/1.1 at this address: check the port, and use https:// when "
        "the service expects TLS. The rollout fails at once.",
    ),
    "timeout": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 12",
        "Answer sooner, or raise the per-call timeout: remote_responses_timeout_s (NeMo Gym's "
        "remote_responses_timeout_secs, default 1800 s) for runs, --timeout for this check.",
    ),
    "redirect": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 1",
        "Point the agent URL (NeMo Gym's agent_base_url) at the final address (the Location shown). "
        "Redirects are never followed: a "
        "301/302/303 would turn the POST into a body-less GET, a 307/308 would send the task somewhere you never "
        "configured.",
    ),
    "http_error": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 2",
        "Answer every POST /v1/responses with HTTP 200 and a Responses object. The start of the body is shown; "
        "the service's logs say more. An error status fails the rollout (it is retried on resume).",
    ),
    "not_json": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 2",
        "Return the Responses object as JSON (Content-Type: application/json), not HTML or plain text.",
    ),
    "not_object": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 2",
        "Return one JSON object (the Responses object), not a list, a string or a number.",
    ),
    "invalid_response": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 3 (the reply's shape)",
        f"Return every required top-level field with its type: {_TOP_LEVEL}. Extra fields are fine. An invalid "
        "object is a terminal failure: the rollout is never retried.",
    ),
    "invalid_output_item": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 3 (the reply's shape)",
        'Give every output item a known type and its fields: message {id, role: "assistant", content: '
        '[{type: "output_text", text, annotations: []}]}; function_call {call_id, name, arguments: a JSON '
        "*string*}; function_call_output {call_id, output: a string}; reasoning {id, summary: []}. An invalid "
        "object is a terminal failure.",
    ),
    "partial_usage": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 3",
        "Report the full usage object (input_tokens, output_tokens, total_tokens, input_tokens_details: "
        "{cached_tokens}, output_tokens_details: {reasoning_tokens}) or leave usage out entirely. A partial "
        "usage is an invalid object: a terminal failure.",
    ),
    "no_usage": Check(
        WARNING,
        "docs/DESIGN.md, contract rule 3",
        "Report usage (input_tokens, output_tokens, total_tokens, input_tokens_details.cached_tokens, "
        "output_tokens_details.reasoning_tokens) to get token metrics. Leaving it out is allowed; the run's "
        "token metrics are then empty.",
    ),
    "undeclared_tool": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 5",
        "Ask only for tools the request's `tools` declared, by their exact name. gymweb still sends such a call to "
        "the environment and returns whatever it answers (usually a 404 text) as the output: a wasted step.",
    ),
    "unsafe_tool_name": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 5",
        "Use tool names that are one URL path segment (letters, digits, _ - . ~; no /, .., ?, #, %, spaces). "
        "gymweb never sends such a call; its output is an error text.",
    ),
    "reserved_tool_name": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 5",
        f"{', '.join(sorted(RESERVED_ENV_ROUTES))} are the environment's own routes: an agent may not call them "
        "(it could re-seed its session or verify itself). gymweb never sends such a call; its output is an error text.",
    ),
    "duplicate_call_id": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 4",
        "Give each function_call its own call_id (e.g. call_<random hex>). When asks share one, gymweb runs only "
        "the last of them, once.",
    ),
    "orphan_call_output": Check(
        ERROR,
        "docs/DESIGN.md, contract rule 4",
        "Only return a function_call_output together with the function_call of the same call_id (your own tool's "
        "record, paired in the same reply). Never answer a call nobody made; gymweb adds the outputs of the calls "
        "it runs itself.",
    ),
    "nemo_gym_agent_server": Check(
        ERROR,
        'docs/nemo-gym-environments.md, "The mis-wiring"',
        "This URL is NeMo Gym's own agent server (it serves /run), not your agent service: it calls your agent "
        "itself and runs the environment's tools in a session of its own, so gymweb's environment would see no "
        "tool call and every rollout would score 0.0. Use your agent service's URL (the agent_base_url of the "
        "agent in your NeMo Gym config), or run collect with --config/--head-url and --agent-name and no agent URL.",
    ),
    "agent_ran_env_tools": Check(
        WARNING,
        'docs/DESIGN.md, contract rule 4; docs/nemo-gym-environments.md, "The mis-wiring"',
        "The reply already carries the results of the environment's own tools (function_call + function_call_output "
        "for a declared tool): gymweb runs only unanswered calls, so the environment never sees these and /verify "
        "scores a session the tools never touched. Return the function_call alone and let gymweb run it, or point "
        "gymweb at your agent service instead of a server that runs the tools itself.",
    ),
    "repeated_call_id": Check(
        WARNING,
        "docs/DESIGN.md, contract rule 4",
        "Use a fresh call_id for every new ask. Pairing is judged within one reply, so an ask that reuses a "
        "call_id from earlier in the conversation is run again, and the conversation then holds two outputs "
        "for one call_id.",
    ),
    "arguments_not_json": Check(
        WARNING,
        "docs/DESIGN.md, contract rule 6",
        'Send arguments as a JSON-encoded string, e.g. json.dumps({"count": 1}). gymweb does not call the tool; '
        "the call's output is an error text naming the parse error, and the rollout goes on.",
    ),
    "no_progress": Check(
        WARNING,
        "docs/DESIGN.md, contract rule 10",
        'End every reply with unpaired function_call asks ("run these tools") or an assistant message '
        '("finished"). With neither, gymweb calls again at once; a service that never ends loops until '
        "max_steps or run_timeout_s.",
    ),
    "slow": Check(
        WARNING,
        "docs/DESIGN.md, contract rule 12",
        "Every call counts against remote_responses_timeout_s (per call) and run_timeout_s (whole rollout, "
        "default 2100 s). Slow replies also bound how many rollouts a run finishes per hour; raise the run's "
        "concurrency, or the timeouts, when this is expected.",
    ),
}


def usable_items(output: list[Any]) -> list[dict[str, Any]]:
    """Output items the semantic checks can read: dicts, with a string ``call_id`` on call items."""
    usable = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("function_call", "function_call_output") and not isinstance(item.get("call_id"), str):
            continue
        usable.append(item)
    return usable


# ---------------------------------------------------------------------------------------------
# Checking one reply (no I/O)
# ---------------------------------------------------------------------------------------------

_PREFIX = re.compile(r"^\d+ validation error\(s\): ")
_ENVELOPE = {
    "id": "resp_check",
    "created_at": 0.0,
    "model": "check",
    "object": "response",
    "output": [],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}


def _declared_tools(request: dict[str, Any]) -> set[str]:
    names = set()
    for tool in request.get("tools") or []:
        if isinstance(tool, dict):
            name = tool.get("name")
            if name is None and isinstance(tool.get("function"), dict):
                name = tool["function"].get("name")  # Chat Completions style, tolerated
            if isinstance(name, str):
                names.add(name)
    return names


def _input_call_ids(request: dict[str, Any]) -> set[str]:
    items = request.get("input")
    if not isinstance(items, list):
        return set()
    return {
        i["call_id"]
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call" and isinstance(i.get("call_id"), str)
    }


def _usage_problem(usage: Any) -> str | None:
    try:
        Usage.model_validate(usage)
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'usage'}: {err['msg']}" for err in exc.errors()[:8])
    return None


def check_reply(request: dict[str, Any], data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every contract breach in one decoded reply object ``data`` to ``request`` (the body sent).

    Returns ``[(code, title), ...]`` in a stable order (codes are keys of ``CHECKS``). Shape errors
    use ``contract.parse_reply``'s messages: one ``invalid_response`` for the top level and one
    ``invalid_output_item`` per bad item, plus ``partial_usage``; the semantic checks (asks, call
    ids, tool names, arguments, progress) read the raw items that have a usable shape.
    """
    found = shape_findings(data)
    output = data.get("output")
    if not isinstance(output, list):
        return found
    found.extend(semantic_findings(request, data, output, found))
    return found


def shape_findings(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Rule 3: usage, the top level, then each output item, so every breach gets its own line."""
    found: list[tuple[str, str]] = []
    usage = data.get("usage")
    if usage is None:
        found.append(("no_usage", "the reply has no usage (omitted or null): token metrics will be empty"))
    else:
        problem = _usage_problem(usage)
        if problem:
            found.append(("partial_usage", f"usage is incomplete or mistyped: {problem}"))
    top = {k: v for k, v in data.items() if k != "usage"}
    output = data.get("output")
    if isinstance(output, list):
        top["output"] = []
    try:
        parse_reply(top)
    except InvalidReply as exc:
        found.append(("invalid_response", f"not a valid Responses object: {_PREFIX.sub('', str(exc))}"))
    if isinstance(output, list):
        for index, item in enumerate(output):
            try:
                parse_reply({**_ENVELOPE, "output": [item]})
            except InvalidReply as exc:
                kind = item.get("type") if isinstance(item, dict) else None
                detail = _PREFIX.sub("", str(exc)).replace("output.0", f"output.{index}")
                label = f"output[{index}] ({kind})" if isinstance(kind, str) else f"output[{index}]"
                found.append(("invalid_output_item", f"{label} is not a valid item: {detail}"))
    if not any(code in ("partial_usage", "invalid_response", "invalid_output_item") for code, _ in found):
        try:  # a safety net: whatever the whole-object validation rejects is reported
            parse_reply(data)
        except InvalidReply as exc:
            found.append(("invalid_response", f"not a valid Responses object: {_PREFIX.sub('', str(exc))}"))
    return found


def _ask_findings(ask: dict[str, Any], declared: set[str], earlier_ids: set[str]) -> list[tuple[str, str]]:
    """Rules 4, 5, 6 on one ask: its tool name, its arguments and its call_id."""
    found: list[tuple[str, str]] = []
    name = ask.get("name")
    if not isinstance(name, str):
        return found  # reported as an invalid item
    problem = tool_name_problem(name)
    if problem is not None:
        code = "reserved_tool_name" if name in RESERVED_ENV_ROUTES else "unsafe_tool_name"
        found.append((code, f"asked for tool {name!r}: {problem}; gymweb will not send it"))
    if name not in declared:
        shown = ", ".join(sorted(declared)) if declared else "none (tools: [])"
        found.append(
            ("undeclared_tool", f"asked for tool {name!r}, which the request does not declare (declared: {shown})")
        )
    arguments = ask.get("arguments")
    if isinstance(arguments, str):
        _, problem = arguments_problem(arguments)
        if problem is not None:
            found.append(
                (
                    "arguments_not_json",
                    f"the arguments of the ask for {name!r} (call_id {ask['call_id']!r}) "
                    f"are not valid JSON: {arguments[:100]!r}",
                )
            )
    if ask["call_id"] in earlier_ids:
        found.append(
            (
                "repeated_call_id",
                f"the ask for {name!r} reuses call_id {ask['call_id']!r} from earlier in the conversation",
            )
        )
    return found


def semantic_findings(
    request: dict[str, Any], data: dict[str, Any], output: list[Any], shape: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Rules 4, 5, 6, 10 on the usable items; ``shape`` is what ``shape_findings`` found."""
    found: list[tuple[str, str]] = []
    items = usable_items(output)
    declared = _declared_tools(request)
    earlier_ids = _input_call_ids(request)
    answered = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    calls_here = {i["call_id"] for i in items if i.get("type") == "function_call"}
    unpaired = [i for i in items if i.get("type") == "function_call" and i["call_id"] not in answered]
    for call_id, n in Counter(i["call_id"] for i in unpaired).items():
        if n > 1:
            found.append(
                ("duplicate_call_id", f"{n} asks share call_id {call_id!r}: gymweb runs only the last of them")
            )
    asks = find_asks(items)
    for ask in asks:
        found.extend(_ask_findings(ask, declared, earlier_ids))
    ran_env_tools = unexecuted_tool_results([(i, "agent") for i in items], declared)
    if ran_env_tools and declared:
        found.append(
            (
                "agent_ran_env_tools",
                f"the reply answers {len(ran_env_tools)} call(s) of the declared tools itself "
                f"(call_id {ran_env_tools[0]!r}): the environment never runs them",
            )
        )
    for item in items:
        if item.get("type") == "function_call_output" and item["call_id"] not in calls_here | earlier_ids:
            found.append(
                (
                    "orphan_call_output",
                    f"a function_call_output answers call_id {item['call_id']!r}, which no function_call made "
                    "(neither in this reply nor in the input)",
                )
            )
    shape_errors = any(code in ("partial_usage", "invalid_response", "invalid_output_item") for code, _ in shape)
    # An invalid reply fails the rollout before the loop looks at it: "calls again" would not be true.
    if not shape_errors and not asks and not has_assistant_message(items) and not data.get("incomplete_details"):
        kinds = ", ".join(sorted({str(i.get("type")) for i in items})) or "no items"
        found.append(
            (
                "no_progress",
                f"the reply has neither an ask nor an assistant message ({kinds}): gymweb would call again at once",
            )
        )
    return found
