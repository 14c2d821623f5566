"""Host spellings, addresses that carry another address, and the env's own routes under other spellings:
the form, the workers and the evaluation commands accept the same set, and nothing reaches a refused
address or route through another spelling."""

from __future__ import annotations

import ipaddress

import pytest

from rollouts.engine.contract import tool_name_problem
from rollouts.engine.loop import InvalidBaseURL, validate_base_url
from rollouts.engine.targets import classify


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://0177.0.0.1:9000", "127.0.0.1"),
        ("http://2130706433:9000", "127.0.0.1"),
        ("http://0x7f000001:9000", "127.0.0.1"),
        ("http://127.1:9000", "127.0.0.1"),
        ("http://127.0.0.1.:9000", "127.0.0.1"),
        ("http://010.0.0.1", "8.0.0.1"),
    ],
)
def test_a_legacy_ip_spelling_is_refused_with_the_canonical_form_named(url, canonical):
    with pytest.raises(InvalidBaseURL) as exc:
        validate_base_url(url, "env_url")
    assert f"write it as {canonical}" in str(exc.value)
    assert str(exc.value).startswith("env_url ")


@pytest.mark.parametrize(
    "url",
    [
        "http://exa%41mple.com",
        "http://[fe80::1%25eth0]:9000",
        "http://bad..name",
        "http://-lead.example",
        "http://a b.example",
    ],
)
def test_a_host_with_a_percent_or_an_invalid_label_is_refused(url):
    with pytest.raises(InvalidBaseURL):
        validate_base_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000",
        "http://[::1]:9000",
        "http://localhost:9000",
        "http://my_env.svc:8000",
        "https://bücher.de",
        "http://xn--bcher-kva.de",
    ],
)
def test_canonical_addresses_and_valid_names_are_accepted(url):
    assert validate_base_url(url + "/") == url


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", "metadata"),  # 6to4 of 169.254.169.254
        ("2002:c0a8:0101::", "private"),  # 6to4 of 192.168.1.1
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("64:ff9b:1::a00:1", "private"),  # local-use NAT64 of 10.0.0.1
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, client 127.0.0.1
        ("2002:808:808::1", "public"),  # 6to4 of 8.8.8.8
    ],
)
def test_an_ipv6_address_that_carries_an_ipv4_address_is_judged_by_the_address_it_carries(address, kind):
    assert classify(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("name", ["Seed_Session", "VERIFY", "verify.", "Close_Session..", "aggregate_metrics."])
def test_the_envs_own_routes_are_refused_whatever_their_case_or_trailing_dot(name):
    problem = tool_name_problem(name)
    assert problem is not None and "environment's own routes" in problem


def test_a_tool_whose_name_only_contains_a_route_name_is_still_sent():
    assert tool_name_problem("verify_answer") is None
    assert tool_name_problem("seed") is None
