"""The target policy's rules (``rollouts.engine.targets.TargetPolicy``; docs/production.md, "Which hosts a run
may reach"): loopback, metadata, link-local and private addresses in their spellings and behind names,
each judged as the address it denotes, the allowlist's entry forms, and the settings that build it.
Connections themselves: ``test_target_policy_connections``."""

from __future__ import annotations

import ipaddress

import pytest

from rollouts.engine import targets
from rollouts.engine.targets import AllowEntry, InvalidAllowEntry, TargetPolicy, TargetRefused, parse_ip

STRICT = TargetPolicy()
LOCAL = TargetPolicy(allow_local=True)


def refused(policy: TargetPolicy, url: str) -> str:
    with pytest.raises(TargetRefused) as info:
        policy.check_url(url)
    return str(info.value)


def allowed(policy: TargetPolicy, url: str) -> bool:
    try:
        policy.check_url(url)
    except TargetRefused:
        return False
    return True


@pytest.fixture
def dns(monkeypatch):
    """Make names resolve where a test says (``dns["evil.test"] = ["127.0.0.1"]``)."""
    table: dict[str, list[str]] = {}
    real = targets.resolve

    def fake(host: str, port: int):
        name = host.lower().rstrip(".")
        if name in table:
            return [ipaddress.ip_address(a) for a in table[name]]
        if name.endswith(".test"):
            raise OSError(f"{name} does not resolve")
        return real(host, port)

    monkeypatch.setattr(targets, "resolve", fake)
    return table


@pytest.mark.parametrize(
    "spelling",
    ["0x7f000001", "2130706433", "127.1", "0177.0.0.1", "[::ffff:127.0.0.1]", "127.0.0.1", "[::1]", "0x7f.1"],
)
def test_every_spelling_of_loopback_is_judged_as_loopback_and_refused(spelling):
    message = refused(STRICT, f"http://{spelling}:9102")
    assert "127.0.0.1 is a loopback address" in message or "::1 is a loopback address" in message
    assert "GYMWEB_ALLOW_LOCAL_TARGETS=1" in message


@pytest.mark.parametrize("spelling", ["0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]"])
def test_the_numeric_spellings_parse_to_the_address_the_c_library_would_connect_to(spelling):
    assert parse_ip(spelling.strip("[]")) in (
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::ffff:127.0.0.1"),
    )


@pytest.mark.parametrize("spelling", ["0.0.0.0", "0", "[::]"])
def test_the_unspecified_address_is_refused_like_loopback(spelling):
    assert "is an unspecified address" in refused(STRICT, f"http://{spelling}:6379")
    assert allowed(LOCAL, f"http://{spelling}:6379")


def test_localhost_with_a_port_is_refused_by_its_resolved_address():
    message = refused(STRICT, "http://localhost:6379")
    assert "localhost resolves to" in message and "loopback" in message


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[fd00:ec2::254]",
        "http://100.100.100.200",
        "http://169.254.170.2",
        "http://[::ffff:169.254.169.254]",
    ],
)
def test_cloud_metadata_addresses_are_refused_even_when_local_targets_are_allowed(url):
    message = refused(LOCAL, url)
    assert "cloud-metadata address" in message and "listed explicitly in GYMWEB_ALLOWED_TARGET_HOSTS" in message


@pytest.mark.parametrize("url", ["http://169.254.1.2:80", "http://[fe80::1]:80"])
def test_link_local_addresses_are_refused_even_when_local_targets_are_allowed(url):
    assert "is a link-local address" in refused(LOCAL, url)


@pytest.mark.parametrize("name", ["metadata.google.internal", "METADATA.google.internal.", "metadata", "instance-data"])
def test_metadata_host_names_are_refused_before_any_lookup(name, dns):
    assert "is a cloud-metadata host" in refused(LOCAL, f"http://{name}/computeMetadata/v1/")


def test_a_metadata_name_or_address_is_allowed_only_when_listed_explicitly():
    assert allowed(TargetPolicy.from_settings(False, ["169.254.169.254"]), "http://169.254.169.254/")
    assert allowed(TargetPolicy.from_settings(False, ["169.254.0.0/16:80"]), "http://169.254.169.254/")
    assert not allowed(TargetPolicy.from_settings(False, ["169.254.0.0/16:80"]), "http://169.254.169.254:8080/")
    assert allowed(TargetPolicy.from_settings(False, ["metadata.google.internal"]), "http://metadata.google.internal/")


