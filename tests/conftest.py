"""Shared fixtures: the example env and agent on 127.0.0.1, a signed-in client, the counter data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in the test thread; Django's ORM refuses to run there
# unless told this is intended (DESIGN.md, known pitfalls).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

REPO = Path(__file__).resolve().parents[1]
COUNTER_TASKS = REPO / "examples" / "data" / "counter_tasks.jsonl"
SHARED_DATA = REPO.parent / "shared" / "data" / "nemo_gym"


@pytest.fixture(scope="session")
def counter_env_url():
    """The example counter resources server, running for the whole session."""
    from examples._serve import BackgroundServer
    from examples.counter_env import make_app

    server = BackgroundServer(make_app()).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def counter_agent_url():
    """The example counter agent service, running for the whole session."""
    from examples._serve import BackgroundServer
    from examples.counter_agent import make_app

    server = BackgroundServer(make_app()).start()
    yield server.url
    server.stop()


@pytest.fixture
def counter_tasks_path() -> Path:
    return COUNTER_TASKS


@pytest.fixture
def shared_data() -> Path:
    """NeMo Gym's real data beside the checkout; tests that need it skip in a lone clone."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data/nemo_gym is not beside this checkout")
    return SHARED_DATA


@pytest.fixture
def user(db, django_user_model):
    return django_user_model.objects.create_user(username="alice", password="correct horse battery")


@pytest.fixture
def signed_in(client, user):
    """Django's test client, signed in as ``alice``."""
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _fast_workers(settings):
    # Short leases and polls keep worker tests quick; production defaults are in settings.py.
    settings.GYMWEB_LEASE_S = 3.0
    settings.GYMWEB_HEARTBEAT_S = 0.5
    settings.GYMWEB_POLL_S = 0.05
    settings.GYMWEB_FLUSH_S = 0.05
    settings.GYMWEB_CONNECT_RETRY_PAUSE_S = 0.05


def _worker_env(extra: dict | None = None) -> dict:
    """Environment for a worker subprocess that must share this test run's database."""
    from django.conf import settings as dj

    env = dict(os.environ)
    db = dj.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        env["GYMWEB_SQLITE_PATH"] = str(db["NAME"])
    else:
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    env.update(
        GYMWEB_LEASE_S="3", GYMWEB_HEARTBEAT_S="0.5", GYMWEB_POLL_S="0.05", GYMWEB_FLUSH_S="0.05",
        GYMWEB_CONNECT_RETRY_PAUSE_S="0.05", GYMWEB_Q_WORKERS="1", PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


class Workers:
    """``manage.py qcluster`` subprocesses on the test database (start, SIGKILL, SIGTERM)."""

    def __init__(self, log_dir: Path):
        self.procs = []
        self.log_dir = log_dir

    def start(self, workers: int = 1, **extra_env):
        import subprocess
        import sys

        log = (self.log_dir / f"qcluster-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "qcluster"],
            cwd=REPO,
            env=_worker_env({"GYMWEB_Q_WORKERS": str(workers), **{k: str(v) for k, v in extra_env.items()}}),
            stdout=log,
            stderr=subprocess.STDOUT,  # a file, not a pipe: an unread pipe would block the worker
            start_new_session=True,  # its own process group: a kill reaches every worker process
        )
        log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("qcluster-*.log")))

    @staticmethod
    def kill(proc, sig=None):
        import signal

        try:
            os.killpg(proc.pid, sig or signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


@pytest.fixture
def workers(transactional_db, tmp_path):
    """Start django-q2 clusters in other processes against this test's (file-backed) database.
    Afterwards, fails the test if any worker logged a locked database or a traceback."""
    pool = Workers(tmp_path)
    yield pool
    pool.stop_all()
    logs = pool.logs()
    assert "database is locked" not in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it is truthy; fail the test with ``what`` after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def pytest_sessionfinish(session, exitstatus):
    # Django drops the SQLite test database file but not its WAL and shared-memory files.
    from django.conf import settings as dj

    try:
        name = dj.DATABASES["default"].get("TEST", {}).get("NAME")
    except Exception:
        return
    if name and dj.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        for suffix in ("-wal", "-shm"):
            Path(str(name) + suffix).unlink(missing_ok=True)
