"""An example agent service whose "brain" is a command-line model (the README's quickstart, on aiohttp).

`POST /v1/responses`: each call renders the conversation so far and the tool schemas into one
prompt, runs the brain command with it, reads the command's JSON envelope from stdout
(`{"result": "<decision JSON>", "usage": {...}}`, the shape of `claude -p ... --output-format json`)
and translates the decision into a Responses API object:

- `{"tool_calls": [{"name": "<tool>", "arguments": {...}}, ...]}` -> unpaired `function_call` asks
  (arguments serialised to a JSON string, fresh `call_<hex>` ids) for the caller to execute;
- `{"final": "<answer text>"}` -> one assistant message, which ends the rollout.

Usage is always complete: the envelope's `input_tokens + cache_read_input_tokens +
cache_creation_input_tokens` become `input_tokens` (Responses counts cached tokens as input), the
cache reads `input_tokens_details.cached_tokens`; `output_tokens` as reported; reasoning 0.

A brain command that cannot start, exits non-zero, runs past the timeout, or prints something that is
not an envelope holding a decision -> HTTP 502 `{"error": {"message": "...", "type": "brain_error"}}`
whose message names the command and the problem (exit status and the end of stderr, the timeout
knob, or the start of the bad output).

Configuration (environment variables, or the arguments of `make_app`):

    AGENT_BRAIN_CMD          the command; default `claude -p {prompt} --output-format json --model $CLAUDE_MODEL`.
                             Split like a shell would (shlex), `$VARS` expanded, `{prompt}` replaced by
                             the prompt as ONE argument (no shell is involved). Without `{prompt}`,
                             `-p PROMPT --output-format json --model MODEL` is appended, so a command
                             with claude's CLI shape needs only its name.
    CLAUDE_MODEL             the model name passed on (default `haiku`).
    AGENT_BRAIN_TIMEOUT_S    seconds one brain run may take (default 300).
    AGENT_BRAIN_CONCURRENCY  brain processes run at once; further calls wait (default 16).

Try it without Claude, with the deterministic stand-in `gymweb/examples/fake_brain.py`:

    AGENT_BRAIN_CMD="python -m gymweb.examples.fake_brain" python -m gymweb.examples.cli_brain_agent --port 9103

With Claude Code (on PATH and logged in, or ANTHROPIC_API_KEY set):

    CLAUDE_MODEL=haiku python -m gymweb.examples.cli_brain_agent --port 9103

It prints "cli brain agent listening on http://HOST:PORT" when ready. `make_app(...)` returns the
aiohttp Application for in-process use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
from typing import Any

from aiohttp import web

from gymweb.examples._serve import add_fallback_routes, json_response, read_json, serve_forever
from gymweb.examples.counter_agent import (
    as_items,
    assistant_message,
    bad_request,
    message_text,
    new_id,
    output_text,
    response_object,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9103
DEFAULT_BRAIN_CMD = "claude -p {prompt} --output-format json --model $CLAUDE_MODEL"
DEFAULT_MODEL = "haiku"
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_CONCURRENCY = 16

PROMPT = """You are an agent solving a task by calling tools. You do not execute tools \
yourself; you ask for them and the results come back in the conversation.

Task conversation so far:
{conversation}

Tools you may ask for (JSON schemas):
{tools}

