"""A NeMo Gym resources server whose ``/verify`` answers a reply NeMo Gym's remote_agent refuses.

Started by ``gym env start`` in the NeMo Gym peer's venv (``scripts/record_verify_refusal_rows.py``
copies it in as ``resources_servers/refusing_verify/app.py``); never imported by gymweb. The counter's
two tools answer fixed bodies; ``/verify`` answers the case the task row names in ``refusal_case``,
read from ``cases.json`` beside this file: ``{"name": {"status", "content_type", "body"}}``, the body
sent byte for byte.
"""

import json
from pathlib import Path

from fastapi import FastAPI, Request, Response
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    SimpleResourcesServer,
)

CASES = json.loads((Path(__file__).parent / "cases.json").read_text())


class RefusingVerifyConfig(BaseResourcesServerConfig):
    pass


class RefusingVerifyServer(SimpleResourcesServer):
    ray_enabled = False
    config: RefusingVerifyConfig

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.post("/seed_session")(self.seed_session)
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        app.post("/verify")(self.refusing_verify)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        return BaseSeedSessionResponse()

    async def increment_counter(self) -> dict:
        return {"success": True}

    async def get_counter_value(self) -> dict:
        return {"count": 3}

    async def verify(self, *args, **kwargs):  # the abstract method; /verify is refusing_verify
        raise NotImplementedError

    async def refusing_verify(self, request: Request) -> Response:
        case = CASES[(await request.json())["refusal_case"]]
        return Response(content=case["body"].encode(), status_code=case["status"], media_type=case["content_type"])


if __name__ == "__main__":
    RefusingVerifyServer.run_webserver()
