"""Sign-in throttling per client address: one password sprayed over 50 user names from one
address is refused past ``GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT``, whatever the user name (the
right password of a real user too); another address still signs in; behind a trusted proxy the
real client's address is what counts; the page and ``Retry-After`` say when to try again."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

LOGIN = reverse("login")


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _post(client: Client, username: str, password: str, **meta):
    meta.setdefault("REMOTE_ADDR", "127.0.0.1")
    return client.post(LOGIN, {"username": username, "password": password, "next": "/"}, **meta)


def test_one_password_over_fifty_user_names_from_one_address_is_throttled(user, settings):
    limit = settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT
    assert 0 < limit < 50
    client = Client()
    codes = [_post(client, f"user{i}", "Summer2026!").status_code for i in range(50)]
    assert codes[: limit - 1] == [200] * (limit - 1)
    assert set(codes[limit:]) == {429}
    # A real user's right password from that address is refused as well, and the page says when.
    locked = _post(Client(), "alice", "correct horse battery")
    assert locked.status_code == 429
    body = locked.content.decode()
    assert "from this address, over any user names" in body and "Try again after" in body
    assert 0 < int(locked["Retry-After"]) <= settings.GYMWEB_SIGNIN_LOCKOUT_MINUTES * 60 + 1


def test_another_address_still_signs_in(user, settings):
    client = Client()
    for i in range(settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT + 3):
        _post(client, f"user{i}", "Summer2026!", REMOTE_ADDR="192.0.2.9")
    assert _post(Client(), "alice", "correct horse battery", REMOTE_ADDR="192.0.2.9").status_code == 429
    assert _post(Client(), "alice", "correct horse battery", REMOTE_ADDR="192.0.2.10").status_code == 302


def test_behind_a_trusted_proxy_the_real_client_address_counts(user, settings):
    settings.GYMWEB_TRUSTED_PROXIES = 1
    sprayer = Client()
    for i in range(settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT + 3):
        # Each request forges a different left-most address; the proxy appends the real one.
        _post(sprayer, f"user{i}", "Summer2026!", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}, 203.0.113.7")
    refused = _post(Client(), "alice", "correct horse battery", HTTP_X_FORWARDED_FOR="10.1.1.1, 203.0.113.7")
    assert refused.status_code == 429
    # Everyone arrives from the proxy's own 127.0.0.1: another client behind it is not refused.
    other = _post(Client(), "alice", "correct horse battery", HTTP_X_FORWARDED_FOR="198.51.100.20")
    assert other.status_code == 302


def test_the_address_lock_ends_after_the_cool_off_time(user, settings):
    from datetime import timedelta

    from axes.models import AccessAttempt

    client = Client()
    for i in range(settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT):
        _post(client, f"user{i}", "Summer2026!")
    assert _post(Client(), "alice", "correct horse battery").status_code == 429
    old = timedelta(minutes=settings.GYMWEB_SIGNIN_LOCKOUT_MINUTES + 1)
    for attempt in AccessAttempt.objects.all():
        AccessAttempt.objects.filter(pk=attempt.pk).update(attempt_time=attempt.attempt_time - old)
    assert _post(Client(), "alice", "correct horse battery").status_code == 302


def test_zero_turns_the_address_limit_off(user, settings):
    settings.GYMWEB_SIGNIN_ADDRESS_FAILURE_LIMIT = 0
    client = Client()
    for i in range(40):
        assert _post(client, f"user{i}", "Summer2026!").status_code == 200
    assert _post(Client(), "alice", "correct horse battery").status_code == 302
