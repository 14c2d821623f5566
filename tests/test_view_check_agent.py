"""The agent conformance check page: a form, then every finding (severity, code, title, what was
sent, what came back, how to fix it) and every probe."""

from __future__ import annotations

import re

import pytest
from aiohttp import web
from django.urls import reverse

from gymweb.examples._serve import BackgroundServer
from tests.bad_agents import make_bad_agent, serve
from tests.servers import free_url

from .test_xss import EVIL, assert_inert

URL = reverse("check_agent")


def check(client, agent_url: str, timeout_s: float = 10):
    return client.post(URL, {"agent_url": agent_url, "timeout_s": str(timeout_s)})


def findings(html: str) -> list[tuple[str, str]]:
    """(severity, code) of each finding shown."""
    return re.findall(
        r'<article class="card finding sev-(\w+)".*?<code class="finding-code">([^<]+)</code>', html, re.S
    )


# -- access and form ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_it_requires_login(client):
    for response in (client.get(URL), client.post(URL, {"agent_url": "http://127.0.0.1:1", "timeout_s": "1"})):
        assert response.status_code == 302 and reverse("login") in response["Location"]


def test_the_form_is_linked_from_the_nav_and_the_new_run_form(signed_in):
    html = signed_in.get(reverse("runs")).content.decode()
    assert f'<a href="{URL}">Check agent</a>' in html
    assert f'href="{URL}">Check the agent first</a>' in signed_in.get(reverse("run_new")).content.decode()
    page = signed_in.get(URL)
    assert page.status_code == 200
    assert 'name="agent_url"' in page.content.decode() and 'name="timeout_s"' in page.content.decode()
    assert "no-store" in page["Cache-Control"]


def test_a_link_can_prefill_the_url_but_never_one_with_credentials(signed_in):
    assert 'value="http://127.0.0.1:9102"' in signed_in.get(URL + "?agent_url=http://127.0.0.1:9102").content.decode()
    html = signed_in.get(URL + "?agent_url=http://bob:hunter2@agent.example").content.decode()
    assert "hunter2" not in html and "bob" not in html


# -- results -------------------------------------------------------------------------------------
def test_the_example_counter_agent_passes(signed_in, counter_agent_url):
    response = check(signed_in, counter_agent_url)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="check-verdict">PASS<' in html and "No breach of the contract found." in html
    assert findings(html) == []
    assert f"<code>{counter_agent_url}/v1/responses</code>" in html
    probes = re.findall(r'<th scope="row" class="mono">(\w+)</th>', html)
    assert probes == ["counter_task", "follow_up", "string_input", "no_tools"]
    assert html.count('<span class="ok">HTTP 200</span>') == 4


def test_a_bad_agent_shows_every_finding_with_what_was_sent_what_came_back_and_how_to_fix_it(signed_in):
    with serve("undeclared_tool") as agent:
        html = check(signed_in, agent.url).content.decode()
    assert 'id="check-verdict">FAIL<' in html
    shown = findings(html)
    assert shown and {code for _, code in shown} == {"undeclared_tool"} and {sev for sev, _ in shown} == {"error"}
    first = re.search(r'<article class="card finding sev-error".*?</article>', html, re.S).group(0)
    assert "delete_everything" in first  # the title names the tool
    assert "How to fix:" in first and "Ask only for tools the request" in first
    assert "see docs/DESIGN.md, contract rule 5" in first and "seed" not in first  # no reference users cannot find
    sent = re.search(r'<pre class="sent">(.*?)</pre>', first, re.S).group(1)
    assert "&quot;tools&quot;" in sent and "\n" in sent  # the request body, pretty-printed
    received = re.search(r'<pre class="received">(.*?)</pre>', first, re.S).group(1)
    assert received.startswith("HTTP 200: ") and "delete_everything" in received


def test_an_http_error_and_a_redirect_are_reported(signed_in):
    with serve("server_error") as agent:
        html = check(signed_in, agent.url).content.decode()
    assert ("error", "http_error") in findings(html) and "KeyError" in html
    with serve("redirect") as agent:
        html = check(signed_in, agent.url).content.decode()
    assert ("error", "redirect") in findings(html) and "127.0.0.1:1/elsewhere/v1/responses" in html


def test_warnings_alone_pass(signed_in):
    with serve("no_usage") as agent:
        html = check(signed_in, agent.url).content.decode()
    assert 'id="check-verdict">PASS<' in html and findings(html) == [("warning", "no_usage")]


def test_an_unreachable_agent_is_one_finding_naming_the_url(signed_in):
    url = free_url()
    html = check(signed_in, url, timeout_s=5).content.decode()
    assert findings(html) == [("error", "unreachable")]
    assert f"is your service running at {url}?" in html


