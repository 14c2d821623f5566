"""The ``gymweb`` command (a console script; also ``python -m gymweb``).

``gymweb serve`` runs gunicorn with the production settings (README, "Production"), ``gymweb worker``
a django-q2 cluster (``qcluster``), and every other word is a management command (``gymweb demo``,
``gymweb collect``, ``gymweb migrate``, ``gymweb settings``, ...). ``gymweb --help`` lists them.
The commands that start servers log the data directory first.
"""

from __future__ import annotations

import argparse
import os
import sys

USAGE = "usage: gymweb <command> [options]   (gymweb <command> --help for a command's options)"
# Commands of gymweb's own, in the order the help lists them; the rest are Django's and its apps'.
OWN_FIRST = ["demo", "serve", "worker", "collect", "settings"]
OWN_HELP = {
    "serve": "serve the pages with gunicorn (production settings; collects static files first)",
    "worker": "run a worker: django-q2 processes whose dispatchers run rollouts (qcluster)",
}
ALIASES = {"worker": "qcluster"}
PRINTS_DATA_DIR = {"demo", "serve", "worker", "qcluster", "runserver", "migrate"}


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gymweb.settings")
    import django

    from gymweb.conf import SettingsError

    try:
        django.setup()
    except SettingsError as exc:
        print(f"gymweb: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _first_line(text: str, width: int = 100) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def print_help(out=sys.stdout) -> None:
    """The command list: gymweb's own commands with their one-line help, then the rest by app."""
    from django.core.management import get_commands, load_command_class

    commands = get_commands()
    own = [name for name, app in commands.items() if app == "rollouts" and name not in ALIASES.values()]
    names = OWN_FIRST + sorted(set(own) - set(OWN_FIRST))
    print(USAGE, file=out)
    print("\ngymweb's commands:", file=out)
    for name in names:
        if name in OWN_HELP:
            text = OWN_HELP[name]
        else:
            text = _first_line(load_command_class(commands[name], name).help)
        print(f"  {name:<16} {text}", file=out)
    others: dict[str, list[str]] = {}
    for name, app in commands.items():
        if app != "rollouts" and name not in ALIASES.values():
            others.setdefault(app.rsplit(".", 1)[-1], []).append(name)
    print("\nDjango's and its apps' commands:", file=out)
    for app in sorted(others):
        print(f"  [{app}] " + ", ".join(sorted(others[app])), file=out)


def serve(argv: list[str]) -> int:
    """``gymweb serve``: collectstatic, refuse the development key, then exec gunicorn."""
    parser = argparse.ArgumentParser(
        prog="gymweb serve", description=OWN_HELP["serve"] + ". Other options go to gunicorn."
    )
    parser.add_argument("--bind", default="127.0.0.1:8000", help="address:port (default 127.0.0.1:8000)")
    parser.add_argument(
        "--workers",
        type=int,
        default=2 * (os.cpu_count() or 1) + 1,
        help="web worker processes (default 2 × cores + 1)",
    )
    parser.add_argument(
        "--worker-class",
        default="gthread",
        help="gunicorn's worker class (default gthread: an open results stream holds a thread, not a process)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=16,
        help="threads per worker process (default 16: each open results stream holds one, and a quarter of them, "
        "at least one, is kept for pages; above 1, gunicorn runs gthread workers whatever --worker-class says)",
    )
    parser.add_argument("--timeout", type=int, default=300, help="gunicorn's worker timeout in seconds (default 300)")
    parser.add_argument("--no-collectstatic", action="store_true", help="do not run collectstatic first")
    opts, extra = parser.parse_known_args(argv)
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import call_command

    from gymweb.checks import refuse_development_key

    try:
        refuse_development_key()
    except ImproperlyConfigured as exc:
        print(f"gymweb serve: {exc}", file=sys.stderr)
        return 2
    if not opts.no_collectstatic:
        call_command("collectstatic", interactive=False, verbosity=0)
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "gymweb.wsgi",
        "--bind",
        opts.bind,
        "--workers",
        str(opts.workers),
        "--worker-class",
        opts.worker_class,
        "--threads",
        str(opts.threads),
        "--timeout",
        str(opts.timeout),
        "--access-logfile",
        "-",
        *extra,
    ]
    if opts.threads > 1 or opts.worker_class in ("gthread", "sync"):
        # The open results streams' limit is derived from it (rollouts.api.open_streams).
        from gymweb.conf import env_name

        os.environ[env_name("web_threads")] = str(opts.threads)
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gymweb`` console script. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _setup()
    if not argv or argv[0] in ("-h", "--help", "help") and len(argv) == 1:
        print_help()
        return 0
    if argv[0] in ("--version", "version"):
        from importlib.metadata import version

        print(version("gymweb"))
        return 0
    command, rest = argv[0], argv[1:]
    if command in PRINTS_DATA_DIR and "--help" not in rest and "-h" not in rest:
        import logging

        from django.conf import settings

        # Through logging, so that with GYMWEB_LOG_FORMAT=json this line is JSON too.
        logging.getLogger("gymweb.cli").info(
            "data directory %s", settings.DATA_DIR, extra={"data_dir": str(settings.DATA_DIR)}
        )
    if command == "serve":
        return serve(rest)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["gymweb", ALIASES.get(command, command), *rest])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
