"""Shared fixtures: the example env and agent on 127.0.0.1, a signed-in client, the counter data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in the test thread; Django's ORM refuses to run there
# unless told this is intended (DESIGN.md, known pitfalls).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

REPO = Path(__file__).resolve().parents[1]
COUNTER_TASKS = REPO / "gymweb" / "examples" / "data" / "counter_tasks.jsonl"
# NeMo Gym's real data beside the checkout (a git worktree elsewhere names it in GYMWEB_NEMO_GYM_DATA)
SHARED_DATA = Path(os.environ.get("GYMWEB_NEMO_GYM_DATA") or REPO.parent / "shared" / "data" / "nemo_gym")


# Marked ``slow`` (left out by ``make test-fast``): every test that uses one of these fixtures
# (a browser, gunicorn or qcluster processes, collectstatic's compressed output), besides the tests
# marked ``slow`` by hand.
SLOW_FIXTURES = frozenset({"browser", "gunicorn", "workers", "collected_static"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _static_root(tmp_path_factory) -> Path:
    """Where collectstatic writes for this test run: one folder shared by pytest-xdist's workers."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return base / "staticfiles"


@pytest.fixture(scope="session", autouse=True)
def _plain_static_names(tmp_path_factory):
    """In this process pages name the plain static files, as Django advises for tests: the live
    server serves them through the finders, which know no hashed names. The production storage
    stays in ``GYMWEB_PRODUCTION_STORAGES`` for ``collected_static`` and ``manifest_static``."""
    from django.conf import settings as dj
    from django.test import override_settings

    plain = {**dj.STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    with override_settings(
        STATIC_ROOT=_static_root(tmp_path_factory), STORAGES=plain, GYMWEB_PRODUCTION_STORAGES=dict(dj.STORAGES)
    ):
        yield


@pytest.fixture(scope="session", autouse=True)
def _own_data_dir(tmp_path_factory):
    """Each test process (each pytest-xdist worker) keeps its state in a folder of its own, and so
    do the workers and servers it starts (``GYMWEB_DATA_DIR``): background tasks keep their files
    under ``DATA_DIR/tasks/<task id>``, and every worker's test database numbers tasks from 1."""
    from django.test import override_settings

    folder = tmp_path_factory.mktemp("data")
    before = os.environ.get("GYMWEB_DATA_DIR")
    os.environ["GYMWEB_DATA_DIR"] = str(folder)
    try:
        with override_settings(DATA_DIR=folder):
            yield folder
    finally:
        if before is None:
            os.environ.pop("GYMWEB_DATA_DIR", None)
        else:
            os.environ["GYMWEB_DATA_DIR"] = before


@pytest.fixture(scope="session")
def collected_static(tmp_path_factory, _plain_static_names):
    """Static files collected with the production storage (WhiteNoise's
    ``CompressedManifestStaticFilesStorage``: compressed copies, hashed names in a manifest), once
    per test run and only when a test asks for them: the subprocesses that serve pages as in
    production (gunicorn, runserver; passed as ``GYMWEB_STATIC_ROOT``) and ``manifest_static``.
    pytest-xdist's workers share one copy (a file lock; the manifest is written last)."""
    import fcntl

    from django.conf import settings as dj
    from django.core.management import call_command
    from django.test import override_settings

    root = _static_root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    with (root.parent / "staticfiles.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "staticfiles.json").exists():
            with override_settings(STORAGES=dj.GYMWEB_PRODUCTION_STORAGES):
                call_command("collectstatic", interactive=False, verbosity=0)
    return root


@pytest.fixture
def manifest_static(settings, collected_static):
    """Pages name static files by collectstatic's hashed names, as with DEBUG off in production."""
    settings.STORAGES = settings.GYMWEB_PRODUCTION_STORAGES
    return collected_static


@pytest.fixture(autouse=True)
def _fast_password_hashing(request, settings):
    """Test users' passwords are hashed with MD5 (Django's advice for tests: the production hasher
    costs about a second of CPU per user). Not where a server in another process checks them."""
    if "gunicorn" not in request.fixturenames:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def browser():
    """Debian's chromium, headless, through Playwright (skips when either is missing)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def counter_env_url():
    """The example counter resources server, running for the whole session."""
    from gymweb.examples._serve import BackgroundServer
    from gymweb.examples.counter_env import make_app

    server = BackgroundServer(make_app()).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def counter_agent_url():
    """The example counter agent service, running for the whole session."""
    from gymweb.examples._serve import BackgroundServer
    from gymweb.examples.counter_agent import make_app

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
    # Runs made here complete with their failures, as the tests that count failure rows expect;
    # tests/test_auto_retry.py turns automatic retries on.
    settings.GYMWEB_AUTO_RETRY = False


@pytest.fixture
def queued(monkeypatch) -> list[tuple]:
    """What ``background`` hands the broker (the ORM's or Redis), recorded instead of sent: tests that
    queue tasks (``GYMWEB_TASKS_INLINE`` off) run them as a worker would, and nothing reaches a queue
    a later test's worker reads."""
    sent: list[tuple] = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda *args, **kwargs: sent.append(args))
    return sent


@pytest.fixture(autouse=True)
def _inline_tasks(settings):
    """Background tasks (imports, agent checks, reverify, health checks started from pages) run
    inside the request that starts them, as with no worker; tests/test_background_*.py queue them
    and run them as a worker does."""
    settings.GYMWEB_TASKS_INLINE = True


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache: counters kept there (wrong API tokens per address)
    do not carry from one test to the next."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _local_targets(settings):
    """The tests' services run on 127.0.0.1: local targets are allowed, as in a local single-user
    set-up (docs/production.md, "Which hosts a run may reach"). Tests of the target policy turn it off."""
    settings.GYMWEB_ALLOW_LOCAL_TARGETS = True
    settings.GYMWEB_ALLOWED_TARGET_HOSTS = []


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
        GYMWEB_LEASE_S="3",
        GYMWEB_HEARTBEAT_S="0.5",
        GYMWEB_POLL_S="0.05",
        GYMWEB_FLUSH_S="0.05",
        GYMWEB_CONNECT_RETRY_PAUSE_S="0.05",
        GYMWEB_Q_WORKERS="1",
        PYTHONUNBUFFERED="1",
        GYMWEB_ALLOW_LOCAL_TARGETS="1",
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server started next)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Gunicorn:
    """``gunicorn gymweb.wsgi`` subprocesses on this test's database, DEBUG off, as
    docs/production.md runs it (with the session's collected static files)."""

    def __init__(self, log_dir: Path, static_root: Path):
        self.procs = []
        self.log_dir = log_dir
        self.static_root = static_root

    def start(self, workers: int = 2, wait: bool = True, args: tuple = (), serve: bool = False, **extra_env) -> str:
        """Start one server (``args``: more gunicorn flags; ``serve``: through ``gymweb serve`` and its
        defaults; ``extra_env``: environment, None removes a variable); return its base URL once it
        answers (``wait``)."""
        import secrets
        import subprocess
        import sys

        port = free_port()
        env = _worker_env(
            {
                "GYMWEB_DEBUG": "0",
                "GYMWEB_SECRET_KEY": secrets.token_urlsafe(50),
                "GYMWEB_STATIC_ROOT": str(self.static_root),
                "GYMWEB_ALLOWED_HOSTS": "127.0.0.1,localhost",
                **{k: str(v) for k, v in extra_env.items()},
            }
        )
        for name, value in extra_env.items():
            if value is None:
                env.pop(name, None)
        log = (self.log_dir / f"gunicorn-{len(self.procs)}.log").open("wb")
        bind = f"127.0.0.1:{port}"
        serve_cmd = [sys.executable, "-m", "gymweb", "serve", "--no-collectstatic", "--bind", bind]
        proc = subprocess.Popen(
            [*serve_cmd, "--workers", str(workers), *args]
            if serve
            else [
                sys.executable,
                "-m",
                "gunicorn",
                "gymweb.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
                "--timeout",
                "120",
                "--access-logfile",
                "-",
                *args,
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        if wait:
            self.wait_ready(proc, url)
        return url

    def wait_ready(self, proc, url: str, timeout: float = 60) -> None:
        import time

        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"gunicorn exited ({proc.returncode}):\n{self.logs()[-3000:]}")
            try:
                httpx.get(url + "/accounts/login/", timeout=2, trust_env=False)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        pytest.fail(f"gunicorn did not answer at {url}:\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("gunicorn-*.log")))

    def stop_all(self):
        import signal

        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except Exception:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def gunicorn(transactional_db, collected_static, tmp_path):
    """Start gunicorn servers (``gunicorn.start(**env)`` → base URL) on this test's database."""
    servers = Gunicorn(tmp_path, collected_static)
    yield servers
    servers.stop_all()
