"""The Environments page, the new-run form filled from a NeMo Gym config / head server, Retry that
follows a moved env, and a run's settings downloaded as a NeMo Gym config."""

from __future__ import annotations

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from rollouts.models import HeadServer, Run
from rollouts.nemo.config import load_texts
from tests.nemo_fakes import DATA, ENV_NAME, FakeHeadServer, fake_nemo_agent_server

from .run_factories import dataset_lines

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def head(counter_env_url, counter_agent_url):
    server = FakeHeadServer(env_url=counter_env_url, agent_base_url=counter_agent_url)
    yield server
    server.stop()


def _config_text(agent_url: str) -> str:
    return (DATA / "counter_remote.yaml").read_text().replace("http://127.0.0.1:9000", agent_url)


def _upload() -> SimpleUploadedFile:
    return SimpleUploadedFile(
        "tasks.jsonl", ("\n".join(dataset_lines(2)) + "\n").encode(), content_type="application/jsonl"
    )


def test_the_environments_page_lists_head_servers_with_health_tools_and_a_prefilled_new_run(
    signed_in, head, counter_env_url
):
    response = signed_in.post(reverse("environments"), {"head_url": head.url})
    assert response.status_code == 302 and HeadServer.objects.filter(url=head.url).exists()
    earlier = Run.objects.create(
        name="earlier", agent_url="http://127.0.0.1:1", env_url=counter_env_url, head_url=head.url, env_name=ENV_NAME
    )
    page = signed_in.get(reverse("environments")).content.decode()
    assert ENV_NAME in page and counter_env_url in page and "healthy" in page
    assert "increment_counter" in page and "get_counter_value" in page
    assert f'href="{reverse("run", args=[earlier.pk])}"' in page  # the runs that used it
    assert f"?head_url={head.url.replace(':', '%3A')}" in page.replace("&amp;", "&")
    form = signed_in.get(reverse("run_new") + f"?head_url={head.url}&env_name={ENV_NAME}").content.decode()
    assert f'value="{head.url}"' in form and f'value="{ENV_NAME}"' in form


def test_a_head_server_that_does_not_answer_is_not_registered(signed_in):
    response = signed_in.post(reverse("environments"), {"head_url": "http://127.0.0.1:9"})
    assert (
        response.status_code == 400
        and "cannot reach the NeMo Gym head server at http://127.0.0.1:9" in response.content.decode()
    )
    assert not HeadServer.objects.exists()


