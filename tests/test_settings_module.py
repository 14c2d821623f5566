"""gymweb.conf: every GYMWEB_* setting typed in one place; docs/settings.md's table made from it;
`gymweb settings` shows values (secrets masked) and sources; unknown variables are warned about."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as dj
from django.core import checks

from gymweb import conf
from rollouts.management.commands.settings import replace_table

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "settings.md"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYMWEB_")}
    env.pop("DATABASE_URL", None)
    return {**env, **extra}


def test_the_docs_table_is_the_one_the_module_makes():
    text = DOCS.read_text()
    assert conf.MARK_BEGIN in text and conf.MARK_END in text
    assert replace_table(text) == text, (
        "docs/settings.md is out of date: run `gymweb settings --write-docs docs/settings.md`"
    )
    assert conf.OTHER_VARIABLES
    for name in conf.OTHER_VARIABLES:
        assert f"`{name}`" in text


def test_every_setting_is_a_django_setting_with_the_module_default():
    fields = conf.GymwebSettings.model_fields
    assert len(fields) > 40
    for field in fields:
        assert hasattr(dj, conf.env_name(field)), field
    assert conf.GymwebSettings.model_fields["live_cache_s"].default == 2


def test_no_code_reads_a_gymweb_variable_from_the_environment_but_the_module():
    offenders = []
    for path in [*(REPO / "gymweb").rglob("*.py"), *(REPO / "rollouts").rglob("*.py")]:
        # The Python client (gymweb/client.py) and the examples run in a trainer's or a user's
        # process, not gymweb's: they read GYMWEB_URL/GYMWEB_TOKEN (conf.OTHER_VARIABLES) themselves.
        if path.name == "conf.py" or "examples" in path.parts or path == REPO / "gymweb" / "client.py":
            continue
        text = path.read_text()
        if 'environ.get("GYMWEB_' in text or "environ['GYMWEB_" in text or 'environ["GYMWEB_' in text:
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_values_are_typed_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("GYMWEB_ALLOWED_HOSTS", " a.example , b.example,")
    monkeypatch.setenv("GYMWEB_ALLOW_LOCAL_TARGETS", "yes")
    monkeypatch.setenv("GYMWEB_LEASE_S", "12.5")
    monkeypatch.setenv("GYMWEB_DEBUG", "")  # empty: the default
    got = conf.load()
    assert got.allowed_hosts == ["a.example", "b.example"]
    assert got.allow_local_targets is True and got.lease_s == 12.5 and got.debug is False
    monkeypatch.setenv("GYMWEB_LEASE_S", "soon")
    with pytest.raises(conf.SettingsError, match=r"GYMWEB_LEASE_S='soon'"):
        conf.load()


def test_describe_masks_secrets_and_says_where_each_value_came_from(monkeypatch):
    monkeypatch.setenv("GYMWEB_SECRET_KEY", "very-secret-value")
    monkeypatch.setenv("GYMWEB_CACHE_URL", "redis://user:hunter2@cache:6379/1")
    monkeypatch.setenv("GYMWEB_VAR_DIR", "/srv/gymweb-old-name")
    monkeypatch.delenv("GYMWEB_DATA_DIR", raising=False)
    monkeypatch.delenv("GYMWEB_Q_NAME", raising=False)
    rows = {r["name"]: r for r in conf.describe(conf.load())}
    assert rows["GYMWEB_SECRET_KEY"]["value"] == "***"
    assert "hunter2" not in rows["GYMWEB_CACHE_URL"]["value"] and "cache:6379/1" in rows["GYMWEB_CACHE_URL"]["value"]
    assert rows["GYMWEB_DATA_DIR"] == {
        **rows["GYMWEB_DATA_DIR"],
        "value": "/srv/gymweb-old-name",
        "source": "environment (GYMWEB_VAR_DIR)",
    }
    assert rows["GYMWEB_Q_NAME"]["source"] == "default" and rows["GYMWEB_Q_NAME"]["value"] == "gymweb"
    assert all(r["description"] for r in rows.values())


def test_an_unknown_variable_is_a_system_check_warning_with_the_closest_name(monkeypatch):
    monkeypatch.setenv("GYMWEB_LEAS_S", "3")
    found = [m for m in checks.run_checks() if m.id == "gymweb.W010"]
    assert len(found) == 1
    assert "GYMWEB_LEAS_S" in found[0].msg and "GYMWEB_LEASE_S" in found[0].hint
    monkeypatch.delenv("GYMWEB_LEAS_S")
    monkeypatch.setenv("GYMWEB_URL", "http://x")  # the example client's: known
    assert [m for m in checks.run_checks() if m.id == "gymweb.W010"] == []


def test_the_gymweb_command_lists_its_commands_and_runs_settings(tmp_path):
    gymweb = [sys.executable, "-m", "gymweb"]
    env = _clean_env(GYMWEB_DATA_DIR=str(tmp_path), GYMWEB_SECRET_KEY="s3cret-s3cret", GYMWEB_LEAS_S="1")
    help_out = subprocess.run([*gymweb, "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert help_out.returncode == 0, help_out.stderr
    listed = help_out.stdout
    for name in (
        "demo",
        "serve",
        "worker",
        "collect",
        "settings",
        "profile",
        "compare",
        "import_rollouts",
        "migrate",
        "createsuperuser",
    ):
        assert f" {name}" in listed, name
    out = subprocess.run([*gymweb, "settings"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("GYMWEB_")}
    assert set(lines) == {conf.env_name(f) for f in conf.GymwebSettings.model_fields}
    assert "s3cret" not in out.stdout and "***" in lines["GYMWEB_SECRET_KEY"]
    assert str(tmp_path) in lines["GYMWEB_DATA_DIR"] and "environment (GYMWEB_DATA_DIR)" in lines["GYMWEB_DATA_DIR"]
    assert "GYMWEB_LEAS_S" in out.stderr and "GYMWEB_LEASE_S" in out.stderr
    bad = subprocess.run(
        [*gymweb, "settings"], env={**env, "GYMWEB_Q_WORKERS": "two"}, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "GYMWEB_Q_WORKERS='two'" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.django_db
def test_postgresql_connections_run_without_jit():
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite has no JIT")
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off", "the run table's sorts spend seconds compiling plans with JIT on"
