"""A stand-in for NeMo Gym's ``gym`` executable in tests: ``fake_gym.py env start "+config_paths=[A,B]"``
reads the configs, serves the counter env on a free port and a head server on the config's
``head_server`` port (answering ``/health``, ``/global_config_dict_yaml``, ``/server_instances`` like
NeMo Gym 0.7.0's), and forks a child (as NeMo Gym forks its servers) so the test can check that the
whole process group is stopped. Writes its pids to ``$FAKE_GYM_PIDS``."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import yaml
from aiohttp import web

from gymweb.examples._serve import _start, json_response
from gymweb.examples.counter_env import make_app as counter_env


async def main(paths: list[str]) -> None:
    config: dict = {}
    for p in paths:
        config.update(yaml.safe_load(open(p)) or {})
    env_runner, env_port = await _start(counter_env(), "127.0.0.1", 0)
    env_name = next(k for k, v in config.items() if isinstance(v, dict) and "resources_servers" in v)
    inner = next(iter(config[env_name]["resources_servers"].values()))
    inner.update(host="127.0.0.1", port=env_port)
    instances = [
        {
            "process_name": env_name,
            "server_type": "resources_servers",
            "name": env_name,
            "host": "127.0.0.1",
            "port": env_port,
            "url": f"http://127.0.0.1:{env_port}",
        }
    ]
    app = web.Application()
    app.router.add_get("/health", lambda r: json_response({"status": "ok"}))
    app.router.add_get("/global_config_dict_yaml", lambda r: json_response(yaml.safe_dump(config, sort_keys=False)))
    app.router.add_get("/server_instances", lambda r: json_response(instances))
    await asyncio.sleep(0.5)  # "starting": the caller must wait for /health
    head = config["head_server"]
    await _start(app, head["host"], int(head["port"]))
    await asyncio.Event().wait()


if __name__ == "__main__":
    assert sys.argv[1:3] == ["env", "start"], sys.argv
    paths = sys.argv[3].removeprefix("+config_paths=[").removesuffix("]").split(",")
    child = os.fork()
    if child == 0:  # a server process of its own, in the same process group
        import time

        while True:
            time.sleep(1)
    with open(os.environ["FAKE_GYM_PIDS"], "w") as fh:
        json.dump([os.getpid(), child], fh)
    asyncio.run(main(paths))