@pytest.mark.parametrize(
    "url", ["http://10.1.2.3", "http://172.16.0.1", "http://192.168.1.1", "http://100.64.0.1", "http://[fd12::1]"]
)
def test_private_addresses_need_allow_local(url):
    assert "is a private address" in refused(STRICT, url)
    assert allowed(LOCAL, url)


def test_a_dns_name_that_resolves_to_loopback_is_refused(dns):
    dns["agent.evil.test"] = ["127.0.0.1"]
    message = refused(STRICT, "http://agent.evil.test:6379")
    assert "agent.evil.test resolves to 127.0.0.1, which is a loopback address" in message


def test_a_dns_name_that_resolves_to_the_metadata_address_is_refused_even_if_local_is_allowed(dns):
    dns["meta.evil.test"] = ["169.254.169.254"]
    assert "cloud-metadata address" in refused(LOCAL, "http://meta.evil.test")


def test_a_name_with_one_allowed_address_is_allowed_and_only_that_address_is_used(dns):
    dns["mixed.test"] = ["127.0.0.1", "93.184.216.34"]
    kept, reason = STRICT.refusal("mixed.test", 80, [ipaddress.ip_address(a) for a in dns["mixed.test"]])
    assert kept == [ipaddress.ip_address("93.184.216.34")] and "loopback" in reason
    assert allowed(STRICT, "http://mixed.test")


def test_public_addresses_are_allowed_by_default():
    assert allowed(STRICT, "http://93.184.216.34:8000")
    assert allowed(STRICT, "https://[2606:2800:220:1:248:1893:25c8:1946]")


def test_a_host_port_entry_allows_that_port_only():
    policy = TargetPolicy.from_settings(False, ["localhost:9102"])
    assert allowed(policy, "http://localhost:9102")
    message = refused(policy, "http://localhost:6379")
    assert (
        "localhost:6379 is not in GYMWEB_ALLOWED_TARGET_HOSTS (localhost:9102); only listed targets are allowed"
        in message
    )


def test_a_bare_localhost_entry_does_not_open_every_port_of_this_machine():
    policy = TargetPolicy.from_settings(False, ["localhost", "127.0.0.1", "127.0.0.0/8"])
    for url in ("http://localhost:6379", "http://127.0.0.1:6379", "http://127.1:5432"):
        message = refused(policy, url)
        assert "on gymweb's own machine (loopback)" in message and "list it as host:port" in message
    assert allowed(
        TargetPolicy.from_settings(True, ["localhost"]), "http://localhost:6379"
    )  # local targets on: as listed


def test_a_bare_host_entry_allows_every_port_of_another_host(dns):
    dns["agent.corp.test"] = ["10.9.8.7"]
    policy = TargetPolicy.from_settings(False, ["agent.corp.test", "10.1.2.3"])
    assert allowed(policy, "http://agent.corp.test:9102") and allowed(policy, "http://agent.corp.test:6379")
    assert allowed(policy, "http://10.1.2.3:1234")


def test_a_cidr_entry_allows_every_address_in_the_range_and_nothing_else():
    policy = TargetPolicy.from_settings(False, ["10.0.0.0/8"])
    assert allowed(policy, "http://10.20.30.40:8000")
    assert "is not in GYMWEB_ALLOWED_TARGET_HOSTS (10.0.0.0/8)" in refused(policy, "http://192.168.1.1:8000")
    assert not allowed(policy, "http://93.184.216.34")  # a non-empty list allows only what it lists


def test_a_cidr_entry_with_a_port_allows_that_port_only():
    policy = TargetPolicy.from_settings(False, ["10.0.0.0/8:8000", "[fd00::/8]:9000"])
    assert allowed(policy, "http://10.1.1.1:8000") and not allowed(policy, "http://10.1.1.1:8001")
    assert allowed(policy, "http://[fd00::5]:9000") and not allowed(policy, "http://[fd00::5]:80")


def test_an_ip_entry_is_matched_by_every_spelling_of_that_address():
    policy = TargetPolicy.from_settings(False, ["127.0.0.1:9102"])
    for spelling in ("127.0.0.1", "0x7f000001", "2130706433", "127.1", "[::ffff:127.0.0.1]"):
        assert allowed(policy, f"http://{spelling}:9102"), spelling
        assert not allowed(policy, f"http://{spelling}:6379"), spelling


