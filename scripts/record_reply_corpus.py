"""Record NeMo Gym 0.7.0's verdict on every agent reply of the differential corpus.

Run it ONCE with the Python of a NeMo Gym 0.7.0 venv (not gymweb's; the test suite never imports
NeMo Gym):

    /path/to/ngpeer/venv/bin/python scripts/record_reply_corpus.py \
        [--data ../shared/data/nemo_gym] [--output tests/data/reply_corpus.jsonl]

The corpus is (a) every ``response`` of NeMo Gym's own rollout files under ``--data`` (real replies,
deduplicated) and (b) made-up edge cases built here from a minimal valid reply. Each case is
validated by the real ``nemo_gym.openai_utils.NeMoGymResponse.model_validate`` (what the remote_agent
does with a reply) and written as one JSON line: ``{"case", "source", "reply", "nemo_gym": {"valid",
"reason"}}``, ``reason`` the first validation errors (``loc: msg``) or null. ``tests/test_reply_corpus.py``
asserts gymweb's validator gives the same verdict for every line.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def usage(**over: Any) -> dict:
    base = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    base.update(over)
    return base


MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "done", "annotations": []}],
}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_counter_value", "arguments": "{}"}


def reply(*output: dict, **over: Any) -> dict:
    base = {
        "id": "resp_1",
        "created_at": 1700000000.0,
        "model": "m",
        "object": "response",
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage(),
    }
    base.update(over)
    return base


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def made_up() -> Iterator[tuple[str, dict]]:
    """Edge cases: each differs from a valid reply in one thing."""
    yield "minimal message", reply(MESSAGE)
    yield "minimal call", reply(CALL)
    yield "empty output", reply()
    yield "no usage key", without(reply(MESSAGE), "usage")
    yield "usage null", reply(MESSAGE, usage=None)
    yield "negative input_tokens", reply(MESSAGE, usage=usage(input_tokens=-5))
    yield "input_tokens past 64 bits", reply(MESSAGE, usage=usage(input_tokens=2**70))
    yield "input_tokens a float with a fraction", reply(MESSAGE, usage=usage(input_tokens=1.5))
    yield "input_tokens a whole float", reply(MESSAGE, usage=usage(input_tokens=3.0))
    yield "input_tokens a numeric string", reply(MESSAGE, usage=usage(input_tokens="12"))
    yield "partial usage: no total_tokens", reply(MESSAGE, usage=without(usage(), "total_tokens"))
    yield "partial usage: no input_tokens_details", reply(MESSAGE, usage=without(usage(), "input_tokens_details"))
    yield (
        "usage details null counts",
        reply(
            MESSAGE,
            usage=usage(input_tokens_details={"cached_tokens": None}, output_tokens_details={"reasoning_tokens": None}),
        ),
    )
    yield "usage details without cached_tokens", reply(MESSAGE, usage=usage(input_tokens_details={}))
    yield "usage extra keys", reply(MESSAGE, usage=usage(cost=0.1, input_tokens_per_turn=[1, 2]))
    yield "usage is a list", reply(MESSAGE, usage=[1, 2])
    yield "incomplete_details reason because", reply(MESSAGE, incomplete_details={"reason": "because"})
    yield (
        "incomplete_details reason max_output_tokens",
        reply(MESSAGE, incomplete_details={"reason": "max_output_tokens"}),
    )
    yield "incomplete_details empty object", reply(MESSAGE, incomplete_details={})
    yield "incomplete_details a string", reply(MESSAGE, incomplete_details="cut short")
    yield "status weird", reply(MESSAGE, status="weird")
    yield "status incomplete", reply(MESSAGE, status="incomplete")
    yield "status null", reply(MESSAGE, status=None)
    yield "object chat.completion", reply(MESSAGE, object="chat.completion")
    yield "created_at a string", reply(MESSAGE, created_at="yesterday")
    yield "created_at an integer", reply(MESSAGE, created_at=1700000000)
    yield "no id", without(reply(MESSAGE), "id")
    yield "no model", without(reply(MESSAGE), "model")
    yield "no tools", without(reply(MESSAGE), "tools")
    yield "no parallel_tool_calls", without(reply(MESSAGE), "parallel_tool_calls")
    yield "tool_choice unknown string", reply(MESSAGE, tool_choice="sometimes")
    yield "tool_choice function object", reply(MESSAGE, tool_choice={"type": "function", "name": "f"})
    yield (
        "tools with a function tool",
        reply(MESSAGE, tools=[{"type": "function", "name": "f", "parameters": {}, "strict": False}]),
    )
    yield "tools with a function tool without parameters", reply(MESSAGE, tools=[{"type": "function", "name": "f"}])
    yield "tools with an unknown tool type", reply(MESSAGE, tools=[{"type": "teleport"}])
    yield "output is an object", reply(MESSAGE, output={"type": "message"})
    yield "output item a string", reply("hello")  # type: ignore[arg-type]
    yield "output item without type", reply(without(MESSAGE, "type"))
    yield "output item type null", reply({**MESSAGE, "type": None})
    yield "output item unknown type", reply({"type": "telepathy", "id": "x"})
    yield "web_search_call without action", reply({"type": "web_search_call", "id": "ws_1", "status": "completed"})
    yield (
        "web_search_call with search action",
        reply(
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}}
        ),
    )
    yield "mcp_call minimal", reply({"type": "mcp_call", "name": "t", "arguments": "{}"})
    yield "mcp_call any status", reply({"type": "mcp_call", "name": "t", "arguments": "{}", "status": "whatever"})
    yield "mcp_list_tools raw tools", reply({"type": "mcp_list_tools", "tools": [{"anything": 1}]})
    yield "file_search_call without queries", reply({"type": "file_search_call", "id": "f", "status": "completed"})
    yield "function_call without call_id", reply(without(CALL, "call_id"))
    yield "function_call arguments an object", reply({**CALL, "arguments": {"count": 1}})
    yield "function_call status weird", reply({**CALL, "status": "weird"})
    yield "function_call with namespace", reply({**CALL, "namespace": "ns"})
    yield (
        "function_call_output request shape",
        reply(CALL, {"type": "function_call_output", "call_id": "call_1", "output": "3"}),
    )
    yield (
        "function_call_output output shape",
        reply(
            CALL,
            {"type": "function_call_output", "call_id": "call_1", "output": "3", "id": "o1", "status": "completed"},
        ),
    )
    yield (
        "function_call_output output a number",
        reply(CALL, {"type": "function_call_output", "call_id": "call_1", "output": 3}),
    )
    yield "function_call_output without call_id", reply({"type": "function_call_output", "output": "3"})
    yield "message content a string, assistant", reply({"type": "message", "role": "assistant", "content": "hi"})
    yield "message content a string, user", reply({"type": "message", "role": "user", "content": "hi"})
    yield "message role tool", reply({"type": "message", "role": "tool", "content": "hi"})
    yield "message without id", reply(without(MESSAGE, "id"))
    yield "message empty content with id", reply({**MESSAGE, "content": []})
    yield "message empty content without id", reply({**without(MESSAGE, "id"), "content": []})
    yield "message status weird", reply({**MESSAGE, "status": "weird"})
    yield "message phase final_answer", reply({**MESSAGE, "phase": "final_answer"})
    yield "message phase weird", reply({**MESSAGE, "phase": "weird"})
    yield "output_text without annotations", reply({**MESSAGE, "content": [{"type": "output_text", "text": "x"}]})
    yield (
        "output_text text a number",
        reply({**MESSAGE, "content": [{"type": "output_text", "text": 3, "annotations": []}]}),
    )
    yield "refusal content", reply({**MESSAGE, "content": [{"type": "refusal", "refusal": "no"}]})
    yield (
        "user message with input_text list and status",
        reply(
            {
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": "hi"}],
            }
        ),
    )
    yield (
        "user message with unknown part",
        reply({"type": "message", "role": "user", "content": [{"type": "input_smell"}]}),
    )
    yield (
        "input_video without a source",
        reply({"type": "message", "role": "user", "content": [{"type": "input_video"}]}),
    )
    yield (
        "input_video with a url",
        reply({"type": "message", "role": "user", "content": [{"type": "input_video", "video_url": "http://x/v.mp4"}]}),
    )
    yield "reasoning minimal", reply({"type": "reasoning", "id": "r1", "summary": []}, MESSAGE)
    yield "reasoning without id", reply({"type": "reasoning", "summary": []}, MESSAGE)
    yield (
        "reasoning summary part without type",
        reply({"type": "reasoning", "id": "r1", "summary": [{"text": "t"}]}, MESSAGE),
    )
    yield (
        "token ids complete",
        reply({**MESSAGE, "prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}),
    )
    yield "token ids partial", reply({**MESSAGE, "prompt_token_ids": [1]})
    yield (
        "token ids mistyped",
        reply({**MESSAGE, "prompt_token_ids": ["a"], "generation_token_ids": [2], "generation_log_probs": [-0.1]}),
    )
    yield (
        "extra top-level and item fields",
        reply({**MESSAGE, "vendor": {"x": 1}}, my_field=[1], service_tier="default"),
    )
    yield "error object", reply(MESSAGE, error={"code": "server_error", "message": "boom"})
    yield "error a string", reply(MESSAGE, error="boom")


def real(data: Path, per_file: int) -> Iterator[tuple[str, dict]]:
    """The first ``per_file`` distinct ``response`` objects of each NeMo Gym rollout file under ``data``."""
    seen: set[str] = set()
    patterns = ("*/example_rollouts.jsonl", "*/*/rollouts.jsonl", "*/*/rollouts_failures.jsonl", "*/rollouts.jsonl")
    for pattern in patterns:
        for path in sorted(data.glob(pattern)):
            taken = 0
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                response = json.loads(line).get("response")
                if not isinstance(response, dict):
                    continue
                key = json.dumps(response, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                yield f"{path.relative_to(data)}:{number}", response
                taken += 1
                if taken >= per_file:
                    break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "nemo_gym")
    parser.add_argument("--output", type=Path, default=ROOT / "tests" / "data" / "reply_corpus.jsonl")
    parser.add_argument("--per-file", type=int, default=4, help="real replies taken from each rollout file")
    args = parser.parse_args()
    try:
        from nemo_gym.openai_utils import NeMoGymResponse
        from pydantic import ValidationError
    except ImportError:
        print("run this with the Python of a NeMo Gym 0.7.0 venv (nemo_gym is not importable here)", file=sys.stderr)
        return 2

    real_cases = list(real(args.data, args.per_file))
    cases = [("real", n, r) for n, r in real_cases] + [("made_up", n, r) for n, r in made_up()]
    lines = []
    for source, name, data in cases:
        try:
            NeMoGymResponse.model_validate(copy.deepcopy(data))
            verdict = {"valid": True, "reason": None}
        except ValidationError as exc:
            errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]]
            verdict = {"valid": False, "reason": f"{exc.error_count()} error(s): " + "; ".join(errors)}
        lines.append(
            json.dumps({"case": name, "source": source, "reply": data, "nemo_gym": verdict}, ensure_ascii=False)
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    valid = sum(1 for line in lines if json.loads(line)["nemo_gym"]["valid"])
    print(
        f"{len(lines)} replies ({len(real_cases)} real), {valid} valid, {len(lines) - valid} invalid -> {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