def test_the_form_fills_its_fields_from_a_pasted_config_saying_where_from(
    signed_in, head, counter_agent_url, counter_env_url
):
    response = signed_in.post(
        reverse("run_new"),
        {
            "fill": "1",
            "nemo_config": _config_text(counter_agent_url),
            "head_url": head.url,
            "agent_name": "remote_agent",
            "concurrency": "32",
        },
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert f'value="{counter_agent_url}"' in page and f'value="{counter_env_url}"' in page
    assert 'name="concurrency" value="4"' in page and 'name="max_steps" value="8"' in page
    assert "From the pasted config: remote_agent.responses_api_agents.remote_agent.concurrency" in page
    assert f"From head server {head.url}: {ENV_NAME}" in page


def test_a_run_started_from_a_config_keeps_its_env_by_name(signed_in, head, counter_agent_url, counter_env_url):
    response = signed_in.post(
        reverse("run_new"),
        {
            "dataset_file": _upload(),
            "nemo_config_file": SimpleUploadedFile("counter_remote.yaml", _config_text(counter_agent_url).encode()),
            "head_url": head.url,
            "agent_url": "",
            "env_url": "",
            "agent_name": "remote_agent",
            "concurrency": "4",
            "num_repeats": "1",
            "max_attempts": "3",
            "remote_responses_timeout_s": "60",
            "run_timeout_s": "120",
        },
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    run = Run.objects.get()
    assert (run.agent_url, run.env_url, run.head_url, run.env_name) == (
        counter_agent_url,
        counter_env_url,
        head.url,
        ENV_NAME,
    )


def test_the_form_refuses_nemo_gyms_own_agent_server(signed_in, counter_env_url, counter_agent_url):
    nemo_agent = fake_nemo_agent_server()
    head = FakeHeadServer(env_url=counter_env_url, agent_base_url=counter_agent_url, agent_server_url=nemo_agent.url)
    try:
        response = signed_in.post(
            reverse("run_new"),
            {
                "dataset_file": _upload(),
                "agent_url": nemo_agent.url,
                "env_url": counter_env_url,
                "head_url": head.url,
                "agent_name": "remote_agent",
                "concurrency": "4",
                "num_repeats": "1",
                "max_attempts": "3",
                "remote_responses_timeout_s": "60",
                "run_timeout_s": "120",
            },
        )
        page = response.content.decode()
        assert response.status_code == 400 and not Run.objects.exists()
        assert "is NeMo Gym&#x27;s own agent server" in page and f"instead: {counter_agent_url}" in page
    finally:
        head.stop()
        nemo_agent.stop()


def test_retry_resolves_the_env_again_through_the_head_server(signed_in, counter_agent_url, counter_env_url):
    head = FakeHeadServer(env_url="http://127.0.0.1:9", agent_base_url=counter_agent_url)
    try:
        run = Run.objects.create(
            name="r",
            status=Run.Status.COMPLETED,
            agent_url=counter_agent_url,
            env_url="http://127.0.0.1:9",
            head_url=head.url,
            env_name=ENV_NAME,
        )
        head.env_url = counter_env_url
        signed_in.post(reverse("run_retry", args=[run.pk]))
        run.refresh_from_db()
        assert run.env_url == counter_env_url
        head.stop()
        response = signed_in.post(reverse("run_retry", args=[run.pk]), follow=True)
        assert f"Not retried: cannot reach the NeMo Gym head server at {head.url}" in response.content.decode()
    finally:
        head.stop()


def test_a_runs_settings_download_as_a_nemo_gym_config(signed_in, head, counter_agent_url, counter_env_url):
    run = Run.objects.create(
        name="r",
        agent_url=counter_agent_url,
        env_url=counter_env_url,
        head_url=head.url,
        env_name=ENV_NAME,
        concurrency=6,
        max_steps=9,
        run_timeout_s=300,
    )
    response = signed_in.get(reverse("run_nemo_config", args=[run.pk]))
    assert response.status_code == 200 and 'filename="run_' in response["Content-Disposition"]
    text = response.content.decode()
    assert "gym eval run --no-serve +agent_name=remote_agent" in text
    data = yaml.safe_load(text)
    assert data[ENV_NAME]["resources_servers"] == {
        "example_session_state_mgmt": {"entrypoint": "app.py", "domain": "agent"}
    }
    agent = load_texts([("out", text)]).agent()
    assert (agent.agent_base_url, agent.resources_server, agent.concurrency, agent.max_steps, agent.run_timeout_s) == (
        counter_agent_url,
        ENV_NAME,
        6,
        9,
        300.0,
    )


def test_the_api_retry_resolves_the_env_again(client, user, counter_agent_url, counter_env_url):
    from rollouts.tokens import create_token

    token = create_token(user, "tests")[1]
    head = FakeHeadServer(env_url=counter_env_url, agent_base_url=counter_agent_url)
    try:
        run = Run.objects.create(
            name="r",
            status=Run.Status.COMPLETED,
            agent_url=counter_agent_url,
            env_url="http://127.0.0.1:9",
            head_url=head.url,
            env_name=ENV_NAME,
        )
        response = client.post(f"/api/v1/runs/{run.pk}/retry", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 200
        run.refresh_from_db()
        assert run.env_url == counter_env_url
        head.stop()
        response = client.post(f"/api/v1/runs/{run.pk}/retry", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 400 and "cannot reach the NeMo Gym head server" in response.content.decode()
    finally:
        head.stop()


def test_the_form_lists_the_default_head_servers_environments_and_agents(
    signed_in, settings, head, counter_env_url, counter_agent_url
):
    settings.GYMWEB_NEMO_GYM_HEAD_URL = head.url
    page = signed_in.get(reverse("run_new")).content.decode()
    assert f'value="{head.url}"' in page
    assert ENV_NAME in page and counter_env_url in page and "healthy" in page
    assert counter_agent_url in page  # the agent's agent_base_url
