"""Agent conformance check: probe an agent service and report every breach of the contract.

``check_agent(base_url)`` sends a few probe conversations to ``{base_url}/v1/responses``, the way a
rollout would, and returns a ``Report`` listing each breach found as a ``Finding`` with what was
sent, what came back, and how to fix it. It never follows redirects, sends no credentials, keeps no
client cookie jar (``http.make_client``; the service's own cookies are echoed back only within one
probe conversation, as in a rollout) and needs no environment: tool outputs are simulated.

The probes (in order):

1. ``counter_task``: a counter task as in NeMo Gym's ``example_session_state_mgmt`` dataset, with
   its two declared tools (``increment_counter``, ``get_counter_value``).
2. ``follow_up``: the same conversation one turn later: probe 1's output items, then one
   ``function_call_output`` per ask of probe 1 (the agent's own calls; simulated env outputs,
   refusals as gymweb writes them). The service's cookies from probe 1 are sent back. When probe 1
   asked for nothing usable, a synthetic ``increment_counter`` call and its output stand in.
3. ``string_input``: ``input`` given as a string (a Responses client may send one; gymweb itself
   turns it into a user message first, contract rule 7).
4. ``no_tools``: a plain question with ``tools: []``: any ask is for an undeclared tool.

Findings (code → severity; each cites the contract rule of docs/DESIGN.md it checks):
``target_refused`` (gymweb's target policy refused the host: nothing was sent), ``reply_too_large``
(over ``GYMWEB_MAX_REPLY_BYTES``), ``unreachable``, ``connection_dropped``, ``not_http``,
``timeout`` (rules 11, 12), ``redirect`` (rule 1), ``http_error``, ``not_json``, ``not_object`` (rule 2),
``invalid_response``, ``invalid_output_item``, ``partial_usage`` (rule 3) are errors, as they fail a rollout.
``undeclared_tool`` (rule 5), ``unsafe_tool_name``, ``reserved_tool_name`` (rule 5),
``duplicate_call_id``, ``orphan_call_output`` (rule 4) are errors: the rollout goes on but the
agent broke the contract. ``no_usage`` (rule 3), ``arguments_not_json`` (rule 6),
``repeated_call_id`` (rule 4), ``no_progress`` (rule 10), ``slow`` (rule 12) are warnings.
``nemo_gym_agent_server`` (an error: ``GET /openapi.json`` shows NeMo Gym's ``/run`` beside
``/v1/responses``, so the URL is NeMo Gym's own agent server) and ``agent_ran_env_tools`` (a
warning: a reply answers calls of the declared tools itself, so the env never runs them) catch the
mis-wiring of ``rollouts.nemo.miswiring``.
Each code's advice is in ``conformance_checks.CHECKS``, which also checks one reply.

No Django here: a view, the ``check_agent`` command or a test can call it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urljoin

import aiohttp
import httpx

from rollouts.engine.contract import find_asks, refused_tool_output
from rollouts.engine.http import SessionJar, make_client
from rollouts.engine.loop import BODY_EXCERPT_CHARS, validate_base_url
from rollouts.engine.targets import DEFAULT_MAX_REPLY_BYTES, TargetPolicy, find_refusal, find_too_large
from rollouts.evaluation.conformance_checks import CHECKS, ERROR, WARNING, check_reply, usable_items
from rollouts.nemo.miswiring import agent_server_routes, is_nemo_gym_agent_server

__all__ = [
    "DEFAULT_SLOW_S",
    "DEFAULT_TIMEOUT_S",
    "Finding",
    "ProbeResult",
    "Report",
    "check_agent",
    "check_agent_sync",
]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_SLOW_S = 10.0
SENT_CHARS = 2000  # a finding's copy of the request body is cut here
RECEIVED_CHARS = BODY_EXCERPT_CHARS  # NeMo Gym keeps the first 500 characters of a bad reply (rule 2)


@dataclass
class Finding:
    """One breach of the contract.

    ``code``: a key of ``CHECKS``; ``severity``: ``"error"`` (a rollout fails, or the agent broke a
    rule gymweb repairs) or ``"warning"``; ``title``: one line saying what was found; ``sent``: the
    request body (JSON, cut at ``SENT_CHARS``); ``received``: the status and the start of the body
    (``RECEIVED_CHARS``), or the transport error; ``how_to_fix``: advice; ``rule``: where the rule
    is written; ``probes``: names of the probes where it showed (the first one's sent/received are
    kept).
    """

    code: str
    severity: str
    title: str
    sent: str
    received: str
    how_to_fix: str
    rule: str = ""
    probes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProbeResult:
    """One probe request and what came back. ``latency_ms``: wall time of the call (ms);
    ``status``: HTTP status or None; ``error``: transport problem or None; ``received``: status and
    start of the body; ``findings``: codes found in this probe."""

    name: str
    purpose: str
    url: str
    request: dict[str, Any]
    sent: str
    status: int | None = None
    received: str = ""
    latency_ms: float | None = None
    error: str | None = None
    findings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["request"]  # ``sent`` holds it, cut to size
        return out


@dataclass
class Report:
    """The result of ``check_agent``: ``ok`` when there is no error (warnings allowed)."""

    base_url: str
    url: str
    findings: list[Finding] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, severity: str | None = None) -> set[str]:
        """The finding codes, optionally of one severity."""
        return {f.code for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{ok, base_url, url, errors, warnings, findings: [...], probes: [...]}``."""
        return {
            "ok": self.ok,
            "base_url": self.base_url,
            "url": self.url,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.findings],
            "probes": [p.to_dict() for p in self.probes],
        }

    def to_text(self, excerpt_chars: int = 300) -> str:
        """A report for a terminal. Text from the service is shown with control characters escaped,
        so a reply cannot move the cursor or recolour the terminal."""
        lines = [f"Agent conformance check of {self.url}", "", "Probes:"]
        width = max((len(p.name) for p in self.probes), default=0)
        for p in self.probes:
            if p.status is not None:
                outcome = f"HTTP {p.status}"
            else:
                outcome = "no reply"
            latency = f"{p.latency_ms:,.0f} ms" if p.latency_ms is not None else ""
            found = f"  -> {', '.join(p.findings)}" if p.findings else ""
            lines.append(f"  {p.name:<{width}}  {outcome:<9} {latency:>9}  {p.purpose}{found}")
        lines.append("")
        if not self.findings:
            lines.append("No breach of the contract found.")
        for f in self.findings:
            where = ", ".join(f.probes)
            lines.append(f"{f.severity.upper():<7} {f.code}: {_printable(f.title)}  [{where}]")
            lines.append(f"        see: {f.rule}")
            lines.append(f"        sent: {_printable(_cut(f.sent, excerpt_chars))}")
            lines.append(f"        received: {_printable(_cut(f.received, excerpt_chars))}")
            lines.append(f"        how to fix: {f.how_to_fix}")
            lines.append("")
        n_err, n_warn = len(self.errors), len(self.warnings)
        verdict = "PASS" if self.ok else "FAIL"
        lines.append(f"{verdict}: {n_err} error(s), {n_warn} warning(s)")
        return "\n".join(lines)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# The probes' requests
