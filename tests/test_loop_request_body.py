"""The agent request body is built from pieces serialised once per item (issue 14); it must stay
byte for byte the JSON of the row's params with the conversation so far as ``input``."""
import json

from rollouts.engine.loop import LoopSettings, _dumps, _Rollout


def _whole(rollout):
    params = dict(rollout.params)
    params["input"] = rollout.input
    return json.dumps(params, ensure_ascii=False, separators=(",", ":")).encode()


def test_the_body_equals_the_json_of_the_whole_conversation_at_every_step():
    row = {"responses_create_params": {"model": "m", "input": "hé \u0000", "tools": [{"type": "function", "name": "t"}], "temperature": 0.2}}
    rollout = _Rollout(None, row, LoopSettings("http://127.0.0.1:1", "http://127.0.0.1:2"), None)
    assert rollout._agent_body() == _whole(rollout)
    for step in range(5):
        rollout.input.append({"type": "function_call", "call_id": f"c{step}", "arguments": "{\"x\": \"\u2028\"}"})
        rollout.input.append({"type": "function_call_output", "call_id": f"c{step}", "output": [1, 2.5, -0.0, 1e308]})
        assert rollout._agent_body() == _whole(rollout)
    assert json.loads(rollout._agent_body())["input"][-1]["output"] == [1, 2.5, -0.0, 1e308]


def test_the_input_keeps_its_place_among_the_params_and_is_added_last_when_missing():
    first = _Rollout(None, {"responses_create_params": {"a": 1, "input": [], "z": 2}}, LoopSettings("http://h", "http://e"), None)
    assert first._agent_body() == b'{"a":1,"input":[],"z":2}'
    missing = _Rollout(None, {"responses_create_params": {"model": "m"}}, LoopSettings("http://h", "http://e"), None)
    missing.input.append({"role": "user", "content": "x"})
    assert missing._agent_body() == _dumps({"model": "m", "input": [{"role": "user", "content": "x"}]})
