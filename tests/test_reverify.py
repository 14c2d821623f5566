"""``manage.py reverify``: a stored run's successes re-scored against an env without calling the
agent (NeMo Gym's ``gym eval reverify``), its guard for session-state envs, and the new run."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from django.core.management import CommandError, call_command

from gymweb.examples._serve import BackgroundServer
from rollouts.evaluation import reverify
from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem
from tests.run_factories import finish, key, make_run

pytestmark = pytest.mark.django_db


def _fixed_verifier(mode="stateless", fail_task=None):
    """A stateless env: reward 1 when the response's text says "task N" for its own N ("expected"),
    so the old rewards (all 1.0 here) flip to 0 for the tasks whose reply says something else."""
    seen = []

    async def get_mode(request):
        return web.json_response(mode)

    async def verify(request):
        body = await request.json()
        seen.append(body)
        if body.get("expected") == fail_task:
            return web.Response(status=500, text="verifier crashed")
        text = json.dumps(body["response"])
        return web.json_response({**body, "reward": 1.0 if f"answer {body['expected']}" in text else 0.0})

    app = web.Application()
    app.router.add_get("/reverify_mode", get_mode)
    app.router.add_post("/verify", verify)
    return app, seen


def _run_with_answers(answers):
    run = make_run(len(answers))
    for t, answer in enumerate(answers):
        r = finish(key(run, t), Rollout.Status.SUCCEEDED, 1.0)
        verify = json.loads(r.verify_json)
        verify["response"]["output"] = [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
        ]
        r.verify_json = json.dumps(verify)
        r.save()
        AgentCall.objects.create(rollout=r, index=0, started=r.finished, latency_ms=3.0, response_id="resp")
        TrajectoryItem.objects.create(
            rollout=r, seq=0, step=0, kind="message", origin="agent", payload=verify["response"]["output"][0]
        )
    return run


def test_it_rescores_successes_into_a_new_run_linked_to_its_source_and_lists_the_flips():
    source = _run_with_answers(["answer 0", "answer 9", "answer 2"])
    app, seen = _fixed_verifier()
    with BackgroundServer(app) as env:
        result = reverify.reverify_run(source, env.url)
    new = result.run
    assert new.reverified_from == source and new.status == Run.Status.COMPLETED and new.env_url == env.url
    assert [(t, r, before, after) for t, r, before, after in result.flips] == [(1, 0, 1.0, 0.0)]
    assert sorted(Rollout.objects.filter(run=new).values_list("task_index", "reward")) == [(0, 1.0), (1, 0.0), (2, 1.0)]
    # NeMo Gym's payload: the materialised row plus the scored response; no session, no agent
    first = next(body for body in seen if body["expected"] == 0)  # requests run concurrently: any order
    assert first["_ng_rollout_index"] == 0 and "response" in first
    flips = reverify.reward_flips(new)
    assert [(f["task"], f["before"], f["after"]) for f in flips] == [(1, 1.0, 0.0)]
    # the trajectories come along, so the new run's pages show them
    assert (
        TrajectoryItem.objects.filter(rollout__run=new).count() == 3
        and AgentCall.objects.filter(rollout__run=new).count() == 3
    )


def test_a_verify_failure_is_a_failed_rollout_of_the_new_run_not_an_abort():
    source = _run_with_answers(["answer 0", "answer 1"])
    app, _ = _fixed_verifier(fail_task=1)
    with BackgroundServer(app) as env:
        result = reverify.reverify_run(source, env.url)
    failed = Rollout.objects.get(run=result.run, status=Rollout.Status.FAILED)
    assert failed.task_index == 1 and failed.failure_kind == "verify_failed" and "HTTP 500" in failed.error
    assert result.failed == 1 and result.flips == [(1, 0, 1.0, None)]


def test_an_env_whose_reward_depends_on_session_state_is_refused_unless_forced(counter_env_url, capsys):
    source = _run_with_answers(["answer 0"])
    with pytest.raises(CommandError, match="reverify_mode=unknown"):
        call_command("reverify", str(source.pk), "--env-url", counter_env_url)
    assert Run.objects.count() == 1  # nothing stored
    call_command("reverify", str(source.pk), "--env-url", counter_env_url, "--force")
    new = Run.objects.exclude(pk=source.pk).get()
    assert new.name.startswith("unsafe_") and new.reverified_from == source
    assert "may be incorrect" in capsys.readouterr().err


def test_an_unsupported_mode_is_refused_too():
    source = _run_with_answers(["answer 0"])
    app, seen = _fixed_verifier(mode="unsupported")
    with BackgroundServer(app) as env, pytest.raises(reverify.ReverifyRefused):
        reverify.reverify_run(source, env.url)
    assert seen == []


def test_bad_input_is_a_clear_error():
    with pytest.raises(CommandError, match="no run #404"):
        call_command("reverify", "404", "--env-url", "http://127.0.0.1:9")
    source = _run_with_answers(["answer 0"])
    with pytest.raises(CommandError, match="could not reach"):
        call_command("reverify", str(source.pk), "--env-url", "http://127.0.0.1:9")
    empty = make_run(1)
    app, _ = _fixed_verifier()
    with BackgroundServer(app) as env, pytest.raises(CommandError, match="no successful rollouts"):
        call_command("reverify", str(empty.pk), "--env-url", env.url)


def test_a_reward_nemo_gyms_models_read_as_a_number_is_that_float_and_the_reply_is_written_as_it_came():
    source = _run_with_answers(["answer 0", "answer 1", "answer 2", "answer 3"])
    answers = {0: "0.5", 1: True, 2: "abc", 3: None}

    async def get_mode(request):
        return web.json_response("stateless")

    async def verify(request):
        body = await request.json()
        return web.json_response({**body, "reward": answers[body["expected"]]})

    app = web.Application()
    app.router.add_get("/reverify_mode", get_mode)
    app.router.add_post("/verify", verify)
    with BackgroundServer(app) as env:
        result = reverify.reverify_run(source, env.url)
    got = {r.task_index: r for r in Rollout.objects.filter(run=result.run)}
    assert (got[0].reward, got[1].reward) == (0.5, 1.0)
    assert json.loads(got[0].verify_json)["reward"] == "0.5", "written as NeMo Gym's reverify writes it"
    assert {got[2].status, got[3].status} == {Rollout.Status.FAILED} and result.failed == 2