# -- validation ----------------------------------------------------------------------------------
def test_a_url_with_credentials_is_a_field_error_that_never_echoes_the_password(signed_in):
    response = check(signed_in, "http://alice:s3cret-pw@127.0.0.1:9102")
    assert response.status_code == 400
    html = response.content.decode()
    assert "s3cret-pw" not in html and "alice:" not in html
    assert re.search(r'<ul class="errorlist" id="id_agent_url_errors"><li>[^<]*credentials', html)
    assert 'name="agent_url" value=' not in html or 'name="agent_url" value=""' in html
    assert "check-verdict" not in html


@pytest.mark.parametrize("bad", ["ftp://127.0.0.1:9102", "http://127.0.0.1:9102/?x=1", "not a url", ""])
def test_other_bad_urls_are_field_errors(signed_in, bad):
    response = check(signed_in, bad)
    assert response.status_code == 400 and 'id="id_agent_url_errors"' in response.content.decode()


def test_the_allowed_target_hosts_setting_is_respected(signed_in, settings):
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["agent.internal"]
    response = check(signed_in, "http://127.0.0.1:9102")
    assert response.status_code == 400
    assert (
        "is not allowed here (127.0.0.1:9102 is not in GYMWEB_ALLOWED_TARGET_HOSTS (agent.internal); "
        "only listed targets are allowed)"
    ) in response.content.decode()


def test_the_check_form_and_the_run_form_share_one_standalone_url_helper(settings):
    from django import forms

    from rollouts.web import forms as run_forms
    from rollouts.web.check_views import CheckAgentForm

    # no borrowed methods: a plain function any form can call from its clean_<field>
    assert not hasattr(run_forms.RunForm, "_clean_base_url") and "_clean_base_url" not in vars(CheckAgentForm)

    class TargetForm(forms.Form):
        url = forms.CharField()

        def clean_url(self):
            return run_forms.clean_target_url(self, "url", "target URL")

    good = TargetForm({"url": "http://127.0.0.1:9102/"})
    assert good.is_valid() and good.cleaned_data["url"] == "http://127.0.0.1:9102"
    secret = TargetForm({"url": "http://bob:hunter2@127.0.0.1:9102"})
    assert not secret.is_valid() and "credentials" in secret.errors["url"][0]
    assert secret.data["url"] == "" and "hunter2" not in str(secret)
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["agent.internal"]
    elsewhere = TargetForm({"url": "http://127.0.0.1:9102"})
    assert not elsewhere.is_valid()
    assert elsewhere.errors["url"] == [
        "target URL: host '127.0.0.1' is not allowed here "
        "(127.0.0.1:9102 is not in GYMWEB_ALLOWED_TARGET_HOSTS (agent.internal); only listed targets are allowed)."
    ]


@pytest.mark.parametrize("timeout", ["0", "61", "soon"])
def test_the_timeout_is_bounded(signed_in, timeout):
    response = signed_in.post(URL, {"agent_url": "http://127.0.0.1:9102", "timeout_s": timeout})
    assert response.status_code == 400 and 'id="id_timeout_s_errors"' in response.content.decode()


# -- untrusted text ------------------------------------------------------------------------------
def test_whatever_an_agent_answers_the_page_stays_inert(signed_in):
    def evil_tool(reply, params, n):
        reply["output"] = [
            {"type": "function_call", "call_id": EVIL, "name": EVIL, "arguments": EVIL},
            {
                "type": "message",
                "role": "assistant",
                "id": "m",
                "content": [{"type": "output_text", "text": EVIL, "annotations": []}],
            },
        ]
        return reply

    def evil_body(reply, params, n):
        return web.Response(status=500, text=EVIL, content_type="text/html", headers={"X-Evil": "1"})

    def evil_redirect(reply, params, n):
        return web.Response(status=302, headers={"Location": f"http://127.0.0.1:1/{EVIL}"})

    for twist in (evil_tool, evil_body, evil_redirect):
        with BackgroundServer(make_bad_agent(twist)) as agent:
            response = check(signed_in, agent.url)
        html = response.content.decode()
        assert findings(html), twist.__name__
        assert_inert(html)
        assert "&lt;script&gt;" in html


@pytest.mark.django_db
def test_an_agent_url_ending_in_v1_responses_gets_the_same_hint(signed_in):
    response = check(signed_in, "http://127.0.0.1:9102/v1/responses")
    assert response.status_code == 400
    assert "gymweb appends /v1/responses itself" in response.content.decode()


@pytest.mark.django_db
def test_the_form_is_pre_filled_with_the_instances_default_agent(signed_in, settings):
    settings.GYMWEB_DEFAULT_AGENT_URL = "http://127.0.0.1:9102"
    assert 'value="http://127.0.0.1:9102"' in signed_in.get(URL).content.decode()
