"""Record how NeMo Gym 0.7.0's remote_agent returns an env's ``/verify`` reply from ``/run``.

Run it ONCE with the Python of a NeMo Gym 0.7.0 venv (not gymweb's; the test suite never imports
NeMo Gym):

    /path/to/ngpeer/venv/bin/python scripts/record_agent_results.py \
        [--data ../shared/data/nemo_gym] [--output tests/data/agent_results.json]

The remote_agent ends ``/run`` with ``RemoteAgentVerifyResponse.model_validate(verify_json)``, and
FastAPI writes that model as the ``/run`` reply; the collector parses it and adds its keys. Each
case's ``reply`` (an env's ``/verify`` reply: runA's rows given in the order gymweb's example counter
env echoes them, with the reward last, and made-up edge cases) goes through that model and a real
FastAPI route declared like the agent's, and the JSON the route answers is stored as ``result``
(``null`` with ``refused`` when the model refuses the reply: NeMo Gym's ``run()`` then catches the
error and writes a failure row whose ``error`` is recorded as ``error``).
``tests/test_success_row_order.py`` asserts ``nemo_request.agent_result`` gives the same bytes, and
``tests/test_verify_reply_like_nemo_gym.py`` that ``nemo_request.verify_refusal`` gives the same verdicts.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _sparse(value: Any) -> Any:
    """``value`` with every null left out (what a hand-written env or agent sends)."""
    if isinstance(value, dict):
        return {k: _sparse(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_sparse(v) for v in value]
    return value


def cases(data: Path) -> list[dict[str, Any]]:
    run_a = data / "eval_0.7.0/runA"
    inputs = {}
    for line in (run_a / "rollouts_materialized_inputs.jsonl").read_text().splitlines():
        row = json.loads(line)
        inputs[(row["_ng_task_index"], row["_ng_rollout_index"])] = row
    out = []
    for n, line in enumerate((run_a / "rollouts.jsonl").read_text().splitlines()[:6]):
        row = json.loads(line)
        task = inputs[(row["_ng_task_index"], row["_ng_rollout_index"])]
        # gymweb's example counter env (echo): the /verify body (the task row, then response), reward last
        echo = {**task, "response": row["response"] if n % 2 else _sparse(row["response"]), "reward": row["reward"]}
        out.append({"case": f"runA row {n}, the counter env's echo order", "reply": echo})
    base = json.loads((run_a / "rollouts.jsonl").read_text().splitlines()[0])
    task = inputs[(base["_ng_task_index"], base["_ng_rollout_index"])]
    sparse = {"responses_create_params": task["responses_create_params"], "response": _sparse(base["response"])}
    made_up = [
        ("reward first, then the fields", {"reward": 1.0, **sparse}),
        ("an int reward", {**sparse, "reward": 1}),
        ("a bool reward", {**sparse, "reward": True}),
        ("a string reward", {**sparse, "reward": "0.5"}),
        ("no reward", dict(sparse)),
        (
            "mask_sample as 1, failure fields set",
            {"failure_reason": "r", **sparse, "reward": 0.0, "mask_sample": 1, "failure_kind": "env_error"},
        ),
        ("extras before and after", {"score": 3, **sparse, "reward": 0.5, "note": "x", "nested": {"b": 1, "a": 2}}),
        ("numeric extras and usage", {"accuracy": 0.25, **sparse, "reward": 0.25, "num_steps": 4, "flag": True}),
        ("capture_rollout_id given", {**sparse, "reward": 0.0, "capture_rollout_id": "abc"}),
        ("_ng_rollout_id given", {**sparse, "reward": 0.0, "_ng_rollout_id": "abc"}),
        (
            "collector keys already present",
            {"_ng_task_index": 3, **sparse, "reward": 1.0, "_ng_rollout_index": 1, "agent_ref": {"name": "a"}},
        ),
        ("a string input", {**sparse, "responses_create_params": {"input": "hi"}, "reward": 0.0}),
        ("no response", {"responses_create_params": sparse["responses_create_params"], "reward": 0.0}),
        ("no responses_create_params", {"response": sparse["response"], "reward": 0.0}),
        ("mask_sample as a string", {**sparse, "reward": 0.0, "mask_sample": "yes"}),
        ("failure_kind as a number", {**sparse, "reward": 0.0, "failure_kind": 3}),
        ("a false reward", {**sparse, "reward": False}),
        ("a padded string reward", {**sparse, "reward": " 1 "}),
        ("an exponent string reward", {**sparse, "reward": "2.5e-1"}),
        ("an underscored string reward", {**sparse, "reward": "1_0"}),
        ("a word reward", {**sparse, "reward": "abc"}),
        ("an empty string reward", {**sparse, "reward": ""}),
        ("a null reward", {**sparse, "reward": None}),
        ("a list reward", {**sparse, "reward": [1]}),
        ("an object reward", {**sparse, "reward": {"v": 1}}),
        ("mask_sample as a word", {**sparse, "reward": 0.0, "mask_sample": "maybe"}),
        ("mask_sample null", {**sparse, "reward": 0.0, "mask_sample": None}),
        ("failure_reason as a list", {**sparse, "reward": 0.0, "failure_reason": ["x"]}),
        ("response not an object", {**sparse, "response": "done", "reward": 1.0}),
        ("response an empty object", {**sparse, "response": {}, "reward": 1.0}),
        (
            "response without output",
            {**sparse, "response": {k: v for k, v in sparse["response"].items() if k != "output"}, "reward": 1.0},
        ),
        ("responses_create_params null", {**sparse, "responses_create_params": None, "reward": 1.0}),
        ("responses_create_params input a number", {**sparse, "responses_create_params": {"input": 3}, "reward": 1.0}),
        ("responses_create_params without input", {**sparse, "responses_create_params": {"model": "m"}, "reward": 1.0}),
        ("capture_rollout_id as a number", {**sparse, "reward": 0.0, "capture_rollout_id": 5}),
    ]
    out.extend({"case": name, "reply": reply} for name, reply in made_up)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/nemo_gym")
    parser.add_argument("--output", type=Path, default=ROOT / "tests/data/agent_results.json")
    args = parser.parse_args()
    import orjson
    from fastapi import Body, FastAPI
    from fastapi.testclient import TestClient
    from pydantic import ValidationError

    sys.path.insert(0, "")
    from responses_api_agents.remote_agent.app import RemoteAgentRunRequest, RemoteAgentVerifyResponse

    app = FastAPI()
    holder: dict[str, Any] = {}

    async def run(body: RemoteAgentRunRequest = Body()) -> RemoteAgentVerifyResponse:  # noqa: B008 (the agent's signature)
        return RemoteAgentVerifyResponse.model_validate(holder["reply"])

    app.post("/run")(run)
    client = TestClient(app)
    recorded = []
    for case in cases(args.data):
        try:
            RemoteAgentVerifyResponse.model_validate(case["reply"])
        except ValidationError as exc:
            # run() catches it: _failure_response(record, f"unexpected error: {type(e).__name__}: {e}")
            recorded.append(
                {
                    **case,
                    "result": None,
                    "refused": str(exc).splitlines()[0],
                    "error": f"unexpected error: {type(exc).__name__}: {exc}",
                }
            )
            continue
        holder["reply"] = case["reply"]
        answer = client.post("/run", json={"responses_create_params": {"input": []}})
        answer.raise_for_status()
        # the collector: orjson.loads of the /run reply, written with orjson.dumps
        recorded.append({**case, "result": orjson.loads(answer.content)})
    what = (
        "NeMo Gym 0.7.0's remote_agent /run reply for an env's /verify reply: "
        "RemoteAgentVerifyResponse.model_validate(reply) returned from a FastAPI route declared like the "
        "agent's, as the collector parses it (result null and refused: the model refuses the reply); "
        "recorded once with scripts/record_agent_results.py in the NeMo Gym peer venv"
    )
    args.output.write_text(json.dumps({"what": what, "cases": recorded}, indent=1) + "\n")
    print(f"wrote {len(recorded)} cases to {args.output}")


if __name__ == "__main__":
    main()
