"""The SFT export: NeMo Gym rollouts → OpenAI chat format (``{"messages", "tools"}``), on every real
trace in ../shared/data/nemo_gym, against a fixed expected file for two of them, and its rules for
reasoning, instructions, unanswered and repeated calls and what chat cannot hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollouts.review.sft import NotConvertible, conversation, convert_lines, tools_to_chat

EXPECTED = Path(__file__).parent / "data" / "sft_expected.jsonl"
EXPECTED_SOURCES = [("example_tool_call_multireward", 0), ("mini_swe_agent_2", 0)]


def real_rows(shared_data):
    files = sorted(shared_data.glob("*/example_rollouts.jsonl"))
    assert len(files) >= 7
    for path in files:
        for n, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                yield f"{path.parent.name}:{n}", json.loads(line)


def assert_valid_chat(conv: dict) -> None:
    """What fine-tuning tools check: roles, tool calls answered before the next turn (the last
    message too), tool messages answering a call of the assistant message before."""
    messages = conv["messages"]
    assert messages and set(conv) == {"messages", "tools"}
    open_calls: set = set()
    for i, m in enumerate(messages):
        assert m["role"] in ("system", "user", "assistant", "tool")
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, (i, m)
            open_calls.discard(m["tool_call_id"])
            assert isinstance(m["content"], (str, list))
            continue
        assert not open_calls, f"message {i} comes before calls {open_calls} are answered"
        if m["role"] == "assistant":
            assert "content" in m
            calls = m.get("tool_calls") or []
            ids = [c["id"] for c in calls]
            assert len(ids) == len(set(ids))
            for c in calls:
                assert c["type"] == "function" and isinstance(c["function"]["arguments"], str) and c["function"]["name"]
            open_calls = set(ids)
        else:
            assert isinstance(m["content"], (str, list))
    assert not open_calls, f"calls {open_calls} are never answered"
    for tool in conv["tools"]:
        assert tool["type"] == "function" and tool["function"]["name"]


def test_every_real_trace_converts_to_valid_chat(shared_data):
    n = 0
    for where, row in real_rows(shared_data):
        for reasoning in ("keep", "think", "drop"):
            conv = conversation(row, reasoning=reasoning)
            assert_valid_chat(conv)
        n += 1
        # Every tool output and every assistant text of the trajectory is in the conversation
        # (with reasoning=think: thinking spans stay in the text as they came).
        items = row["response"]["output"]
        text = json.dumps(conversation(row, reasoning="think"), ensure_ascii=False)
        for item in items:
            if item["type"] == "function_call_output":
                assert json.dumps(item["output"], ensure_ascii=False)[1:-1] in text, where
            if item["type"] == "message" and item["role"] == "assistant":
                for part in item["content"]:
                    assert json.dumps(part["text"], ensure_ascii=False)[1:-1] in text, where
        declared = [t["name"] for t in row["responses_create_params"].get("tools") or []]
        assert [t["function"]["name"] for t in conv["tools"]] == declared
    assert n == 35  # 7 files, 5 traces each


def test_two_real_traces_match_the_expected_file(shared_data):
    expected = [json.loads(line) for line in EXPECTED.read_text().splitlines()]
    assert len(expected) == len(EXPECTED_SOURCES) == 2
    for (folder, n), want in zip(EXPECTED_SOURCES, expected):
        row = json.loads((shared_data / folder / "example_rollouts.jsonl").read_text().splitlines()[n])
        assert conversation(row) == want


def test_the_expected_file_reads_as_intended():
    # What the fixed file says, in words: a developer prompt as system, one tool call answered,
    # the final answer; and a coding agent whose last call was never answered: dropped, its
    # thinking kept as reasoning_content, the <think> spans out of every content.
    weather, swe = [json.loads(line) for line in EXPECTED.read_text().splitlines()]
    assert [m["role"] for m in weather["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert weather["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "chatcmpl-tool-aecb7a4507d66fe1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "New York"}'},
            }
        ],
    }
    assert weather["tools"][0]["function"]["strict"] is True and "type" not in weather["tools"][0]["function"]
    last = swe["messages"][-1]
    assert last["role"] == "assistant" and "tool_calls" not in last and last["reasoning_content"] and swe["tools"] == []
    assert not any(
        "<think>" in (m.get("content") or "") or "</think>" in (m.get("content") or "") for m in swe["messages"][2:]
    )


def row_of(output, *, input_items=None, instructions=None, tools=None):
    params = {"input": input_items if input_items is not None else [{"role": "user", "content": "hi"}]}
    if instructions is not None:
        params["instructions"] = instructions
    if tools is not None:
        params["tools"] = tools
    return {"responses_create_params": params, "response": {"output": output}, "reward": 1.0}


REASONING = {
    "type": "reasoning",
    "id": "rs",
    "summary": [{"type": "summary_text", "text": "think A"}, {"type": "summary_text", "text": "think B"}],
}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "42"}]}


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("keep", {"role": "assistant", "content": "42", "reasoning_content": "think A\n\nthink B"}),
        ("think", {"role": "assistant", "content": "<think>think A\n\nthink B</think>42"}),
        ("drop", {"role": "assistant", "content": "42"}),
    ],
)
def test_reasoning_is_kept_or_dropped_by_option(mode, expected):
    assert conversation(row_of([REASONING, ANSWER]), reasoning=mode)["messages"][-1] == expected


def test_reasoning_content_wins_over_its_summary_and_encrypted_only_has_none():
    item = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "short"}],
        "content": [{"type": "reasoning_text", "text": "the whole thought"}],
    }
    assert conversation(row_of([item, ANSWER]))["messages"][-1]["reasoning_content"] == "the whole thought"
    encrypted = {"type": "reasoning", "summary": [], "encrypted_content": "xyz"}
    assert conversation(row_of([encrypted, ANSWER]))["messages"][-1] == {"role": "assistant", "content": "42"}


def test_an_unknown_reasoning_mode_is_an_error():
    with pytest.raises(ValueError, match="keep, think, drop"):
        conversation(row_of([ANSWER]), reasoning="summarise")


def test_instructions_become_one_system_message_with_leading_system_messages_folded():
    conv = conversation(
        row_of(
            [ANSWER],
            instructions="Be brief.",
            input_items=[
                {"role": "system", "content": "You add numbers."},
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": "2+2"},
            ],
        )
    )
    assert conv["messages"][:2] == [
        {"role": "system", "content": "Be brief.\n\nYou add numbers.\n\nUse tools."},
        {"role": "user", "content": "2+2"},
    ]


def test_a_string_input_is_one_user_message_and_parts_stay_parts():
    row = row_of([ANSWER])
    row["responses_create_params"]["input"] = "what is 6*7?"
    assert conversation(row)["messages"][0] == {"role": "user", "content": "what is 6*7?"}
    parts = [{"type": "input_text", "text": "look:"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]
    conv = conversation(row_of([ANSWER], input_items=[{"role": "user", "content": parts}]))
    assert conv["messages"][0]["content"] == [
        {"type": "text", "text": "look:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "auto"}},
    ]


def call(call_id, name="f", arguments="{}"):
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id, text="ok"):
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def test_parallel_calls_make_one_assistant_message_and_a_repeated_call_id_keeps_the_last():
    conv = conversation(
        row_of(
            [
                call("a", arguments='{"n": 1}'),
                call("b"),
                call("a", arguments='{"n": 2}'),
                output("a"),
                output("b"),
                ANSWER,
            ]
        )
    )
    assistant = conv["messages"][1]
    assert [(c["id"], c["function"]["arguments"]) for c in assistant["tool_calls"]] == [("b", "{}"), ("a", '{"n": 2}')]
    assert [m["role"] for m in conv["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]


def test_an_unanswered_call_is_dropped_even_at_the_end_and_turns_left_side_by_side_are_joined():
    middle = conversation(row_of([call("a"), call("lost"), output("a"), ANSWER]))
    assert [c["id"] for c in middle["messages"][1]["tool_calls"]] == ["a"]
    only_lost = conversation(
        row_of(
            [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ""}]},
                call("lost"),
                {"type": "message", "role": "user", "content": "go on"},
                ANSWER,
            ]
        )
    )
    assert only_lost["messages"] == [{"role": "user", "content": "hi\n\ngo on"}, {"role": "assistant", "content": "42"}]
    end = conversation(row_of([call("a"), output("a"), call("stopped")]))
    assert [m["role"] for m in end["messages"]] == ["user", "assistant", "tool"]


def test_non_string_arguments_are_written_as_json_text():
    conv = conversation(row_of([call("a", arguments={"n": 1}), output("a")]))
    assert conv["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"n": 1}'


def test_a_refusal_goes_in_the_refusal_field():
    refusal = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't"}]}
    assert conversation(row_of([refusal]))["messages"][-1] == {"role": "assistant", "content": "", "refusal": "I can't"}


@pytest.mark.parametrize(
    "item, why",
    [
        (
            {"type": "web_search_call", "id": "ws", "status": "completed"},
            "item 1 (web_search_call): no chat representation",
        ),
        (output("never-made"), "which no earlier function_call made"),
        ({"type": "message", "role": "tool", "content": "x"}, "message role 'tool'"),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
            "content part 'input_file'",
        ),
    ],
)
def test_what_chat_cannot_hold_is_not_convertible_and_names_the_item(item, why):
    with pytest.raises(NotConvertible, match=why.replace("(", r"\(").replace(")", r"\)")):
        conversation(row_of([item]))


def test_convert_lines_leaves_out_rows_it_cannot_convert_and_says_which():
    skipped: list[str] = []
    lines = list(convert_lines([row_of([ANSWER]), row_of([{"type": "mcp_call"}])], skipped=skipped))
    assert len(lines) == 1 and json.loads(lines[0])["messages"][-1]["content"] == "42"
    assert skipped == ["row 2: item 1 (mcp_call): no chat representation"]


def test_only_function_tools_go_in_tools_and_none_values_are_dropped():
    tools = [
        {"type": "function", "name": "f", "description": None, "parameters": {"type": "object"}, "strict": None},
        {"type": "web_search"},
        {"type": "function"},
    ]
    assert tools_to_chat(tools) == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
