"""Sessions and forms: a signed-out HTMX request is sent to sign in and back to the page
in the address bar (never a sign-in page pasted into the page); a signed-out POST action comes back
to its page, not to ``GET /runs/N/retry/``; a stale CSRF token gets a friendly page with a link
back."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.urls import URLPattern, get_resolver, reverse

from rollouts.models import Rollout, Run

from .run_factories import finish, key, make_run

HOST = "http://testserver"


def _next_of(url: str) -> str:
    parts = urlsplit(url)
    assert parts.path == reverse("login"), url
    return parse_qs(parts.query)["next"][0]


@pytest.fixture
def run(db):
    run = make_run(3, status=Run.Status.RUNNING)
    finish(key(run, 0), Rollout.Status.SUCCEEDED, 1.0)
    finish(key(run, 1), Rollout.Status.FAILED)
    return run


def _htmx(client: Client, url: str, page: str):
    return client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL=HOST + page)


def test_a_signed_out_poll_of_the_run_page_redirects_the_window_to_sign_in_and_back(client, run):
    page = reverse("run", args=[run.pk])
    response = _htmx(client, reverse("run_live", args=[run.pk]) + "?seen=abc", page)
    # HTMX swaps nothing and navigates: no sign-in page pasted into the live area.
    assert response.status_code == 200 and response.content == b""
    assert _next_of(response["HX-Redirect"]) == page


def test_a_signed_out_runs_list_refresh_redirects_to_sign_in_and_back_to_its_page(client, run):
    page = reverse("runs") + "?page=2"
    response = _htmx(client, reverse("runs") + "?page=2", page)
    assert _next_of(response["HX-Redirect"]) == page


def test_the_filtered_page_in_the_address_bar_is_where_sign_in_returns(client, run):
    page = reverse("run", args=[run.pk]) + "?status=failed&sort=-reward"
    response = _htmx(client, reverse("run", args=[run.pk]) + "?status=failed&sort=-reward&page=1", page)
    assert _next_of(response["HX-Redirect"]) == page


def _get_routes() -> list[URLPattern]:
    """Every route of the dashboard (rollouts.web.urls)."""
    resolver = get_resolver()
    out = []
    for entry in resolver.url_patterns:
        for pattern in getattr(entry, "url_patterns", []):
            if isinstance(pattern, URLPattern) and pattern.callback.__module__.startswith("rollouts.web"):
                out.append(pattern)
    return out


def test_every_dashboard_route_answers_a_signed_out_htmx_request_with_hx_redirect(client, run):
    rollout = key(run, 0)
    kwargs_for = {
        "run_id": run.pk,
        "rollout_id": rollout.pk,
        "kind": "rollouts",
        "fmt": "md",
        "key": "verify",
        "dataset_id": run.dataset_id or 1,
        "note_id": 1,
        "label_id": 1,
        "token_id": 1,
        "task_id": 1,
        "queue_id": 1,
    }
    page = reverse("run", args=[run.pk]) + "?task=1"
    routes = _get_routes()
    assert len(routes) >= 15
    for pattern in routes:
        names = list(pattern.pattern.regex.groupindex)
        url = reverse(pattern.name, kwargs={n: kwargs_for[n] for n in names})
        if pattern.name == "run_profile_file":
            url = reverse(pattern.name, kwargs={"run_id": run.pk, "kind": "reward_profiling"})
        response = _htmx(client, url, page)
        assert response.status_code == 200, (pattern.name, response.status_code)
        assert "HX-Redirect" in response, pattern.name
        assert _next_of(response["HX-Redirect"]) == page, pattern.name
        assert b"Sign in" not in response.content


def test_a_plain_signed_out_page_request_still_redirects_with_itself_as_next(client, run):
    page = reverse("run", args=[run.pk]) + "?status=failed"
    response = client.get(page)
    assert response.status_code == 302 and _next_of(response["Location"]) == page


def test_a_signed_out_htmx_request_from_another_site_is_not_sent_there(client, run):
    response = client.get(
        reverse("run_live", args=[run.pk]), HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="https://evil.example/phish"
    )
    assert _next_of(response["HX-Redirect"]) == reverse("run", args=[run.pk])


# -- a POST action without a session ---------------------------------------------------------------
@pytest.mark.parametrize("action", ["run_retry", "run_cancel"])
def test_signing_in_from_a_post_action_returns_to_the_page_not_the_action(client, user, run, action):
    page = reverse("run", args=[run.pk])
    response = client.post(reverse(action, args=[run.pk]), HTTP_REFERER=HOST + page)
    assert response.status_code == 302
    assert _next_of(response["Location"]) == page
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING  # nothing was done

    # Without a Referer (privacy settings), the run's page all the same.
    bare = client.post(reverse(action, args=[run.pk]))
    assert _next_of(bare["Location"]) == page

    # Signing in through that link lands on the page (200), not on GET /runs/N/retry/ (405).
    signed = client.post(response["Location"], {"username": "alice", "password": "correct horse battery", "next": page})
    assert signed.status_code == 302 and signed["Location"] == page
    assert client.get(signed["Location"]).status_code == 200


# -- a stale CSRF token ----------------------------------------------------------------------------
def _csrf_client(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@pytest.mark.parametrize("action", ["run_retry", "run_cancel"])
def test_a_stale_csrf_token_on_retry_or_cancel_gets_a_friendly_page_with_a_link_back(user, run, action):
    client = _csrf_client(user)
    page = reverse("run", args=[run.pk])
    assert client.get(page).status_code == 200  # the page sets the CSRF cookie
    response = client.post(reverse(action, args=[run.pk]), {"csrfmiddlewaretoken": "x" * 64}, HTTP_REFERER=HOST + page)
    assert response.status_code == 403
    body = response.content.decode()
    assert "This form had expired" in body and "Nothing was done" in body
    assert f'href="{page}" id="csrf-back"' in body
    assert "DEBUG" not in body
    assert '<link rel="stylesheet"' in body  # the site's own page, not Django's bare one
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_a_stale_csrf_token_without_a_session_links_to_sign_in_then_back(client, run):
    csrf = Client(enforce_csrf_checks=True)
    page = reverse("run", args=[run.pk])
    response = csrf.post(reverse("run_cancel", args=[run.pk]), HTTP_REFERER=HOST + page)
    assert response.status_code == 403
    link = re.search(r'href="([^"]+)" id="csrf-sign-in"', response.content.decode()).group(1)
    assert _next_of(link.replace("&amp;", "&")) == page


def test_a_good_csrf_token_still_works(user, run):
    client = _csrf_client(user)
    page = client.get(reverse("run", args=[run.pk])).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(reverse("run_cancel", args=[run.pk]), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
