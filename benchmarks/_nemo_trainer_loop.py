"""NeMo Gym 0.7.0's side of bench_trainer: a training loop on ``RolloutCollectionHelper.run_examples``.

Runs in NeMo Gym's own venv (Python 3.13), not gymweb's. Reads one command per stdin line, a JSON
object ``{"rows": [...]}`` (one batch), runs it through ``run_examples`` against the head server at
``--head-port`` and prints one JSON line: ``{"batch_s", "first_s", "n", "rewards"}`` (seconds from the
call to the last and to the first result). An empty line ends it.
"""

import argparse
import asyncio
import json
import os
import sys
import time

# Results go to the original stdout; anything NeMo Gym prints goes to stderr.
RESULTS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.rollout_collection import RolloutCollectionHelper


async def one_batch(helper, head, rows):
    t0 = time.monotonic()
    first = None
    rewards = []
    prepared = helper.preprocess_examples([{**row, "agent_ref": {"name": "remote_agent"}} for row in rows])
    for future in helper.run_examples(prepared, head_server_config=head):
        _row, result = await future
        if first is None:
            first = time.monotonic() - t0
        rewards.append(result.get("reward"))
    return {"batch_s": time.monotonic() - t0, "first_s": first, "n": len(rewards), "rewards": rewards}


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-port", type=int, default=11000)
    args = parser.parse_args()
    helper = RolloutCollectionHelper()
    head = BaseServerConfig(host="127.0.0.1", port=args.head_port)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            return
        out = await one_batch(helper, head, json.loads(line)["rows"])
        RESULTS.write(json.dumps(out) + "\n")
        RESULTS.flush()


if __name__ == "__main__":
    asyncio.run(main())