def test_a_cidr_entry_covers_a_name_that_resolves_inside_it(dns):
    dns["agent.corp.test"] = ["10.9.8.7"]
    assert allowed(TargetPolicy.from_settings(False, ["10.0.0.0/8"]), "http://agent.corp.test:8000")
    dns["other.corp.test"] = ["192.168.9.9"]
    assert not allowed(TargetPolicy.from_settings(False, ["10.0.0.0/8"]), "http://other.corp.test:8000")


def test_a_listed_name_is_allowed_on_its_private_address_but_never_on_a_metadata_address(dns):
    policy = TargetPolicy.from_settings(False, ["agent.corp.test"])
    dns["agent.corp.test"] = ["10.9.8.7"]
    assert allowed(policy, "http://agent.corp.test:8000")
    dns["agent.corp.test"] = ["169.254.169.254"]
    assert "cloud-metadata address" in refused(policy, "http://agent.corp.test:8000")


def test_a_name_that_does_not_resolve_is_left_to_connection_time_unless_the_list_excludes_it(dns):
    assert allowed(STRICT, "http://nowhere.test")
    assert "nowhere.test:80 is not in GYMWEB_ALLOWED_TARGET_HOSTS" in refused(
        TargetPolicy.from_settings(False, ["a.test"]), "http://nowhere.test"
    )


@pytest.mark.parametrize(
    "entry, name, network, port",
    [
        ("agent.internal", "agent.internal", None, None),
        ("Agent.Internal:8000", "agent.internal", None, 8000),
        ("10.1.2.3", None, "10.1.2.3/32", None),
        ("10.1.2.3:8000", None, "10.1.2.3/32", 8000),
        ("10.0.0.0/8", None, "10.0.0.0/8", None),
        ("10.0.0.0/8:8000", None, "10.0.0.0/8", 8000),
        ("[::1]", None, "::1/128", None),
        ("[::1]:9102", None, "::1/128", 9102),
        ("fd00::/8", None, "fd00::/8", None),
        ("[fd00::/8]:9000", None, "fd00::/8", 9000),
    ],
)
def test_allowlist_entries_take_hosts_ports_and_cidr_ranges(entry, name, network, port):
    parsed = AllowEntry.parse(entry)
    assert parsed.name == name
    assert (str(parsed.network) if parsed.network else None) == network
    assert parsed.port == port


@pytest.mark.parametrize(
    "entry, words",
    [
        ("http://agent:8000", "not a URL"),
        ("agent:http", "bad port"),
        ("agent:70000", "bad port"),
        ("10.0.0.0/33", "not a valid CIDR range"),
        ("[::1", "no closing"),
        ("bad host!", "not a valid host name"),
    ],
)
def test_a_bad_allowlist_entry_is_an_error_naming_it(entry, words):
    with pytest.raises(InvalidAllowEntry) as info:
        AllowEntry.parse(entry)
    assert words in str(info.value) and repr(entry) in str(info.value)


def test_the_settings_build_the_policy_and_a_bad_entry_fails_manage_py_check(settings):
    from django.core.checks import run_checks

    from rollouts import targets as instance

    settings.GYMWEB_ALLOW_LOCAL_TARGETS = False
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["agent.internal:8000", "10.0.0.0/8"]
    policy = instance.policy()
    assert policy.allow_local is False and [e.text for e in policy.allowed] == ["agent.internal:8000", "10.0.0.0/8"]
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = ["agent.internal:port"]
    errors = [e for e in run_checks() if e.id == "gymweb.E010"]
    assert errors and "'agent.internal:port'" in errors[0].msg


def test_the_environment_switch_reads_one_and_true():
    assert TargetPolicy.from_settings("1", "").allow_local and TargetPolicy.from_settings("true", "").allow_local
    assert not TargetPolicy.from_settings("0", "").allow_local and not TargetPolicy.from_settings("", None).allow_local
    assert [e.text for e in TargetPolicy.from_settings("", "a:1, 10.0.0.0/8 ,").allowed] == ["a:1", "10.0.0.0/8"]


def test_the_default_reply_cap_is_64_mb():
    import os

    from django.conf import settings as dj

    from rollouts import targets as instance

    assert targets.DEFAULT_MAX_REPLY_BYTES == 67108864
    assert dj.GYMWEB_MAX_REPLY_BYTES == int(os.environ.get("GYMWEB_MAX_REPLY_BYTES", 67108864))
    assert instance.max_reply_bytes() == dj.GYMWEB_MAX_REPLY_BYTES