# ---------------------------------------------------------------------------------------------

# NeMo Gym's counter dataset (example_session_state_mgmt): the tools as its rows declare them.
PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "Add count to the session's counter.",
        "parameters": {
            "type": "object",
            "properties": {"count": {"type": "integer", "description": ""}},
            "required": ["count"],
            "additionalProperties": False,
        },
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_counter_value",
        "description": "Return the session's counter.",
        "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        "strict": True,
    },
]
COUNTER_TASK = "add 1 then add 2 then get the count"
STRING_TASK = "add 4 then get the count"
NO_TOOLS_TASK = "Reply with one short sentence: what is the capital of France?"
SYNTHETIC_CALL_ID = "call_gymweb_check_1"


def _counter_request() -> dict[str, Any]:
    return {"input": [{"role": "user", "content": COUNTER_TASK}], "tools": PROBE_TOOLS}


def _simulated_output(call: dict[str, Any]) -> str:
    """What gymweb would append for one ask, with a counter env behind it (rules 5, 6)."""
    name = call.get("name") if isinstance(call.get("name"), str) else ""
    _, refusal = refused_tool_output(name, call.get("arguments"))
    if refusal is not None:
        return refusal
    if name == "increment_counter":
        return '{"success":true}'
    if name == "get_counter_value":
        return '{"count":3}'
    return '{"detail":"Not Found"}'


