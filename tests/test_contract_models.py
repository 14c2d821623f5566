"""Unit tests of ``rollouts.engine.contract``: the shape of a valid reply (rule 3), asks (rule 4), tool
names (rule 5), arguments (rule 6) and usage sums (rule 8). No HTTP here; see ``test_loop_*``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rollouts.engine.contract import (
    RESERVED_ENV_ROUTES,
    AgentReply,
    InvalidReply,
    add_usage,
    arguments_problem,
    find_asks,
    has_assistant_message,
    parse_reply,
    tool_name_problem,
)
from tests.servers import call, call_output, message, reasoning, reply, usage

NEMO_GYM_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "nemo_gym"


def invalid(data: dict) -> str:
    with pytest.raises(InvalidReply) as info:
        parse_reply(data)
    return str(info.value)


# -- rule 3: what a valid reply is ----------------------------------------------------------------
def quickstart_reply(output: list) -> dict:
    """Exactly the object the seed's quickstart service returns (Claude CLI usage style)."""
    cli_usage: dict = {}
    return {
        "id": "claude-cli-service",
        "created_at": 0.0,
        "model": "claude-haiku",
        "object": "response",
        "output": output,
        "parallel_tool_calls": False,
        "tools": [],
        "tool_choice": "auto",
        "usage": {
            "input_tokens": cli_usage.get("input_tokens", 0),
            "output_tokens": cli_usage.get("output_tokens", 0),
            "total_tokens": cli_usage.get("input_tokens", 0) + cli_usage.get("output_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def test_the_seeds_quickstart_tool_call_reply_validates():
    turn = 0
    calls = [{"name": "increment_counter", "arguments": {"count": 1}}, {"name": "get_counter_value"}]
    output = [
        {
            "type": "function_call",
            "id": f"fc_{turn}_{k}",
            "call_id": f"c_{turn}_{k}",
            "name": c["name"],
            "arguments": json.dumps(c.get("arguments", {})),
        }
        for k, c in enumerate(calls)
    ]
    parsed = parse_reply(quickstart_reply(output))
    assert isinstance(parsed, AgentReply)
    assert len(parsed.output) == 2


def test_the_seeds_quickstart_final_answer_reply_validates():
    output = [
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "id": "m_2",
            "content": [{"type": "output_text", "text": "3", "annotations": []}],
        }
    ]
    parse_reply(quickstart_reply(output))


def _nemo_gym_responses() -> list:
    if not NEMO_GYM_DATA.is_dir():
        return []
    found = []
    for path in sorted(NEMO_GYM_DATA.glob("*/example_rollouts.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                found.append(pytest.param(json.loads(line)["response"], id=f"{path.parent.name}:{number}"))
    return found


@pytest.mark.skipif(not NEMO_GYM_DATA.is_dir(), reason="NeMo Gym sample data not present")
@pytest.mark.parametrize("response", _nemo_gym_responses())
def test_real_nemo_gym_responses_validate(response):
    parse_reply(response)


@pytest.mark.parametrize(
    "field", ["id", "created_at", "model", "object", "output", "parallel_tool_calls", "tool_choice", "tools"]
)
def test_a_reply_missing_a_required_field_is_invalid_and_the_error_names_it(field):
    data = reply(message())
    del data[field]
    assert field in invalid(data)


def test_a_reply_whose_object_is_not_response_is_invalid():
    assert "object" in invalid(reply(message(), object="chat.completion"))


def test_a_reply_whose_created_at_is_not_a_number_is_invalid():
    assert "created_at" in invalid(reply(message(), created_at="yesterday"))


def test_an_integer_created_at_is_accepted_as_in_lax_mode():
    parse_reply(reply(message(), created_at=1700000000))


def test_unknown_extra_fields_are_tolerated_at_top_level_and_in_items():
    data = reply(
        {**message(), "phase": None, "custom": {"x": 1}},
        {**call("increment_counter", {"count": 1}), "provider_specific": [1, 2]},
        usage={**usage(), "cache_write_tokens": 3, "cost_usd": 0.1},
        service_tier="default",
        my_vendor_field={"deep": True},
    )
    parse_reply(data)


def test_usage_may_be_omitted():
    data = reply(message())
    del data["usage"]
    assert parse_reply(data).usage is None


def test_usage_may_be_null():
    assert parse_reply(reply(message(), use=None)).usage is None


def test_usage_does_not_require_cache_write_tokens():
    parsed = parse_reply(reply(message(), use=usage(7, 3)))
    assert parsed.usage is not None and parsed.usage.total_tokens == 10


@pytest.mark.parametrize(
    "path",
    [
        ("input_tokens",),
        ("output_tokens",),
        ("total_tokens",),
        ("input_tokens_details",),
        ("output_tokens_details",),
        ("input_tokens_details", "cached_tokens"),
        ("output_tokens_details", "reasoning_tokens"),
    ],
)
def test_a_partial_usage_is_invalid(path):
    partial = usage()
    target = partial
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    assert "usage" in invalid(reply(message(), use=partial))


def test_an_empty_usage_object_is_invalid():
    assert "usage" in invalid(reply(message(), use={}))


def test_an_item_of_unknown_type_is_invalid():
    assert "not_a_real_item" in invalid(reply({"type": "not_a_real_item", "id": "x"}))


def test_an_item_without_a_type_is_invalid():
    assert "output.0" in invalid(reply({"call_id": "c", "name": "t", "arguments": "{}"}))


def test_an_item_that_is_not_an_object_is_invalid():
    invalid(reply("just a string"))


@pytest.mark.parametrize("arguments", [{"count": 1}, 1, None, ["a"]])
def test_function_call_arguments_that_are_not_a_string_are_invalid(arguments):
    item = {"type": "function_call", "call_id": "c1", "name": "increment_counter", "arguments": arguments}
    assert "arguments" in invalid(reply(item))


@pytest.mark.parametrize("field", ["call_id", "name", "arguments"])
def test_a_function_call_missing_a_required_field_is_invalid(field):
    item = call("increment_counter", {"count": 1})
    del item[field]
    assert field in invalid(reply(item))


def test_a_function_call_may_have_null_id_and_status():
    parse_reply(reply(call("t", {}, id=None, status=None)))
    parse_reply(reply(call("t", {}, id="fc_1", status="completed")))


def test_a_function_call_output_takes_a_string_or_a_content_list():
    parse_reply(reply(call("t"), call_output("call_1", "plain text")))
    parse_reply(reply(call("t"), call_output("call_1", [{"type": "input_text", "text": "rich"}])))


def test_a_function_call_output_without_call_id_is_invalid():
    assert "call_id" in invalid(reply({"type": "function_call_output", "output": "x"}))


def test_a_reasoning_item_needs_an_id_and_a_summary_list():
    parse_reply(reply(reasoning()))
    invalid(reply({"type": "reasoning", "summary": []}))
    invalid(reply({"type": "reasoning", "id": "rs", "summary": "not a list"}))


def test_an_assistant_message_with_a_refusal_is_valid():
    item = {**message(), "content": [{"type": "refusal", "refusal": "I cannot"}]}
    parse_reply(reply(item))


def test_an_assistant_message_with_an_unknown_content_part_is_invalid():
    item = {**message(), "content": [{"type": "sticker", "text": "x"}]}
    invalid(reply(item))


@pytest.mark.parametrize(
    "item",
    [
        {"type": "mcp_call", "name": "t", "arguments": "{}", "status": "anything"},
        {"type": "web_search_call", "id": "h1", "status": "completed", "action": {"type": "search", "query": "q"}},
        {
            "type": "code_interpreter_call",
            "id": "h1",
            "status": "completed",
            "code": "1",
            "container_id": "c",
            "outputs": None,
        },
        {"type": "image_generation_call", "id": "h1", "status": "completed", "result": None},
    ],
    ids=lambda item: item["type"],
)
def test_hosted_tool_items_in_their_sdk_shape_pass_through_with_extra_fields(item):
    parsed = parse_reply(reply({**item, "anything": {"nested": [1, 2]}}, message()))
    assert len(parsed.output) == 2


@pytest.mark.parametrize("kind, missing", [("web_search_call", "action"), ("code_interpreter_call", "container_id")])
def test_a_hosted_tool_item_missing_a_field_of_its_sdk_shape_is_invalid(kind, missing):
    assert f"output.0.{missing}: Field required" in invalid(reply({"type": kind, "id": "h1", "status": "completed"}))


def test_an_invalid_reply_lists_the_field_errors_readably():
    text = invalid(reply({"type": "function_call", "name": "t", "arguments": "{}"}, use={"input_tokens": 1}))
    assert "output.0.call_id" in text
    assert "usage" in text


def test_parse_reply_does_not_mutate_the_agents_dict():
    data = reply({**message(), "extra": 1}, call("t"))
    before = copy.deepcopy(data)
    parse_reply(data)
    assert data == before


# -- rule 4: asks ---------------------------------------------------------------------------------
def test_unpaired_function_calls_are_asks_in_order():
    output = [call("a", call_id="c1"), message(), call("b", call_id="c2")]
    assert [a["call_id"] for a in find_asks(output)] == ["c1", "c2"]


def test_a_call_paired_with_an_output_in_the_same_reply_is_not_an_ask():
    output = [call("own", call_id="c1"), call_output("c1", "42"), call("gym", call_id="c2")]
    assert [a["call_id"] for a in find_asks(output)] == ["c2"]


def test_an_output_before_its_call_still_pairs_within_the_reply():
    output = [call_output("c1", "42"), call("own", call_id="c1")]
    assert find_asks(output) == []


def test_a_repeated_call_id_among_asks_runs_once_and_the_last_wins():
    first = call("increment_counter", {"count": 1}, call_id="dup")
    last = call("increment_counter", {"count": 2}, call_id="dup")
    asks = find_asks([first, call("other", call_id="c9"), last])
    assert [a["call_id"] for a in asks] == ["c9", "dup"]
    assert asks[1] is last


def test_has_assistant_message_ignores_reasoning_and_calls():
    assert has_assistant_message([reasoning(), message()])
    assert not has_assistant_message([reasoning(), call("t")])
    assert not has_assistant_message([{"type": "message", "role": "user", "content": "hi"}])


# -- rule 5: tool names ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["increment_counter", "get-count", "v1.tool", "Tool42", "a...b"])
def test_ordinary_tool_names_may_be_sent(name):
    assert tool_name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    ["a/b", "..", ".", "x?y", "x#y", "%2e", "%2e%2e", "a b", "", " ", "tab\tname", "new\nline", "/verify", "verify/"],
)
def test_names_that_are_not_one_safe_path_segment_are_refused(name):
    assert tool_name_problem(name)


@pytest.mark.parametrize("name", sorted(RESERVED_ENV_ROUTES))
def test_the_envs_own_routes_are_refused(name):
    assert {"seed_session", "verify", "aggregate_metrics", "close_session"} <= RESERVED_ENV_ROUTES
    assert tool_name_problem(name)


# -- rule 6: arguments ----------------------------------------------------------------------------
def test_valid_json_arguments_decode():
    assert arguments_problem('{"count": 2}') == ({"count": 2}, None)


def test_invalid_json_arguments_name_the_parse_error():
    value, problem = arguments_problem("{count: 2}")
    assert value is None
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads("{count: 2}")
    assert str(info.value) in problem


# -- rule 8: usage sums ---------------------------------------------------------------------------
def test_add_usage_sums_every_counter():
    total = add_usage(None, usage(10, 5, cached=2, reasoning_tokens=1))
    total = add_usage(total, usage(7, 3, cached=1, reasoning_tokens=4))
    assert total == {
        "input_tokens": 17,
        "output_tokens": 8,
        "total_tokens": 25,
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens_details": {"reasoning_tokens": 5},
    }


def test_add_usage_treats_none_as_not_reported():
    assert add_usage(None, None) is None
    assert add_usage(usage(1, 1), None) == usage(1, 1)


def test_add_usage_does_not_mutate_its_inputs():
    first, second = usage(1, 2), usage(3, 4)
    add_usage(add_usage(None, first), second)
    assert first == usage(1, 2) and second == usage(3, 4)


def test_negative_and_numeric_string_token_counts_are_accepted_as_nemo_gym_does_and_summed_as_integers():
    first = usage(7, 3)
    first["input_tokens"] = -5
    second = {**usage(1, 1), "output_tokens": "4"}
    parse_reply(reply(message(), use=first))
    parse_reply(reply(message(), use=second))
    total = add_usage(add_usage(None, first), second)
    assert total["input_tokens"] == -4 and total["output_tokens"] == 7
