"""A ``sqlite://`` DATABASE_URL gets the embedded default's SQLite options (WAL, synchronous=NORMAL,
IMMEDIATE transactions, busy timeout): without them every dispatcher commit is an fsync."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, django
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as c:
    c.execute("PRAGMA journal_mode"); mode = c.fetchone()[0]
    c.execute("PRAGMA synchronous"); sync = c.fetchone()[0]
    c.execute("PRAGMA busy_timeout"); busy = c.fetchone()[0]
print(json.dumps({"mode": mode, "sync": sync, "busy": busy,
                  "tx": settings.DATABASES["default"]["OPTIONS"].get("transaction_mode")}))
"""


def _probe(tmp_path, url):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gymweb.settings", "DATABASE_URL": url}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_sqlite_database_url_runs_in_wal_mode_without_a_sync_per_commit(tmp_path):
    got = _probe(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert got == {"mode": "wal", "sync": 1, "busy": 30000, "tx": "IMMEDIATE"}
