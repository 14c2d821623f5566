"""API tokens: made and revoked on the user's page; every API action answers 401 and nothing else
without a token or with a wrong one; the OpenAPI schema is served by the app."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from rollouts.models import ApiToken
from rollouts.tokens import create_token, digest

from .run_factories import finish, key, make_run

API = "/api/v1"


@pytest.fixture
def run(db):
    run = make_run(2)
    finish(key(run, 0), "succeeded", 1.0)
    return run


def every_action(run):
    r = key(run, 0).pk
    return [
        ("get", f"{API}/datasets"),
        ("post", f"{API}/datasets"),
        ("get", f"{API}/datasets/1"),
        ("get", f"{API}/runs"),
        ("post", f"{API}/runs"),
        ("get", f"{API}/runs/{run.pk}"),
        ("post", f"{API}/runs/{run.pk}/cancel"),
        ("post", f"{API}/runs/{run.pk}/retry"),
        ("get", f"{API}/runs/{run.pk}/rollouts.jsonl"),
        ("get", f"{API}/runs/{run.pk}/rollouts_failures.jsonl"),
        ("get", f"{API}/runs/{run.pk}/rollouts_materialized_inputs.jsonl"),
        ("get", f"{API}/runs/{run.pk}/sft.jsonl"),
        ("get", f"{API}/runs/{run.pk}/rollouts"),
        ("post", f"{API}/runs/{run.pk}/selection/dataset"),
        ("get", f"{API}/rollouts/{r}"),
        ("post", f"{API}/rollouts/{r}/labels"),
        ("delete", f"{API}/rollouts/{r}/labels/good"),
        ("post", f"{API}/rollouts/{r}/notes"),
        ("post", f"{API}/rollouts/{r}/correction"),
        ("delete", f"{API}/rollouts/{r}/correction"),
        ("get", f"{API}/labels"),
        ("post", f"{API}/labels"),
    ]


@pytest.mark.parametrize("header", [None, "Bearer gw_wrong", "Bearer ", "Token gw_x", "gw_x", "Basic YWxpY2U6eA=="])
def test_no_token_or_a_wrong_one_gets_401_and_nothing_else(client, user, run, header):
    create_token(user, "real")
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    for method, url in every_action(run):
        response = getattr(client, method)(url, **extra)
        assert response.status_code == 401, (method, url, response.status_code)
        assert response.json() == {"detail": "Unauthorized"}, (method, url)


def test_a_signed_in_browser_session_is_not_an_api_token(signed_in, run):
    assert signed_in.get(f"{API}/runs/{run.pk}").status_code == 401


def test_a_valid_token_is_let_in_and_its_use_recorded(client, user, run):
    row, token = create_token(user, "laptop")
    response = client.get(f"{API}/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200 and response.json()["id"] == run.pk
    row.refresh_from_db()
    assert row.last_used is not None


def test_a_revoked_token_or_an_inactive_user_gets_401(client, user, run):
    row, token = create_token(user, "old")
    row.delete()
    assert client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401
    _row, token2 = create_token(user, "new")
    user.is_active = False
    user.save()
    assert client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {token2}").status_code == 401


def test_only_a_digest_of_the_token_is_stored(user):
    row, token = create_token(user, "x")
    assert token.startswith("gw_") and len(token) > 40
    assert row.digest == digest(token) and token not in (row.digest, row.prefix)


def test_the_account_page_makes_a_token_shown_once(signed_in, user, client):
    page = signed_in.post(reverse("account"), {"name": "training loop"})
    assert page.status_code == 200
    html = page.content.decode()
    token = html.split('<pre class="mono" id="new-token">')[1].split("</pre>")[0]
    assert ApiToken.objects.get(user=user).digest == digest(token) and page["Cache-Control"] == "no-store"
    assert token not in signed_in.get(reverse("account")).content.decode()  # shown once
    assert token not in str(dict(signed_in.session))  # kept nowhere in plain text
    assert "training loop" in signed_in.get(reverse("account")).content.decode()
    assert client.get(f"{API}/labels", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_a_user_revokes_their_own_token_only(signed_in, user, django_user_model):
    mine, _ = create_token(user, "mine")
    bob = django_user_model.objects.create_user(username="bob", password="x")
    theirs, _ = create_token(bob, "theirs")
    assert signed_in.post(reverse("token_delete", args=[theirs.pk])).status_code == 404
    assert signed_in.post(reverse("token_delete", args=[mine.pk])).status_code == 302
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["theirs"]
    assert "theirs" not in signed_in.get(reverse("account")).content.decode()


def test_the_account_forms_need_a_session_and_a_csrf_token(client, user):
    assert reverse("login") in client.get(reverse("account"))["Location"]
    assert reverse("login") in client.post(reverse("account"), {"name": "x"})["Location"]
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(reverse("account"), {"name": "x"}).status_code == 403
    row, _ = create_token(user, "kept")
    assert strict.post(reverse("token_delete", args=[row.pk])).status_code == 403
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["kept"]


def test_the_openapi_schema_is_served_and_lists_the_actions(client, db):
    response = client.get(f"{API}/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.") and schema["info"]["title"] == "gymweb API"
    paths = schema["paths"]
    for path in (
        "/api/v1/datasets",
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/cancel",
        "/api/v1/runs/{run_id}/retry",
        "/api/v1/runs/{run_id}/rollouts.jsonl",
        "/api/v1/runs/{run_id}/rollouts",
        "/api/v1/rollouts/{rollout_id}/labels",
        "/api/v1/rollouts/{rollout_id}/notes",
        "/api/v1/runs/{run_id}/sft.jsonl",
    ):
        assert path in paths, path
    assert schema["components"]["securitySchemes"] == {"TokenAuth": {"type": "http", "scheme": "bearer"}}


def test_a_script_with_a_token_needs_no_csrf_token(user, run):
    _row, token = create_token(user, "script")
    strict = Client(enforce_csrf_checks=True)
    response = strict.post(
        f"{API}/labels",
        '{"name": "from-a-script"}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 201


def test_the_api_docs_page_is_swagger_ui_from_gymweb_s_own_static_files(client, db):
    response = client.get(f"{API}/docs")
    assert response.status_code == 200
    body = response.content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', body)
    assert scripts and all(src.startswith("/static/ninja/") for src in scripts), scripts
    assert "cdn" not in body.lower() and "/api/v1/openapi.json" in body
    script_src = response["Content-Security-Policy"].split("script-src")[1].split(";")[0]
    assert script_src.strip() == "'self'"  # no CDN and no inline script allowed for it


def test_an_unknown_api_path_is_a_json_404(client):
    response = client.get("/api/v1/no/such/route")
    assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
    assert "no API route /api/v1/no/such/route" in response.json()["detail"]
    for path in ("/api/v1/", "/api/", "/api", "/api/v2/runs"):  # the API's root and other versions too
        response = client.get(path)
        assert response.status_code == 404 and f"no API route {path} " in response.json()["detail"], path


def test_an_unknown_api_path_is_a_json_404_for_every_method(db):
    from django.test import Client as DjangoClient

    browserless = DjangoClient(enforce_csrf_checks=True)  # as curl: no CSRF cookie
    for method in ("post", "put", "patch", "delete"):
        response = getattr(browserless, method)("/api/v1/nothere", data="{}", content_type="application/json")
        assert response.status_code == 404 and response["Content-Type"].startswith("application/json"), method


def test_a_wrong_method_on_an_api_path_is_a_json_405_naming_the_methods_it_takes(client, db):
    _row, token = create_token(User.objects.create_user("m"), "script")
    response = client.put(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 405 and response["Content-Type"].startswith("application/json")
    assert set(response["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    detail = response.json()["detail"]
    assert detail.startswith("Method Not Allowed: PUT /api/v1/runs") and "GET" in detail and "POST" in detail
