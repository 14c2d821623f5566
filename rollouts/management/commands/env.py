"""``python manage.py env start CONFIG... [--gym PATH]`` / ``env list`` / ``env add URL``: NeMo Gym
environments (docs/nemo-gym-environments.md).

``env start`` runs NeMo Gym's own ``gym env start "+config_paths=[CONFIG,...]"`` (NeMo Gym needs
Python >= 3.13 in a virtual environment of its own: gymweb never imports it, it runs its ``gym``
executable: ``--gym``, else ``GYMWEB_NEMO_GYM_BIN``, else ``gym`` on PATH), waits until the head
server reports every server ready (its ``/health`` answers 200), registers the head server, prints
the resolved URLs and the ``collect`` command to use, and runs until Ctrl-C or SIGTERM, which stop
every process NeMo Gym started (its session: its process group and Ray's workers; nothing is left
running). ``env list`` shows the registered head
servers and their environments with health and tools; ``env add URL`` registers a head server that
is already running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from rollouts.collection import environments
from rollouts.nemo.config import NemoConfigError, load_files
from rollouts.nemo.head_server import DEFAULT_HEAD_URL, HeadServerError

STOP_GRACE_S = 30.0


def find_gym(explicit: str | None) -> str:
    """The ``gym`` executable: ``explicit``, else ``GYMWEB_NEMO_GYM_BIN``, else ``gym`` on PATH.
    Raises ``CommandError`` saying how to install NeMo Gym when there is none."""
    candidate = explicit or settings.GYMWEB_NEMO_GYM_BIN or shutil.which("gym")
    if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    where = f"{candidate} is not an executable file" if candidate else "no `gym` on PATH"
    raise CommandError(
        f"NeMo Gym's `gym` executable not found ({where}). NeMo Gym needs Python >= 3.13 in a virtual "
        "environment of its own: `python3.13 -m venv ~/nemo-gym && ~/nemo-gym/bin/pip install nemo-gym`, then "
        "pass --gym ~/nemo-gym/bin/gym or set GYMWEB_NEMO_GYM_BIN."
    )


class Command(BaseCommand):
    help = "NeMo Gym environments: `env start CONFIG...` (runs `gym env start`), `env list`, `env add HEAD_URL`."
    requires_system_checks = ["models", "gymweb"]

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser(
            "start", help="run NeMo Gym's `gym env start` with these configs and register its head server"
        )
        start.add_argument(
            "configs",
            nargs="+",
            metavar="CONFIG",
            help="NeMo Gym config files (merged in order, as +config_paths=[...])",
        )
        start.add_argument(
            "--gym", default=None, help="NeMo Gym's `gym` executable (default: GYMWEB_NEMO_GYM_BIN, else `gym` on PATH)"
        )
        start.add_argument(
            "--timeout",
            type=float,
            default=600.0,
            help="seconds to wait for every server (default 600, NeMo Gym's own)",
        )
        start.add_argument(
            "--log",
            default=None,
            help="file for NeMo Gym's output (default: nemo_gym_env_start.log in the data directory)",
        )
        sub.add_parser("list", help="registered head servers and their environments, with health")
        add = sub.add_parser("add", help="register a running head server")
        add.add_argument("url", help=f"the head server's URL (NeMo Gym's default {DEFAULT_HEAD_URL})")

    def handle(self, *args, **opts) -> None:
        self._migrate()
        getattr(self, f"_{opts['action']}")(opts)

    def _migrate(self) -> None:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            call_command("migrate", verbosity=0, interactive=False)

    # -- add / list ----------------------------------------------------------------------------------
    def _add(self, opts: dict) -> None:
        try:
            head = environments.fetch_head(opts["url"])
        except HeadServerError as exc:
            raise CommandError(str(exc)) from None
        environments.register_head(head.url)
        self.stdout.write(f"registered the head server {head.url}")
        self._print_listing(head.url)

    def _list(self, opts: dict) -> None:
        heads, _ = environments.known_environments(with_tools=True, max_urls=0)
        if not heads:
            self.stdout.write("no head server registered: `manage.py env start CONFIG` or `manage.py env add URL`")
            return
        for listing in heads:
            self._print(listing)

    def _print_listing(self, url: str) -> None:
        self._print(environments.head_listing(url))

    def _print(self, listing: environments.HeadListing) -> None:
        self.stdout.write(f"head server {listing.url}")
        if listing.error:
            self.stdout.write(f"  unreachable: {listing.error}")
            return
        for env in listing.environments:
            state = "healthy" if env.healthy else f"not healthy ({env.health})" if env.url else "no URL"
            tools = f"  tools: {', '.join(env.tools)}" if env.tools else ""
            self.stdout.write(f"  environment {env.name}  {env.url or '-'}  {state}{tools}")
        for agent in listing.agents:
            self.stdout.write(
                f"  agent {agent['name']}  agent_base_url {agent['agent_base_url'] or '(not set)'}"
                f"  environment {agent['resources_server'] or '-'}"
            )

    # -- start ---------------------------------------------------------------------------------------
    def _start(self, opts: dict) -> None:
        gym = find_gym(opts["gym"])
        paths = [Path(p).expanduser().resolve() for p in opts["configs"]]
        try:
            config = load_files(paths)
        except NemoConfigError as exc:
            raise CommandError(str(exc)) from None
        head_url = config.head_server_url() or DEFAULT_HEAD_URL
        try:
            environments.fetch_head(head_url, 2.0)
        except HeadServerError:
            pass
        else:
            raise CommandError(
                f"a NeMo Gym head server already answers at {head_url}: stop it first, or register it with `env add {head_url}`"
            )
        log_path = Path(opts["log"] or Path(settings.DATA_DIR) / "nemo_gym_env_start.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [gym, "env", "start", f"+config_paths=[{','.join(str(p) for p in paths)}]"]
        self.stdout.write(f"starting: {' '.join(argv)}\n  NeMo Gym's output: {log_path}")
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(paths[0].parent),
                start_new_session=True,
            )
        stopping = {"signal": None}

        def on_signal(signum, frame):
            stopping["signal"] = signum

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._wait_ready(proc, head_url, opts["timeout"], log_path, stopping)
            if stopping["signal"] is None:
                self._ready(head_url, [str(p) for p in paths])
                while stopping["signal"] is None and proc.poll() is None:
                    time.sleep(0.2)
                if proc.poll() is not None and stopping["signal"] is None:
                    raise CommandError(f"`gym env start` exited with status {proc.returncode}:\n{_tail(log_path)}")
        finally:
            _stop_group(proc)
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.stdout.write("stopped NeMo Gym (every process it started)")

    def _wait_ready(
        self, proc: subprocess.Popen, head_url: str, timeout: float, log_path: Path, stopping: dict
    ) -> None:
        deadline = time.monotonic() + timeout
        with environments.client(2.0) as c:
            while stopping["signal"] is None:
                if proc.poll() is not None:
                    raise CommandError(
                        f"`gym env start` exited with status {proc.returncode} before it was ready:\n{_tail(log_path)}"
                    )
                try:
                    if c.get(f"{head_url}/health").status_code == 200:
                        return
                except Exception:  # not up yet (refused, reset); the target policy's refusal too
                    pass
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"the head server at {head_url} was not ready after {timeout:g} s:\n{_tail(log_path)}"
                    )
                time.sleep(0.5)

    def _ready(self, head_url: str, files: list[str]) -> None:
        try:
            head = environments.fetch_head(head_url)
        except HeadServerError as exc:
            raise CommandError(str(exc)) from None
        environments.register_head(head.url, files)
        self.stdout.write(f"NeMo Gym is ready; head server {head.url} registered with gymweb")
        self._print_listing(head.url)
        agents = [a for a in head.config.agents() if a.agent_base_url]
        if agents:
            config_args = " ".join(f"--config {f}" for f in files)
            self.stdout.write(
                f"collect with: manage.py collect {config_args} --head-url {head.url} --agent-name {agents[0].name} "
                "--input TASKS.jsonl --output results/rollouts.jsonl"
            )
        self.stdout.write("Ctrl-C stops NeMo Gym")
        sys.stdout.flush()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _session_members(sid: int) -> list[int]:
    """Pids of the live processes in session ``sid`` (Linux ``/proc``; elsewhere only ``sid``).
    Ray puts its workers in process groups of their own, still in the session ``gym`` leads."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return [sid]
    out = []
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after "pid (comm)": state, ppid, pgrp, session
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop everything ``gym env start`` started (its session, which it leads: every process group
    in it): SIGINT first (NeMo Gym's own clean shutdown), then SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        members = _session_members(proc.pid)
        if not members and proc.poll() is not None:
            return
        for pid in [proc.pid, *members]:
            try:
                os.killpg(pid, sig) if pid == proc.pid else os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not _session_members(proc.pid):
                return
            time.sleep(0.2)
    proc.poll()
