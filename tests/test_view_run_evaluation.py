"""The run page's evaluation section (health verdicts and filters, reverify, ATIF download) and the
health findings on the rollout page's steps."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import timedelta

import pytest
from aiohttp import web
from django.urls import reverse
from django.utils import timezone

from gymweb.examples._serve import BackgroundServer
from rollouts.evaluation import health
from rollouts.models import AgentCall, Rollout, RolloutHealth, Run, TrajectoryItem
from tests.run_factories import finish, key, make_run

pytestmark = pytest.mark.django_db

USAGE = {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6}
MSG = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "3"}]}


def _checked_run():
    """Task 0 healthy; task 1 has a hollow second step; task 2 failed on an HTTP 500."""
    run = make_run(3)
    start = timezone.now() - timedelta(seconds=10)
    for t in (0, 1):
        r = finish(key(run, t), Rollout.Status.SUCCEEDED, 1.0)
        verify = json.loads(r.verify_json)
        verify["response"]["usage"] = {"input_tokens": 4 * (t + 1), "output_tokens": 2 * (t + 1)}  # the calls' sums
        r.verify_json = json.dumps(verify)
        r.save()
        for i, items in enumerate([[MSG]] if t == 0 else [[MSG], []]):
            AgentCall.objects.create(
                rollout=r,
                index=i,
                started=start + timedelta(seconds=i),
                latency_ms=2.0,
                http_status=200,
                response_id=f"r{t}{i}",
                usage=USAGE,
            )
            for item in items:
                TrajectoryItem.objects.create(rollout=r, seq=i, step=i, kind="message", origin="agent", payload=item)
    bad = finish(key(run, 2), Rollout.Status.FAILED, kind="agent_http_error")
    AgentCall.objects.create(rollout=bad, index=0, started=start, latency_ms=2.0, http_status=500, error="HTTP 500")
    health.run_health_check(run)
    return run


def test_the_section_shows_verdict_counts_findings_and_links_that_filter(signed_in):
    run = _checked_run()
    page = signed_in.get(reverse("run_evaluation", args=[run.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert "1 healthy" in page and "2 unhealthy" in page and "0 unobserved" in page
    assert "agent_turn_hollow" in page and "rollout_ended_on_failed_model_call" in page
    assert "?verdict=unhealthy#rollouts" in page and "?check=agent_turn_hollow#rollouts" in page
    assert "<html" not in page  # a partial


def test_the_rollout_table_filters_by_verdict_and_by_check(signed_in):
    run = _checked_run()
    url = reverse("run", args=[run.pk])
    unhealthy = signed_in.get(url, {"verdict": "unhealthy"}).content.decode()
    assert ">1:0<" in unhealthy and ">2:0<" in unhealthy and ">0:0<" not in unhealthy
    hollow = signed_in.get(url, {"check": "agent_turn_hollow"}).content.decode()
    assert ">1:0<" in hollow and ">2:0<" not in hollow and ">0:0<" not in hollow
    # "model_call_failed" must not match "rollout_ended_on_failed_model_call" by accident, nor "_" act as a wildcard
    failed = signed_in.get(url, {"check": "model_call_failed"}).content.decode()
    assert ">2:0<" in failed and ">1:0<" not in failed


def test_the_rollout_page_shows_each_finding_on_its_step(signed_in):
    run = _checked_run()
    r = key(run, 1)
    page = signed_in.get(reverse("rollout", args=[run.pk, r.pk])).content.decode()
    assert "verdict-unhealthy" in page
    step2 = page[page.index('id="step-1"') :]
    assert "agent_turn_hollow" in step2[: step2.index("</div>\n") + 2000]
    step1 = page[page.index('id="step-0"') : page.index('id="step-1"')]
    assert "agent_turn_hollow" not in step1


def test_the_health_files_download_as_nemo_gym_writes_them(signed_in):
    run = _checked_run()
    summary = signed_in.get(reverse("run_health_file", args=[run.pk, "quality_summary"]))
    assert json.loads(b"".join(summary)) == run.health_summary
    verdicts = [
        json.loads(line)
        for line in b"".join(signed_in.get(reverse("run_health_file", args=[run.pk, "rollout_verdicts"]))).splitlines()
    ]
    assert [(v["_ng_task_index"], v["verdict"]) for v in verdicts] == [
        (0, "healthy"),
        (1, "unhealthy"),
        (2, "unhealthy"),
    ]
    assert set(verdicts[0]) == {
        "_ng_task_index",
        "_ng_rollout_index",
        "rollout_id",
        "verdict",
        "findings",
        "unobserved",
    }


def test_check_again_button_runs_the_check(signed_in):
    run = make_run(1)
    finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    response = signed_in.post(reverse("run_health_check", args=[run.pk]))
    assert response.status_code == 302
    assert RolloutHealth.objects.filter(run=run).count() == 1


def _stateless_env():
    async def mode(request):
        return web.json_response("stateless")

    async def verify(request):
        body = await request.json()
        return web.json_response({**body, "reward": 0.0 if body["expected"] == 1 else 1.0})

    app = web.Application()
    app.router.add_get("/reverify_mode", mode)
    app.router.add_post("/verify", verify)
    return app


def test_the_reverify_button_makes_a_linked_run_that_shows_its_flips(signed_in):
    run = make_run(2)
    for t in (0, 1):
        finish(key(run, t), Rollout.Status.SUCCEEDED, 1.0)
    with BackgroundServer(_stateless_env()) as env:
        response = signed_in.post(reverse("run_reverify", args=[run.pk]), {"env_url": env.url})
    new = Run.objects.get(reverified_from=run)
    assert response.status_code == 302 and response["Location"].startswith(reverse("run", args=[new.pk]))
    section = signed_in.get(reverse("run_evaluation", args=[new.pk])).content.decode()
    assert (
        "reward-flips" in section
        and ">1:0<" in section
        and "1 reward changed" in section.replace("\n", " ").replace("</strong>", "").replace("<strong>", "")
    )
    source_section = signed_in.get(reverse("run_evaluation", args=[run.pk])).content.decode()
    assert f"#{new.pk}" in source_section


def test_reverify_refused_by_a_session_state_env_says_why(signed_in, counter_env_url):
    run = make_run(1)
    finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    response = signed_in.post(reverse("run_reverify", args=[run.pk]), {"env_url": counter_env_url})
    assert response.status_code == 400
    assert "reverify_mode=unknown" in response.content.decode()
    assert Run.objects.count() == 1


def test_the_atif_download_is_a_zip_of_nemo_gyms_layout(signed_in):
    run = _checked_run()
    response = signed_in.get(reverse("run_atif", args=[run.pk]))
    assert response["Content-Type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    names = sorted(archive.namelist())
    assert names == [
        f"gymweb-run-{run.pk}/0-0.json",
        f"gymweb-run-{run.pk}/1-0.json",
        f"gymweb-run-{run.pk}/manifest.jsonl",
    ]
    with_failures = zipfile.ZipFile(
        io.BytesIO(b"".join(signed_in.get(reverse("run_atif", args=[run.pk]), {"failures": "1"}).streaming_content))
    )
    assert f"gymweb-run-{run.pk}/2-0.json" in with_failures.namelist()


def test_model_text_in_findings_and_errors_is_escaped(signed_in):
    run = make_run(1)
    r = finish(key(run, 0), Rollout.Status.FAILED, kind="agent_http_error")
    AgentCall.objects.create(
        rollout=r,
        index=0,
        started=timezone.now(),
        latency_ms=1.0,
        http_status=500,
        response_id="<script>alert(1)</script>",
        error="x",
    )
    health.run_health_check(run)
    page = signed_in.get(reverse("rollout", args=[run.pk, r.pk])).content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
