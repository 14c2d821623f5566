"""The runs list: newest first, progress by key, mean reward, failures; paginated; a fixed number of
queries however many runs and rollouts."""

from __future__ import annotations

import re

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run, new_attempt

S = Rollout.Status
URL = reverse("runs")


def _row(body: str, run: Run) -> str:
    """The table row of ``run``."""
    anchor = f'href="{reverse("run", args=[run.pk])}"'
    start = body.index(anchor)
    return body[body.rindex("<tr", 0, start) : body.index("</tr>", start)]


def test_it_requires_login(client, db):
    response = client.get(URL)
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_an_empty_list_points_to_a_new_run(signed_in):
    body = signed_in.get(URL).content.decode()
    assert "No runs yet" in body and reverse("run_new") in body


def test_it_lists_runs_newest_first_with_progress_reward_and_failures(signed_in):
    older = make_run(4, name="older run", agent_url="http://agent.example:9000", env_url="http://env.example:9001")
    finish(key(older, 0), S.SUCCEEDED, 1.0)
    finish(key(older, 1), S.SUCCEEDED, 0.5)
    finish(key(older, 2), S.FAILED, kind="agent_timeout")
    finish(new_attempt(older, 2), S.FAILED, kind="agent_timeout")  # one failed key, two attempts
    finish(key(older, 3), S.CANCELLED)  # not done
    newer = make_run(2, name="newer run", status=Run.Status.RUNNING)
    Rollout.objects.filter(pk=key(newer, 0).pk).update(status=S.RUNNING)

    body = signed_in.get(URL).content.decode()
    assert body.index("newer run") < body.index("older run")
    row = _row(body, older)
    assert "3/4" in row  # done = latest attempt succeeded or failed
    assert "0.7500" in row  # mean over successes
    assert re.search(r'<span class="bad">1</span>', row)  # one failed key
    assert "http://agent.example:9000" in row and "http://env.example:9001" in row
    assert "completed" in row
    row = _row(body, newer)
    assert "0/2" in row and "1 in flight" in row and "running" in row and "—" in row


def test_it_is_paginated(signed_in):
    runs = [make_run(1, name=f"run {i:02d}") for i in range(30)]
    first = signed_in.get(URL).content.decode()
    assert "run 29" in first and "run 05" in first and "run 04" not in first
    assert "page 1 of 2" in first and "?page=2" in first
    second = signed_in.get(URL + "?page=2").content.decode()
    assert "run 04" in second and "run 00" in second and "run 05" not in second
    assert len(runs) == 30


def test_it_polls_while_a_run_is_active_and_returns_the_table_alone_to_htmx(signed_in):
    run = make_run(1, status=Run.Status.RUNNING)
    full = signed_in.get(URL)
    assert 'hx-trigger="every 5s"' in full.content.decode() and "HX-Request" in full["Vary"]
    partial = signed_in.get(URL, HTTP_HX_REQUEST="true")
    body = partial.content.decode()
    assert body.lstrip().startswith('<div id="run-list"') and "<html" not in body
    assert "HX-Request" in partial["Vary"]
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    assert "every 5s" not in signed_in.get(URL, HTTP_HX_REQUEST="true").content.decode()
    restore = signed_in.get(URL, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in restore.content.decode()


def test_names_and_urls_are_escaped(signed_in):
    make_run(1, name="<script>alert(1)</script>", agent_url='http://a.example/"><img src=x>')
    body = signed_in.get(URL).content.decode()
    assert "<script>alert(1)" not in body and "<img src=x>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_the_query_count_does_not_grow_with_runs_or_rollouts(signed_in):
    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert signed_in.get(URL).status_code == 200
        return len(ctx.captured_queries)

    run = make_run(2)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    few = queries()
    for i in range(12):
        run = make_run(20, name=f"r{i}")
        for r in Rollout.objects.filter(run=run, task_index__lt=10):
            finish(r, S.SUCCEEDED, 1.0)
    assert queries() == few


def test_an_imported_run_shows_its_agent_name_and_imported_instead_of_a_dash(signed_in):
    run = Run.objects.create(name="from a file", status=Run.Status.IMPORTED, agent_name="my_agent")
    row = _row(signed_in.get(URL).content.decode(), run)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    agent, env = cells[5], cells[6]
    assert "my_agent" in agent and "imported (no agent URL)" in agent and "—" not in agent
    assert "imported (no env URL)" in env and "—" not in env


# -- every page ------------------------------------------------------------------------------------
def test_a_signed_in_user_who_opens_the_sign_in_page_goes_to_the_runs_list(signed_in):
    response = signed_in.get(reverse("login"))
    assert response.status_code == 302 and response["Location"] == URL
    response = signed_in.get(reverse("login") + "?next=/runs/new/")
    assert response.status_code == 302 and response["Location"] == "/runs/new/"
    response = signed_in.get(reverse("login") + "?next=https://evil.example/")
    assert response.status_code == 302 and response["Location"] == URL


def test_the_sign_in_page_is_still_shown_to_a_visitor(client, db):
    response = client.get(reverse("login"))
    assert response.status_code == 200 and 'name="username"' in response.content.decode()


def test_every_page_links_a_favicon_and_favicon_ico_is_no_404(signed_in, manifest_static):
    from django.contrib.staticfiles import finders
    from django.templatetags.static import static
    from django.test import Client

    visitor = Client()
    icon = static("gymweb/favicon.svg")  # collectstatic's hashed name (cached forever by browsers)
    assert re.fullmatch(r"/static/gymweb/favicon\.[0-9a-f]{12}\.svg", icon)
    for page in (signed_in.get(URL), visitor.get(reverse("login"))):
        assert f'<link rel="icon" href="{icon}" type="image/svg+xml">' in page.content.decode()
    path = finders.find("gymweb/favicon.svg")
    assert path and open(path).read().lstrip().startswith("<svg")
    for who in (visitor, signed_in):
        response = who.get("/favicon.ico")
        assert response.status_code in (301, 302) and response["Location"] == icon
    served = visitor.get(icon)  # WhiteNoise serves it, no view needed
    assert served.status_code == 200 and b"".join(served.streaming_content).lstrip().startswith(b"<svg")
