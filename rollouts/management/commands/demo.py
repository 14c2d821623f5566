"""``gymweb demo``: the whole product on the embedded default, in one command.

What it starts and what a restart keeps: docs/development.md. The secret key in ``secret_key`` in
the data directory is used unless ``GYMWEB_SECRET_KEY`` is set; the new-run form is pre-filled through
``GYMWEB_DEFAULT_AGENT_URL``/``_ENV_URL``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from gymweb import examples
from rollouts.collection import runs
from rollouts.collection.datasets import read_jsonl

DEMO_TASKS = Path(examples.__file__).resolve().parent / "data" / "demo_tasks.jsonl"
_LISTENING = re.compile(r"listening on (http://\S+)")
DEFAULT_ENV_PORT = 9101
DEFAULT_AGENT_PORT = 9102
DEFAULT_AGENT_LATENCY_MS = "500-1500"
PORTS_FILE = "demo_ports.json"


def remembered_ports(data_dir: Path) -> dict[str, int]:
    """The example ports the first demo in ``data_dir`` used: ``{"env_port": n, "agent_port": n}``
    from ``demo_ports.json``, or ``{}`` when there is none (or it cannot be read)."""
    try:
        kept = json.loads((data_dir / PORTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict):
        return {}
    return {k: v for k, v in kept.items() if k in ("env_port", "agent_port") and isinstance(v, int)}


def moved_ports_notice(old: dict[str, int], new: dict[str, int]) -> str:
    """What a demo started on other example ports than the first one changes, in words: which
    earlier runs point at the old URLs and how to retry them; ``""`` when nothing moved."""
    from rollouts.models import Run

    lines = []
    flags = []
    for key, label, flag in (
        ("env_port", "example env", "--env-port"),
        ("agent_port", "example agent", "--agent-port"),
    ):
        if key in old and old[key] != new[key]:
            lines.append(f"  the {label} moved from 127.0.0.1:{old[key]} to 127.0.0.1:{new[key]}")
        flags.append(f"{flag} {old.get(key, new[key])}")
    if not lines:
        return ""
    old_urls = [f"http://127.0.0.1:{old[k]}" for k in ("env_port", "agent_port") if k in old and old[k] != new[k]]
    stale = Run.objects.filter(Q(env_url__in=old_urls) | Q(agent_url__in=old_urls)).order_by("pk")
    names = [f"#{run.pk} {run.name}" for run in stale[:10]]
    more = stale.count() - len(names)
    lines.append(
        (
            f"  {len(names) + more} earlier run(s) point at the old address: "
            + ", ".join(names)
            + (f" and {more} more" if more > 0 else "")
        )
        if names
        else "  no earlier run points at the old address"
    )
    if names:
        lines.append(
            "  to retry them, start the demo on the first ports again: gymweb demo "
            + " ".join(flags)
            + " (or make demo without ENV_PORT/AGENT_PORT)"
        )
    return "\n".join(lines)


def _kept_secret(path: Path, make) -> str:
    """The text kept in ``path`` (owner-only), made by ``make()`` and written on first use."""
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    text = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")
    return text


def _interrupt(signum, frame):
    # SIGTERM stops the demo like Ctrl-C does: children are stopped in the finally block.
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run gymweb with the example env and agent, a worker and a demo run; Ctrl-C stops everything."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="web server address (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="web server port (default 8000)")
        parser.add_argument(
            "--env-port",
            type=int,
            default=None,
            help=f"example env port on 127.0.0.1 (default: the first demo's, else {DEFAULT_ENV_PORT})",
        )
        parser.add_argument(
            "--agent-port",
            type=int,
            default=None,
            help=f"example agent port on 127.0.0.1 (default: the first demo's, else {DEFAULT_AGENT_PORT})",
        )
        parser.add_argument(
            "--agent-latency-ms",
            default=DEFAULT_AGENT_LATENCY_MS,
            help="the example agent's time per call, milliseconds or MIN-MAX drawn per call "
            f"(default {DEFAULT_AGENT_LATENCY_MS}: a run takes long enough to watch; 0 for none)",
        )
        parser.add_argument("--user", default="demo", help="sign-in user to create (default demo)")
        parser.add_argument(
            "--password",
            default=None,
            help="its password (default: the one it had in the last demo, else a new random one; printed)",
        )
        parser.add_argument(
            "--num-repeats", type=int, default=4, help="rollouts per demo task in the demo run (default 4)"
        )
        parser.add_argument(
            "--head-url",
            default=None,
            help="a running NeMo Gym head server (manage.py env start gymweb/examples/nemo_gym/counter_remote.yaml): "
            "the demo run uses its counter environment, found by name, instead of the example env",
        )
        parser.add_argument("--no-run", action="store_true", help="start everything but launch no demo run")
        parser.add_argument(
            "--exit-when-done", action="store_true", help="stop once the demo run is final (for scripts and CI)"
        )

    def handle(self, *args, **opts):
        self.children: list[subprocess.Popen] = []
        self.names: list[str] = []
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._main(opts)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            self._stop_children()
            self.stdout.write("stopped.")

    def _remember_ports(self, opts, kept: dict[str, int]) -> str:
        """Keep the first demo's example ports in the data directory (so earlier runs stay
        retryable); return what moved since, in words (``""`` when nothing did)."""
        ports = {"env_port": opts["env_port"], "agent_port": opts["agent_port"]}
        if kept:
            return moved_ports_notice(kept, ports)
        data_dir = Path(settings.DATA_DIR)
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / PORTS_FILE).write_text(json.dumps(ports) + "\n")
        return ""

    def _main(self, opts):
        from gymweb.examples.counter_agent import parse_latency_ms

        try:
            parse_latency_ms(opts["agent_latency_ms"])
        except ValueError as exc:
            raise CommandError(f"--agent-latency-ms: {exc}") from None
        # The flag, else the first demo's port, else the default.
        kept = remembered_ports(Path(settings.DATA_DIR))
        opts["env_port"] = opts["env_port"] or kept.get("env_port") or DEFAULT_ENV_PORT
        opts["agent_port"] = opts["agent_port"] or kept.get("agent_port") or DEFAULT_AGENT_PORT
        self._check_port_free(opts["host"], opts["port"], "--port")
        self._check_port_free("127.0.0.1", opts["env_port"], "--env-port")
        self._check_port_free("127.0.0.1", opts["agent_port"], "--agent-port")
        # The first start migrates a new database and collects the static files: tens of seconds
        # with nothing else to show, so say what is happening.
        self.stdout.write(f"preparing the database and static files in {settings.DATA_DIR}…")
        call_command("migrate", verbosity=0, interactive=False)
        self.moved = self._remember_ports(opts, kept)
        # WhiteNoise serves the collected files (compressed, hashed names), as in production.
        call_command("collectstatic", verbosity=0, interactive=False)
        user, password = self._demo_user(opts["user"], opts["password"])

        nemo = self._nemo_gym_env(opts["head_url"]) if opts["head_url"] else None
        env_url = self._spawn(
            "counter env", [sys.executable, "-m", "gymweb.examples.counter_env", "--port", str(opts["env_port"])]
        )
        agent_url = self._spawn(
            "counter agent",
            [
                sys.executable,
                "-m",
                "gymweb.examples.counter_agent",
                "--port",
                str(opts["agent_port"]),
                "--latency-ms",
                opts["agent_latency_ms"],
            ],
        )
        served = {
            "GYMWEB_ALLOW_LOCAL_TARGETS": "1",
            "GYMWEB_SECRET_KEY": settings.GYMWEB_SECRET_KEY
            or _kept_secret(Path(settings.DATA_DIR) / "secret_key", lambda: secrets.token_urlsafe(50)),
            "GYMWEB_DEFAULT_AGENT_URL": agent_url,
            "GYMWEB_DEFAULT_ENV_URL": env_url,
            "GYMWEB_NEMO_GYM_HEAD_URL": nemo.head_url if nemo else "",
        }
        self._spawn_plain("worker", [sys.executable, "-m", "gymweb", "worker"], served)
        web_url = f"http://{opts['host']}:{opts['port']}"
        self._spawn_plain(
            "web", [sys.executable, "-m", "gymweb", "runserver", "--noreload", f"{opts['host']}:{opts['port']}"], served
        )
        self._wait_http(web_url + "/accounts/login/")

        run = None
        if not opts["no_run"]:
            with DEMO_TASKS.open("rb") as fh:
                parsed = read_jsonl(fh, source=str(DEMO_TASKS))
            dataset = runs.store_dataset(parsed, DEMO_TASKS.name, user)
            run = runs.create_run(
                parsed,
                name="demo: counter tasks, three fail on purpose",
                user=user,
                dataset=dataset,
                agent_url=agent_url,
                env_url=nemo.env_url if nemo else env_url,
                head_url=nemo.head_url if nemo else "",
                env_name=nemo.env_name if nemo else "",
                num_repeats=opts["num_repeats"],
                max_steps=8,
                concurrency=8,
            )
            runs.launch(run)

        self.stdout.write(self.style.SUCCESS("\ngymweb is running"))
        # the run table opens with the tasks' demo_note column, which says what each task shows
        self.stdout.write(f"  open        {web_url}/" + (f"runs/{run.pk}/?cols=task.demo_note" if run else ""))
        self.stdout.write(f"  sign in as  {opts['user']} / {password}")
        self.stdout.write(f"  example env {env_url}   example agent {agent_url}")
        if nemo:
            self.stdout.write(
                f"  NeMo Gym    {nemo.env_name} at {nemo.env_url} (head server {nemo.head_url}): the demo run's environment"
            )
        self.stdout.write(
            "  the demo run: 5 counter tasks succeed (reward 1.0) and 3 fail on purpose, each labelled in its"
            " demo_note (a column of the run table): a tool that answers an error and a wrong answer (reward 0.0), a broken reply (a failed rollout)"
        )
        if self.moved:
            self.stdout.write(self.style.WARNING("  the example ports are not the first demo's:\n" + self.moved))
        self.stdout.write("  Ctrl-C stops everything.\n")

        while True:
            for name, proc in self._named:
                if proc.poll() is not None:
                    raise CommandError(f"the {name} process stopped (exit {proc.returncode})")
            if opts["exit_when_done"] and run is not None:
                run.refresh_from_db()
                if run.is_final:
                    counts = runs.counts(run)
                    rewards = list(
                        run.rollouts.filter(status="succeeded", reward__isnull=False).values_list("reward", flat=True)
                    )
                    mean = f", mean reward of the succeeded {sum(rewards) / len(rewards):.2f}" if rewards else ""
                    full = sum(1 for r in rewards if r == 1.0)
                    self.stdout.write(
                        f"demo run {run.status}: {counts['succeeded']} succeeded, {counts['failed']} failed"
                        f" ({full} with reward 1.0{mean})"
                    )
                    return
            time.sleep(0.5)

    def _nemo_gym_env(self, head_url: str):
        """The counter environment of a running NeMo Gym head server (its only resources server,
        or the one its agent names), registered with gymweb. The demo is a local set-up: local
        targets are allowed here as in its web server and worker."""
        from rollouts.collection import environments

        settings.GYMWEB_ALLOW_LOCAL_TARGETS = True
        try:
            head = environments.fetch_head(head_url)
            servers = list(head.config.resources_servers())
            env_name = servers[0] if len(servers) == 1 else head.config.agent().resources_server
            resolved = environments.resolve(
                head.config,
                head_url=head.url,
                env_name=env_name,
                agent_name=next((a.name for a in head.config.agents() if a.resources_server == env_name), None),
            )
        except (environments.HeadServerError, environments.NemoConfigError) as exc:
            raise CommandError(f"--head-url: {exc}") from None
        environments.register_head(head.url)
        return resolved

    def _demo_user(self, username: str, wanted: str | None):
        """The sign-in user (a superuser) and its password: ``wanted``, else the one kept from the
        last demo (``demo_password`` in the data directory) if it still signs in, else a new random one. The password
        is only set when it changes: setting it anew would sign out every open browser."""
        kept = Path(settings.DATA_DIR) / "demo_password"
        User = get_user_model()
        user, _created = User.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        password = wanted
        if password is None:
            try:
                password = kept.read_text().strip() or None
            except FileNotFoundError:
                password = None
        if password is None or not user.check_password(password):
            password = password or secrets.token_urlsafe(9)
            user.set_password(password)
        user.is_active = user.is_staff = user.is_superuser = True
        user.save()
        kept.unlink(missing_ok=True)
        _kept_secret(kept, lambda: password)
        return user, password

    # -- child processes ---------------------------------------------------------------------
    @property
    def _named(self):
        return list(zip(self.names, self.children))

    def _popen(self, name, cmd, **kwargs):
        proc = subprocess.Popen(cmd, cwd=settings.DATA_DIR, start_new_session=True, **kwargs)
        self.children.append(proc)
        self.names.append(name)
        return proc

    def _spawn(self, name, cmd) -> str:
        """Start an example service on a free port; return its URL from its 'listening on' line."""
        proc = self._popen(name, cmd, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            match = _LISTENING.search(line or "")
            if match:
                return match.group(1)
        raise CommandError(f"the {name} did not start")

    def _spawn_plain(self, name, cmd, extra_env=None):
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
        return self._popen(name, cmd, env=env)

    @staticmethod
    def _check_port_free(host: str, port: int, flag: str = "--port") -> None:
        """Fail before touching anything (users, runs) when a port is taken, e.g. by another
        demo: otherwise its health check would reach the other server."""
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise CommandError(
                    f"{host}:{port} is already in use ({exc.strerror}); is another gymweb demo running? "
                    f"Pick another port: gymweb demo {flag} {port + 1}"
                ) from None

    def _wait_http(self, url: str, timeout: float = 30) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=2, trust_env=False)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise CommandError(f"the web server did not answer at {url}")

    def _stop_children(self):
        for proc in reversed(self.children):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.children:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
