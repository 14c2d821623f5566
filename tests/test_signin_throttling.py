"""Sign-in throttling (django-axes): 40 wrong passwords in a row are not all answered;
after ``AXES_FAILURE_LIMIT`` failures that user name from that address is locked out, even with
the right password, on the dashboard's sign-in and the admin's; others are not."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

LOGIN = reverse("login")
ADMIN_LOGIN = reverse("admin:login")


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    # Dozens of sign-ins per test: a cheap hasher keeps them quick (throttling does not depend on it).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def admin_user(db, django_user_model):
    return django_user_model.objects.create_superuser(username="root", password="the right password 1")


def _try(client: Client, url: str, username: str, password: str, addr: str = "127.0.0.1"):
    return client.post(url, {"username": username, "password": password, "next": "/"}, REMOTE_ADDR=addr)


def test_forty_wrong_admin_passwords_are_not_all_answered(admin_user):
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    codes = [_try(client, ADMIN_LOGIN, "root", f"guess {i}").status_code for i in range(40)]
    assert codes[: limit - 1] == [200] * (limit - 1)  # the form again, "please enter the correct…"
    assert set(codes[limit:]) == {429}
    # Locked: the right password is refused too, and the page says why and for how long.
    locked = _try(client, ADMIN_LOGIN, "root", "the right password 1")
    assert locked.status_code == 429
    body = locked.content.decode()
    assert "Too many failed sign-ins" in body and "15 minutes" in body and "axes_reset" in body


def test_the_dashboard_sign_in_is_throttled_per_user_and_address(user, admin_user):
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT):
        _try(client, LOGIN, "alice", f"wrong {i}")
    assert _try(client, LOGIN, "alice", "correct horse battery").status_code == 429
    # Another user from the same address, and the same user from another address, still sign in.
    assert _try(Client(), LOGIN, "root", "the right password 1").status_code == 302
    assert _try(Client(), LOGIN, "alice", "correct horse battery", addr="127.0.0.2").status_code == 302


def test_a_lockout_ends_after_the_cool_off_time(user, settings):
    from axes.models import AccessAttempt

    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT):
        _try(client, LOGIN, "alice", f"wrong {i}")
    assert _try(client, LOGIN, "alice", "correct horse battery").status_code == 429
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16))
    assert _try(client, LOGIN, "alice", "correct horse battery").status_code == 302


def test_a_right_password_before_the_limit_resets_the_count(user):
    client = Client()
    for round_ in range(3):
        for i in range(settings.AXES_FAILURE_LIMIT - 1):
            assert _try(client, LOGIN, "alice", f"wrong {round_} {i}").status_code == 200
        assert _try(Client(), LOGIN, "alice", "correct horse battery").status_code == 302


def _behind_proxy(client: Client, username: str, password: str, forwarded: str):
    # nginx at 127.0.0.1 appends the address it was reached from to X-Forwarded-For.
    return client.post(
        LOGIN,
        {"username": username, "password": password, "next": "/"},
        REMOTE_ADDR="127.0.0.1",
        HTTP_X_FORWARDED_FOR=forwarded,
    )


def test_behind_a_trusted_proxy_one_clients_failures_do_not_lock_out_another(admin_user, settings):
    settings.GYMWEB_TRUSTED_PROXIES = 1
    attacker = Client()
    for i in range(settings.AXES_FAILURE_LIMIT + 2):
        _behind_proxy(attacker, "root", f"guess {i}", "203.0.113.7")
    assert _behind_proxy(attacker, "root", "the right password 1", "203.0.113.7").status_code == 429
    # The owner, from another address behind the same proxy, still signs in.
    owner = _behind_proxy(Client(), "root", "the right password 1", "198.51.100.20")
    assert owner.status_code == 302


def test_a_forged_forwarded_address_does_not_escape_the_lockout(admin_user, settings):
    settings.GYMWEB_TRUSTED_PROXIES = 1
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT + 2):
        # the client sends its own X-Forwarded-For; the proxy appends the real address
        _behind_proxy(client, "root", f"guess {i}", f"10.9.9.{i}, 203.0.113.7")
    assert _behind_proxy(client, "root", "the right password 1", "10.1.1.1, 203.0.113.7").status_code == 429


def test_without_trusted_proxies_a_client_cannot_pick_its_address(admin_user, settings):
    settings.GYMWEB_TRUSTED_PROXIES = 0
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT + 2):
        _behind_proxy(client, "root", f"guess {i}", f"10.9.9.{i}")
    assert _behind_proxy(client, "root", "the right password 1", "10.1.1.1").status_code == 429
