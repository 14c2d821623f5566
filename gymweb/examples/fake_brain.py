"""A stand-in for `claude -p PROMPT --output-format json --model M` that solves counter tasks.

Same command-line shape as the Claude Code CLI's print mode, no model behind it: it reads the
prompt rendered by `gymweb/examples/cli_brain_agent.py` (lines `[user] ...`, `[you asked for] name(args)`,
`[tool result] ...`), decides deterministically and prints one JSON envelope to stdout:

    {"type": "result", "subtype": "success", "is_error": false, "result": "<decision JSON>",
     "usage": {"input_tokens": .., "output_tokens": .., "cache_read_input_tokens": 0,
               "cache_creation_input_tokens": 0}, ...}

Decisions for "add X then add Y then get the count": first `{"tool_calls": [increment_counter X,
increment_counter Y]}`, then `{"tool_calls": [get_counter_value]}`, then `{"final": "The count is
N."}` with N from the last tool result. Anything else: `{"final": "I cannot parse this task: ..."}`.
Token counts are ~4 characters per token. Exit status 0; a missing `-p` is exit status 2 (argparse).

Use it as the brain:  AGENT_BRAIN_CMD="python -m gymweb.examples.fake_brain" python -m gymweb.examples.cli_brain_agent
Run it by hand:       python -m gymweb.examples.fake_brain -p "[user] add 1 then add 2 then get the count"

Standalone on purpose (no imports from this package), so it also runs as `python path/to/fake_brain.py`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid

_ADD = re.compile(r"\badd\s+(-?\d+)", re.IGNORECASE)
_GET = re.compile(r"\bget\s+the\s+count\b", re.IGNORECASE)
_COUNT = re.compile(r'"count"\s*:\s*(-?\d+)')


def decide(prompt: str) -> dict:
    """The decision for a rendered conversation: `{"tool_calls": [...]}` or `{"final": "..."}`."""
    lines = prompt.splitlines()
    task = next((line[len("[user] ") :] for line in lines if line.startswith("[user] ")), "")
    numbers = [int(n) for n in _ADD.findall(task)]
    if not numbers or not _GET.search(task):
        return {"final": f"I cannot parse this task: {task[:200]!r}"}
    asked_increment = any(line.startswith("[you asked for] increment_counter(") for line in lines)
    get_positions = [i for i, line in enumerate(lines) if line.startswith("[you asked for] get_counter_value(")]
    if not asked_increment:
        return {"tool_calls": [{"name": "increment_counter", "arguments": {"count": n}} for n in numbers]}
    if not get_positions:
        return {"tool_calls": [{"name": "get_counter_value", "arguments": {}}]}
    results = [line for line in lines[get_positions[-1] :] if line.startswith("[tool result] ")]
    match = _COUNT.search(results[-1]) if results else None
    if match is None:
        return {"final": "I could not read the count from the tool result."}
    return {"final": f"The count is {int(match.group(1))}."}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Deterministic stand-in for `claude -p` (counter tasks)")
    parser.add_argument("-p", "--print", dest="prompt", required=True, help="the prompt")
    parser.add_argument("--output-format", default="json", choices=["json", "text"])
    parser.add_argument("--model", default="fake")
    args, _unknown = parser.parse_known_args(argv)  # tolerate claude flags it does not model
    result = json.dumps(decide(args.prompt))
    if args.output_format == "text":
        print(result)
        return 0
    envelope = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": result,
        "session_id": str(uuid.uuid4()),
        "num_turns": 1,
        "duration_ms": 0,
        "total_cost_usd": 0.0,
        "model": args.model,
        "usage": {
            "input_tokens": max(1, len(args.prompt) // 4),
            "output_tokens": max(1, len(result) // 4),
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
    }
    print(json.dumps(envelope))
    return 0


if __name__ == "__main__":
    sys.exit(main())
