"""The agent request body is built from pieces serialised once per item; it must stay
byte for byte the JSON of the row's params with the conversation so far as ``input``."""

import json

from rollouts.engine.loop import LoopSettings, _dumps, _Rollout


def _whole(rollout):
    params = dict(rollout.params)
    params["input"] = rollout.input
    return json.dumps(params, ensure_ascii=False, separators=(",", ":")).encode()


def test_the_body_equals_the_json_of_the_whole_conversation_at_every_step():
    row = {
        "responses_create_params": {
            "model": "m",
            "input": "hé \u0000",
            "tools": [{"type": "function", "name": "t"}],
            "temperature": 0.2,
        }
    }
    rollout = _Rollout(None, row, LoopSettings("http://127.0.0.1:1", "http://127.0.0.1:2"), None)
    assert rollout._agent_body() == _whole(rollout)
    for step in range(5):
        rollout.input.append({"type": "function_call", "call_id": f"c{step}", "arguments": '{"x": "\u2028"}'})
        rollout.input.append({"type": "function_call_output", "call_id": f"c{step}", "output": [1, 2.5, -0.0, 1e308]})
        assert rollout._agent_body() == _whole(rollout)
    assert json.loads(rollout._agent_body())["input"][-1]["output"] == [1, 2.5, -0.0, 1e308]


def test_the_params_go_in_nemo_gyms_field_order_with_fields_it_does_not_know_last():
    """NeMo Gym's remote_agent sends the params it was given in its request model's field order
    (``model_dump(exclude_unset=True)``); fields that model does not know (NeMo Gym refuses them)
    keep their order after those."""
    first = _Rollout(
        None, {"responses_create_params": {"a": 1, "input": [], "z": 2}}, LoopSettings("http://h", "http://e"), None
    )
    assert first._agent_body() == b'{"input":[],"a":1,"z":2}'
    params = {"tools": [], "temperature": 0.5, "input": [{"role": "user", "content": "x"}], "model": "m"}
    known = _Rollout(None, {"responses_create_params": params}, LoopSettings("http://h", "http://e"), None)
    assert known._agent_body() == b'{"input":[{"content":"x","role":"user"}],"model":"m","temperature":0.5,"tools":[]}'
    missing = _Rollout(None, {"responses_create_params": {"model": "m"}}, LoopSettings("http://h", "http://e"), None)
    missing.input.append({"role": "user", "content": "x"})
    assert missing._agent_body() == _dumps({"model": "m", "input": [{"role": "user", "content": "x"}]})
