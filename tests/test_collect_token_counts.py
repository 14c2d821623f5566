"""Token counts NeMo Gym accepts but a 64-bit metric cannot honestly hold (negative ones): the reply
is valid, the rollout succeeds, its calls keep the usage as sent, and its token metrics are empty
with a warning. Collected for real against an agent on 127.0.0.1."""

from __future__ import annotations

import pytest
from aiohttp import web
from django.core.management import call_command

from gymweb.examples._serve import BackgroundServer
from rollouts.models import AgentCall, Rollout

pytestmark = pytest.mark.django_db(transaction=True)

USAGE = {
    "input_tokens": -5,
    "output_tokens": 2,
    "total_tokens": -3,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


@pytest.fixture
def negative_usage_agent():
    async def responses(request):
        await request.read()
        return web.json_response(
            {
                "id": "r",
                "created_at": 1.0,
                "model": "m",
                "object": "response",
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": USAGE,
                "output": [
                    {
                        "id": "m",
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": "done", "annotations": []}],
                    }
                ],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    server = BackgroundServer(app).start()
    yield server.url
    server.stop()


def test_negative_token_counts_are_accepted_and_leave_the_metrics_empty(
    tmp_path, negative_usage_agent, counter_env_url, counter_tasks_path
):
    call_command(
        "collect",
        "--agent-url",
        negative_usage_agent,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(tmp_path / "r.jsonl"),
        "--no-progress",
        "--limit",
        "1",
        "--no-health-check",
    )
    rollout = Rollout.objects.get()
    assert rollout.status == "succeeded", rollout.error
    assert rollout.usage_reported is False and rollout.input_tokens is None
    assert any("negative or do not fit in 64 bits" in w for w in rollout.warnings)
    assert AgentCall.objects.get(rollout=rollout).usage == USAGE