def _follow_up_request(first: dict[str, Any], reply: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    """Probe 2's request: probe 1's conversation one turn later. Returns (request, purpose)."""
    output = reply.get("output") if isinstance(reply, dict) else None
    items = usable_items(output) if isinstance(output, list) else []
    asks = [a for a in find_asks(items) if isinstance(a.get("name"), str)] if items else []
    request = dict(first)
    if asks:
        outputs = [
            {"type": "function_call_output", "call_id": a["call_id"], "output": _simulated_output(a)} for a in asks
        ]
        request["input"] = list(first["input"]) + items + outputs
        return request, f"the conversation after {len(asks)} of its own ask(s) ran (cookies echoed)"
    call = {
        "type": "function_call",
        "id": "fc_gymweb_check_1",
        "call_id": SYNTHETIC_CALL_ID,
        "name": "increment_counter",
        "arguments": '{"count":1}',
        "status": "completed",
    }
    result = {"type": "function_call_output", "call_id": SYNTHETIC_CALL_ID, "output": '{"success":true}'}
    request["input"] = list(first["input"]) + [call, result]
    return request, "a conversation with one executed call (synthetic: the first probe asked for none)"


# ---------------------------------------------------------------------------------------------
# Talking to the service
# ---------------------------------------------------------------------------------------------


class _Run:
    """One check: the client, the findings so far (merged by code and title)."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, timeout_s: float, slow_s: float):
        self.client = client
        self.base_url = base_url
        self.url = f"{base_url}/v1/responses"
        self.timeout_s = timeout_s
        self.slow_s = slow_s
        self.report = Report(base_url=base_url, url=self.url)
        self._by_key: dict[tuple[str, str], Finding] = {}
        self.unreachable = False

    def add(self, probe: ProbeResult, code: str, title: str) -> None:
        check = CHECKS[code]
        if code not in probe.findings:
            probe.findings.append(code)
        existing = self._by_key.get((code, title))
        if existing is not None:
            if probe.name not in existing.probes:
                existing.probes.append(probe.name)
            return
        finding = Finding(
            code=code,
            severity=check.severity,
            title=title,
            sent=probe.sent,
            received=probe.received,
            how_to_fix=check.how_to_fix.replace("{base_url}", self.base_url),
            rule=check.rule,
            probes=[probe.name],
        )
        self._by_key[(code, title)] = finding
        self.report.findings.append(finding)

    async def probe_nemo_gym_agent_server(self) -> None:
        """``GET {base}/openapi.json``: a NeMo Gym agent server (``/run`` beside ``/v1/responses``)
        is reported as ``nemo_gym_agent_server``. Silent when the document cannot be read."""
        url = f"{self.base_url}/openapi.json"
        probe = ProbeResult(
            name="openapi",
            purpose="is it NeMo Gym's own agent server? (GET /openapi.json)",
            url=url,
            request={},
            sent=f"GET {url}",
        )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.client.get(url)
                await response.aread()
            doc = json.loads(response.content) if response.status_code == 200 else None
        except (TimeoutError, httpx.HTTPError, aiohttp.ClientError, ValueError):
            return
        probe.latency_ms = (time.perf_counter() - started) * 1000
        probe.status = response.status_code
        routes = agent_server_routes(doc if isinstance(doc, dict) else None)
        probe.received = f"HTTP {response.status_code}: routes {', '.join(routes) or '(none of /run, /v1/responses)'}"
        if is_nemo_gym_agent_server(doc if isinstance(doc, dict) else None):  # listed only when it found this
            self.report.probes.append(probe)
            self.add(
                probe,
                "nemo_gym_agent_server",
                f"{self.base_url} is a NeMo Gym agent server (it serves {', '.join(routes)}), not an agent service",
            )

    async def probe(self, name: str, purpose: str, request: dict[str, Any], jar: SessionJar) -> dict[str, Any] | None:
        """Send one probe; record it and its findings. Returns the reply object when it is one."""
        body = _dumps(request)
        probe = ProbeResult(name=name, purpose=purpose, url=self.url, request=request, sent=_cut(body, SENT_CHARS))
        self.report.probes.append(probe)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.client.post(self.url, content=body.encode(), headers=jar.headers())
                await response.aread()
        except TimeoutError:
            probe.latency_ms = (time.perf_counter() - started) * 1000
            probe.error = probe.received = f"no reply within {self.timeout_s:g} s"
            self.add(probe, "timeout", f"no reply within {self.timeout_s:g} s")
            return None
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            probe.latency_ms = (time.perf_counter() - started) * 1000
            cause = exc.__cause__ if isinstance(exc.__cause__, aiohttp.ClientError) else exc
            probe.error = probe.received = f"{cause.__class__.__name__}: {cause}"
            refused, too_large = find_refusal(exc), find_too_large(exc)
            if refused is not None:
                probe.error = probe.received = str(refused)
                self.unreachable = True
                self.add(probe, "target_refused", str(refused))
            elif too_large is not None:
                probe.error = probe.received = str(too_large)
                self.add(
                    probe,
                    "reply_too_large",
                    f"the reply is larger than {too_large.limit:,} bytes (GYMWEB_MAX_REPLY_BYTES)",
                )
            elif isinstance(cause, aiohttp.ClientConnectorError) or isinstance(exc, httpx.ConnectError):
                self.unreachable = True
                self.add(
                    probe,
                    "unreachable",
                    f"could not connect to {self.url}: is your service running at {self.base_url}?",
                )
            elif isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)) or isinstance(
                exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectTimeout)
            ):
                self.add(probe, "connection_dropped", f"the connection to {self.url} closed without an HTTP reply")
            else:
                self.add(probe, "not_http", f"the service at {self.url} did not answer with valid HTTP")
            return None
        probe.latency_ms = (time.perf_counter() - started) * 1000
        jar.update(response)
        probe.status = response.status_code
        text = response.content.decode("utf-8", errors="replace")
        probe.received = f"HTTP {response.status_code}: {_cut(text.strip(), RECEIVED_CHARS)}"
        if probe.latency_ms > self.slow_s * 1000:
            self.add(probe, "slow", f"the reply took {probe.latency_ms / 1000:.1f} s (more than {self.slow_s:g} s)")
        if 300 <= response.status_code < 400:
            location = response.headers.get("location")
            if not location:
                where = "(no Location header)"
            else:  # resolved against the request URL, as the loop's failure message says it
                resolved = urljoin(self.url, location.strip())
                where = resolved if resolved == location else f"{resolved} (Location: {_cut(location, 200)})"
            self.add(probe, "redirect", f"HTTP {response.status_code} redirect to {where} (not followed)")
            return None
        if not response.is_success:
            self.add(probe, "http_error", f"HTTP {response.status_code} instead of 200")
            return None
        try:
            data = json.loads(response.content)
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            self.add(probe, "not_json", f"the body is not JSON ({kind})")
            return None
        if not isinstance(data, dict):
            self.add(probe, "not_object", f"the body is JSON but a {type(data).__name__}, not an object")
            return None
        for code, title in check_reply(request, data):
            self.add(probe, code, title)
        return data


async def check_agent(
    base_url: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    slow_s: float = DEFAULT_SLOW_S,
    client: httpx.AsyncClient | None = None,
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> Report:
    """Probe the agent service at ``base_url`` and report every breach of the contract found.

    ``base_url``: the agent's base URL (``validate_base_url``, contract rule 13: absolute http(s),
    no query, fragment or credentials; a trailing slash is dropped). ``timeout_s``: per probe
    (seconds). ``slow_s``: replies slower than this get a ``slow`` warning. ``client``: an
    ``httpx.AsyncClient`` from ``http.make_client`` to reuse (default: a fresh one with ``policy``
    and ``max_reply_bytes``, closed after). ``policy``: the target policy (``rollouts.engine.targets``;
    None: the strict default); a refused host ends the check with one ``target_refused`` finding.

    Returns a ``Report`` (module docstring: probes and codes). A refused connection (or an unknown
    host) ends the check with one ``unreachable`` finding. Raises ``loop.InvalidBaseURL`` for a bad
    URL (its message never echoes credentials); never raises for the service's behaviour.
    """
    base = validate_base_url(base_url)
    own = client is None
    client = client or make_client(1, policy=policy, max_reply_bytes=max_reply_bytes)
    run = _Run(client, base, float(timeout_s), float(slow_s))
    try:
        first = _counter_request()
        jar = SessionJar()  # probes 1 and 2 are one conversation: the service's cookies come back
        reply = await run.probe("counter_task", "a counter task with two declared tools", first, jar)
        if run.unreachable:
            return run.report
        await run.probe_nemo_gym_agent_server()
        follow_up, purpose = _follow_up_request(first, reply)
        await run.probe("follow_up", purpose, follow_up, jar)
        await run.probe(
            "string_input", "input given as a string", {"input": STRING_TASK, "tools": PROBE_TOOLS}, SessionJar()
        )
        await run.probe(
            "no_tools",
            "a plain question with tools: []",
            {"input": [{"role": "user", "content": NO_TOOLS_TASK}], "tools": []},
            SessionJar(),
        )
        return run.report
    finally:
        if own:
            await client.aclose()


def check_agent_sync(
    base_url: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    slow_s: float = DEFAULT_SLOW_S,
    policy: TargetPolicy | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
) -> Report:
    """``check_agent`` for synchronous callers (a view, a command): runs it in a new event loop.
    Must not be called from inside a running event loop. Raises ``loop.InvalidBaseURL`` like it."""
    return asyncio.run(
        check_agent(base_url, timeout_s=timeout_s, slow_s=slow_s, policy=policy, max_reply_bytes=max_reply_bytes)
    )
