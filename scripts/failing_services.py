"""The failing env and agent service behind ``scripts/record_failure_text_rows.py``.

Run in the NeMo Gym peer's venv; never imported by gymweb. Each task row names its case in
``failure_case`` (the env reads it from the ``/seed_session`` and ``/verify`` bodies) and in
``responses_create_params.metadata.failure_case`` (the agent reads it from its request). A case is
``{"party": "seed_session" | "verify" | "agent", "status", "content_type", "body", "headers",
"sleep_s"}``: the party answers ``status`` with ``body`` sent byte for byte, after ``sleep_s``
seconds (and with ``go_dark`` the env stops listening once it has answered); the other parties
answer as a healthy service does. ``POST /go_dark`` makes the env stop listening (an unreachable env,
while ``gym env start`` keeps its process).

- ``env``: a NeMo Gym resources server started by ``gym env start`` (copied in as
  ``resources_servers/failing_env/app.py``, its cases in ``cases.json`` beside it).
- ``agent``: ``python failing_services.py agent --port P --cases cases.json``, an aiohttp
  ``/v1/responses`` service answering a final assistant message unless its case fails it.
"""

import asyncio
import json
import sys
from pathlib import Path

FINAL_REPLY = {
    "id": "resp_final",
    "object": "response",
    "created_at": 0,
    "model": "failing-agent",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "status": "completed",
}


def run_agent(port: int, cases: dict) -> None:
    from aiohttp import web

    async def responses(request):
        body = await request.json()
        case = cases.get(((body.get("metadata") or {}).get("failure_case")) or "", {})
        if case.get("party") != "agent":
            return web.json_response(FINAL_REPLY)
        await asyncio.sleep(case.get("sleep_s", 0))
        return web.Response(
            body=case["body"].encode(),
            status=case["status"],
            headers={"Content-Type": case["content_type"], **case.get("headers", {})},
        )

    async def health(request):
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *a: print(*a, flush=True))


from fastapi import FastAPI, Request, Response  # noqa: E402
from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer  # noqa: E402

CASES_FILE = Path(__file__).parent / "cases.json"


async def _answer(route: str, request: Request) -> Response:
    cases = json.loads(CASES_FILE.read_text())
    body = await request.json()
    case = cases.get(body.get("failure_case") or "", {})
    if case.get("party") != route:
        return Response(content=b'{"reward":1.0}' if route == "verify" else b"{}", media_type="application/json")
    await asyncio.sleep(case.get("sleep_s", 0))
    if case.get("go_dark"):
        _stop_listening()
    return Response(
        content=case["body"].encode(),
        status_code=case["status"],
        media_type=case["content_type"],
        headers=case.get("headers", {}),
    )


def _stop_listening() -> None:
    """Close this process's listening sockets (uvicorn's): connections are refused from now on,
    while the process stays up, so ``gym env start`` keeps the stack running."""
    import gc

    import uvicorn

    for server in [o for o in gc.get_objects() if isinstance(o, uvicorn.Server)]:
        for listener in server.servers:
            listener.close()


class FailingEnvConfig(BaseResourcesServerConfig):
    pass


class FailingEnvServer(SimpleResourcesServer):
    ray_enabled = False
    config: FailingEnvConfig

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.post("/seed_session")(self.failing_seed_session)
        app.post("/verify")(self.failing_verify)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        app.post("/go_dark")(self.go_dark)
        return app

    async def go_dark(self) -> Response:
        """Stop listening and close this connection."""
        _stop_listening()
        return Response(content=b"{}", media_type="application/json", headers={"Connection": "close"})

    async def failing_seed_session(self, request: Request) -> Response:
        return await _answer("seed_session", request)

    async def failing_verify(self, request: Request) -> Response:
        return await _answer("verify", request)

    async def verify(self, *args, **kwargs):  # the abstract method; /verify is failing_verify
        raise NotImplementedError


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "agent":
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("role")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--cases", type=Path, required=True)
        args = parser.parse_args()
        run_agent(args.port, json.loads(args.cases.read_text()))
    else:
        FailingEnvServer.run_webserver()
