"""API tokens: a read-only token reads but gets 403 on every POST, PATCH and DELETE; an expired
token gets 401 saying it expired; wrong tokens are limited per client address (the address the
trusted proxies report): past the limit in a minute, 429 with Retry-After, for right tokens too;
``api_token create --scope --expires-in`` and the account page set both."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from rollouts.durations import parse_duration
from rollouts.models import ApiToken, Team
from rollouts.tokens import create_token

from .run_factories import finish, key, make_run
from .test_api_auth import every_action

API = "/api/v1"


@pytest.fixture
def run(db):
    run = make_run(2)
    finish(key(run, 0), "succeeded", 1.0)
    return run


def test_a_read_only_token_reads_and_gets_403_on_every_change(client, user, run):
    _row, token = create_token(user, "reader", scope="read")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    changes = [(m, url) for m, url in every_action(run) if m != "get"]
    assert changes
    for method, url in changes:
        response = getattr(client, method)(url, **auth)
        assert response.status_code == 403, (method, url, response.status_code)
        assert "read-only" in response.json()["detail"]
    assert client.get(f"{API}/runs/{run.pk}", **auth).status_code == 200
    assert client.patch(f"{API}/runs/{run.pk}", **auth).status_code in (403, 405)
    # a read-write token may change things
    _row, writer = create_token(user, "writer", scope="write")
    response = client.post(f"{API}/runs/{run.pk}/cancel", HTTP_AUTHORIZATION=f"Bearer {writer}")
    assert response.status_code != 403


def test_an_expired_token_gets_401_saying_it_expired(client, user, run):
    _row, token = create_token(user, "old", expires=timezone.now() - timedelta(seconds=1))
    response = client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    _row, fresh = create_token(user, "new", expires=timezone.now() + timedelta(days=1))
    assert client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {fresh}").status_code == 200


def test_wrong_tokens_past_the_limit_get_429_with_retry_after_per_client_address(client, user, run, settings):
    settings.GYMWEB_API_BAD_TOKENS_PER_MINUTE = 5
    settings.GYMWEB_TRUSTED_PROXIES = 1
    _row, token = create_token(user, "real")
    attacker = {"HTTP_X_FORWARDED_FOR": "203.0.113.7"}
    for _ in range(5):
        assert client.get(f"{API}/runs", HTTP_AUTHORIZATION="Bearer gw_guess", **attacker).status_code == 401
    limited = client.get(f"{API}/runs", HTTP_AUTHORIZATION="Bearer gw_guess", **attacker)
    assert limited.status_code == 429
    assert 1 <= int(limited["Retry-After"]) <= 60
    # the limited address is refused even with a right token; another address is not limited
    assert client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {token}", **attacker).status_code == 429
    other = {"HTTP_X_FORWARDED_FOR": "198.51.100.2"}
    assert client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {token}", **other).status_code == 200


def test_api_token_create_takes_a_scope_and_an_expiry(db, user):
    out = io.StringIO()
    call_command(
        "api_token",
        "create",
        "--user",
        "alice",
        "--scope",
        "read",
        "--expires-in",
        "30d",
        stdout=out,
        stderr=io.StringIO(),
    )
    row = ApiToken.objects.get(user=user)
    assert row.scope == "read"
    assert timedelta(days=29, hours=23) < row.expires - timezone.now() <= timedelta(days=30)
    listing = io.StringIO()
    call_command("api_token", "list", "--user", "alice", stdout=listing)
    assert "\tread\texpires 20" in listing.getvalue()
    with pytest.raises(CommandError, match="expires-in"):
        call_command("api_token", "create", "--user", "alice", "--expires-in", "soon")
    with pytest.raises(CommandError, match="expires-in ''"):  # an unset variable: not "never expires"
        call_command("api_token", "create", "--user", "alice", "--expires-in", "")
    for huge in ("3000000d", "99999999999d"):  # past datetime's range: refused, not an OverflowError
        with pytest.raises(CommandError, match="at most 1000 years"):
            call_command("api_token", "create", "--user", "alice", "--expires-in", huge)


def test_durations_read_minutes_hours_days_and_weeks():
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30d") == parse_duration("30") == timedelta(days=30)
    assert parse_duration("2w") == timedelta(weeks=2)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    for bad in ("-1d", "1y", "", "nan", "1e3d"):
        with pytest.raises(ValueError, match="expected a number and a unit"):
            parse_duration(bad, positive=True)
    for tiny in ("0d", "0.0000001s"):
        with pytest.raises(ValueError, match="at least 1 s"):
            parse_duration(tiny, positive=True)
    for huge in ("365001d", "99999999999d"):
        with pytest.raises(ValueError, match="at most 1000 years"):
            parse_duration(huge)


def test_the_account_page_makes_a_read_only_token_that_expires(signed_in, user):
    page = signed_in.post(reverse("account"), {"name": "ci", "scope": "read", "expires_in": "7d"})
    assert page.status_code == 200
    row = ApiToken.objects.get(user=user)
    assert row.scope == "read" and row.expires is not None
    text = page.content.decode()
    assert "read-only" in text
    refused = signed_in.post(reverse("account"), {"name": "x", "scope": "admin"})
    assert refused.status_code == 200 and ApiToken.objects.filter(user=user).count() == 1
    huge = signed_in.post(reverse("account"), {"name": "x", "scope": "read", "expires_in": "3000000d"})
    assert huge.status_code == 200 and "at most 1000 years" in huge.content.decode()
    assert ApiToken.objects.filter(user=user).count() == 1


def test_a_token_of_one_team_sees_that_teams_runs_only(client, db, django_user_model):
    red, blue = Team.objects.create(name="red"), Team.objects.create(name="blue")
    alice = django_user_model.objects.create_user(username="alice", password="x")
    red.members.add(alice)
    blue.members.add(alice)
    red_run, blue_run = make_run(1, name="r", team=red), make_run(1, name="b", team=blue)
    call_command(
        "api_token", "create", "--user", "alice", "--team", "red", stdout=(out := io.StringIO()), stderr=io.StringIO()
    )
    auth = {"HTTP_AUTHORIZATION": f"Bearer {out.getvalue().strip()}"}
    assert [r["id"] for r in client.get(f"{API}/runs", **auth).json()] == [red_run.pk]
    assert client.get(f"{API}/runs/{blue_run.pk}", **auth).status_code == 404
    assert client.get(f"{API}/runs/{red_run.pk}", **auth).status_code == 200
    # a token of all her teams sees both
    _row, everything = create_token(alice, "all")
    ids = {r["id"] for r in client.get(f"{API}/runs", HTTP_AUTHORIZATION=f"Bearer {everything}").json()}
    assert ids == {red_run.pk, blue_run.pk}
    with pytest.raises(CommandError, match="not a team"):
        call_command("api_token", "create", "--user", "alice", "--team", "nope")


def test_the_account_page_offers_a_team_to_a_member_of_two_and_refuses_another(signed_in, user):
    red, blue, green = (Team.objects.create(name=n) for n in ("red", "blue", "green"))
    red.members.add(user)
    blue.members.add(user)
    assert 'name="team"' in signed_in.get(reverse("account")).content.decode()
    signed_in.post(reverse("account"), {"name": "ci", "team": blue.pk})
    assert ApiToken.objects.get(user=user).team == blue
    signed_in.post(reverse("account"), {"name": "no", "team": green.pk})
    assert ApiToken.objects.filter(user=user).count() == 1