Reply with ONLY one JSON object, no prose, no code fences:
- to call tools: {{"tool_calls": [{{"name": "<tool>", "arguments": {{...}}}}]}}
- to finish:     {{"final": "<answer text>"}}
Finish once the conversation contains enough tool results to answer; the final answer must be \
exactly what the task asks for.
"""

CONFIG_KEY = web.AppKey("brain_config", dict)
LIMIT_KEY = web.AppKey("brain_limit", asyncio.Semaphore)

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


class BrainError(Exception):
    """The brain command failed; the message says how (shown to the caller in a 502)."""


def render(items: list[Any]) -> str:
    """The conversation as prompt lines: `[user] ...`, `[assistant] ...`, `[you asked for] name(args)`,
    `[tool result] ...` (the format `gymweb/examples/fake_brain.py` reads)."""
    lines = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            lines.append(f"[{item.get('role', 'user')}] {message_text(item)}")
        elif kind == "function_call":
            lines.append(f"[you asked for] {item.get('name')}({item.get('arguments')})")
        elif kind == "function_call_output":
            lines.append(f"[tool result] {output_text(item.get('output'))}")
    return "\n".join(lines)


def build_argv(template: str, prompt: str, model: str) -> list[str]:
    """The brain command's argv: `template` split like a shell would, `$VAR`s expanded from the
    environment (`$CLAUDE_MODEL` defaults to `model`), `{prompt}` replaced by the prompt; without
    a `{prompt}` placeholder, claude's flags `-p PROMPT --output-format json --model MODEL` are
    appended. Raises BrainError for an empty or unparsable template."""
    try:
        tokens = shlex.split(template)
    except ValueError as exc:
        raise BrainError(f"cannot parse AGENT_BRAIN_CMD {template!r}: {exc}") from exc
    if not tokens:
        raise BrainError("AGENT_BRAIN_CMD is empty")
    env = {**os.environ, "CLAUDE_MODEL": os.environ.get("CLAUDE_MODEL") or model}

    def expand(token: str) -> str:  # before the prompt goes in, so '$' in the prompt stays literal
        return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), token)

    tokens = [expand(t) for t in tokens]
    if any("{prompt}" in t for t in tokens):
        return [t.replace("{prompt}", prompt) for t in tokens]
    return [*tokens, "-p", prompt, "--output-format", "json", "--model", env["CLAUDE_MODEL"]]


async def run_brain(argv: list[str], timeout_s: float) -> str:
    """Run the command, return its stdout text. Raises BrainError on a start failure, a non-zero
    exit (with the end of stderr) or a timeout (the process is killed)."""
    name = argv[0]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError as exc:
        raise BrainError(f"brain command not found: {name!r} (set AGENT_BRAIN_CMD): {exc}") from exc
    except OSError as exc:  # permissions, argument list too long, ...
        raise BrainError(f"could not start brain command {name!r}: {exc}") from exc
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError as exc:
        raise BrainError(f"brain command {name!r} timed out after {timeout_s:g} s (AGENT_BRAIN_TIMEOUT_S)") from exc
    finally:
        if proc.returncode is None:  # timed out, or this request was cancelled: don't leak it
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-500:] or "(no stderr)"
        raise BrainError(f"brain command {name!r} exited with status {proc.returncode}: {tail}")
    return stdout.decode(errors="replace")


def parse_envelope(stdout: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(decision, usage) from the CLI's JSON envelope. The decision is `{"tool_calls": [...]}` or
    `{"final": ...}`; code fences around it are tolerated. Raises BrainError otherwise."""
    try:
        envelope = json.loads(stdout)
    except ValueError as exc:
        raise BrainError(f"brain output is not a JSON envelope ({exc}): {stdout.strip()[:300]!r}") from exc
    if not isinstance(envelope, dict) or not isinstance(envelope.get("result"), str):
        raise BrainError(f"brain envelope has no string 'result': {stdout.strip()[:300]!r}")
    result = envelope["result"]
    if envelope.get("is_error"):
        raise BrainError(f"brain reported an error: {result[:300]!r}")
    text = result.strip().strip("`").strip()
    text = text[4:] if text.startswith("json") else text  # a ```json fence
    try:
        decision = json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")  # prose around the object
        try:
            decision = json.loads(text[start : end + 1]) if 0 <= start < end else None
        except ValueError:
            decision = None
    if not isinstance(decision, dict) or not (isinstance(decision.get("tool_calls"), list) or "final" in decision):
        raise BrainError(f'brain decision is neither {{"tool_calls": [...]}} nor {{"final": ...}}: {result[:300]!r}')
    usage = envelope.get("usage") if isinstance(envelope.get("usage"), dict) else {}
    return decision, usage


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def to_output(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses output items for a decision (asks, or one final assistant message)."""
    calls = decision.get("tool_calls")
    if isinstance(calls, list) and calls:
        output = []
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise BrainError(f"brain asked for a malformed tool call: {json.dumps(call)[:300]}")
            arguments = call.get("arguments", {})
            output.append(
                {
                    "type": "function_call",
                    "id": new_id("fc"),
                    "call_id": new_id("call"),
                    "name": call["name"],
                    # a string is passed on as the brain wrote it; the caller reports bad JSON back
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    "status": "completed",
                }
            )
        return output
    return [assistant_message(str(decision.get("final", "")))]


def to_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Full Responses usage from the CLI envelope's usage (missing counts are 0)."""
    cached = _count(usage, "cache_read_input_tokens")
    input_tokens = _count(usage, "input_tokens") + cached + _count(usage, "cache_creation_input_tokens")
    output_tokens = _count(usage, "output_tokens")
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def brain_error(message: str) -> web.Response:
    return json_response({"error": {"message": message, "type": "brain_error"}}, status=502)


async def responses(request: web.Request) -> web.Response:
    """POST /v1/responses: one brain decision (see module docstring)."""
    config = request.app[CONFIG_KEY]
    params, error = await read_json(request)
    if error:
        return bad_request(error)
    if not isinstance(params, dict):
        return bad_request("the request body must be a JSON object (responses_create_params)")
    items = as_items(params.get("input"))
    tools = params.get("tools") if isinstance(params.get("tools"), list) else []
    prompt = PROMPT.format(conversation=render(items), tools=json.dumps(tools))
    try:
        argv = build_argv(config["cmd"], prompt, config["model"])
        async with request.app[LIMIT_KEY]:
            stdout = await run_brain(argv, config["timeout_s"])
        decision, usage = parse_envelope(stdout)
        output = to_output(decision)
    except BrainError as exc:
        return brain_error(str(exc))
    return json_response(response_object(params, output, to_usage(usage), f"claude-{config['model']}"))


def make_app(
    brain_cmd: str | None = None,
    timeout_s: float | None = None,
    model: str | None = None,
    concurrency: int | None = None,
) -> web.Application:
    """The CLI-brain agent as an aiohttp Application. Unset arguments come from the environment
    (AGENT_BRAIN_CMD, AGENT_BRAIN_TIMEOUT_S, CLAUDE_MODEL, AGENT_BRAIN_CONCURRENCY), then defaults."""
    app = web.Application()
    app[CONFIG_KEY] = {
        "cmd": brain_cmd or os.environ.get("AGENT_BRAIN_CMD") or DEFAULT_BRAIN_CMD,
        "timeout_s": float(timeout_s or os.environ.get("AGENT_BRAIN_TIMEOUT_S") or DEFAULT_TIMEOUT_S),
        "model": model or os.environ.get("CLAUDE_MODEL") or DEFAULT_MODEL,
    }
    limit = concurrency or int(os.environ.get("AGENT_BRAIN_CONCURRENCY") or DEFAULT_CONCURRENCY)
    app[LIMIT_KEY] = asyncio.Semaphore(max(1, limit))
    app.router.add_post("/v1/responses", responses)
    add_fallback_routes(app)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Agent service with a command-line model as its brain")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument("--timeout-s", type=float, default=None, help="overrides AGENT_BRAIN_TIMEOUT_S")
    args = parser.parse_args(argv)
    serve_forever(make_app(timeout_s=args.timeout_s), args.host, args.port, "cli brain agent")


if __name__ == "__main__":
    main()
