"""Start-up guards of a served gymweb (docs/production.md).

- ``refuse_development_key()``: with DEBUG off, the web entry points (``gymweb.wsgi``,
  ``gymweb.asgi``; so gunicorn, runserver and any other server) refuse to start on the built-in
  development secret key, with which anyone could forge sessions. Commands that serve no pages
  (``collect``, ``profile``, ``qcluster``) and the tests do not import those modules, so they run.
- Deploy checks (``manage.py check --deploy``; registered by importing this module, which
  ``rollouts.apps`` does): the same key is an error; no ``collectstatic`` output is a warning
  (with DEBUG off pages name their stylesheet by its hashed name from that output).
- Unknown ``GYMWEB_*`` variables (every command's checks, gymweb.W010): a warning naming the
  closest known one.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

DEVELOPMENT_KEY_MESSAGE = (
    "GYMWEB_SECRET_KEY is not set and DEBUG is off: refusing to serve pages with the built-in "
    "development key (anyone who knows it could forge a signed-in session). Set GYMWEB_SECRET_KEY "
    "to a long random value, e.g. the output of "
    '`python -c "import secrets; print(secrets.token_urlsafe(50))"`, the same on every web server '
    'of this instance (README, "Production"); or set GYMWEB_DEBUG=1 for local development only.'
)


def uses_development_key() -> bool:
    """True when ``SECRET_KEY`` is the built-in development key (``GYMWEB_SECRET_KEY`` unset)."""
    return settings.SECRET_KEY == settings.GYMWEB_DEVELOPMENT_SECRET_KEY


# Shorter keys, or keys of fewer distinct characters, are refused with DEBUG off (Django's own deploy
# check only warns below 50 characters and 5 distinct ones).
MIN_KEY_LENGTH = 32
MIN_KEY_CHARACTERS = 5


def weak_key_problem() -> str | None:
    """Why ``SECRET_KEY`` is too weak to serve pages with, or None."""
    key = str(settings.SECRET_KEY)
    if len(key) < MIN_KEY_LENGTH or len(set(key)) < MIN_KEY_CHARACTERS:
        return (
            f"GYMWEB_SECRET_KEY is {len(key)} character(s) long with {len(set(key))} distinct: refusing to serve "
            f"pages with DEBUG off on a key shorter than {MIN_KEY_LENGTH} characters or of fewer than "
            f"{MIN_KEY_CHARACTERS} distinct ones (it could be guessed, and sessions forged). Set it to a long random "
            'value, e.g. the output of `python -c "import secrets; print(secrets.token_urlsafe(50))"`.'
        )
    return None


def refuse_development_key() -> None:
    """Raise ``ImproperlyConfigured`` when DEBUG is off and the secret key is the built-in
    development one (``DEVELOPMENT_KEY_MESSAGE``) or too weak (``weak_key_problem``); return
    otherwise."""
    if settings.DEBUG:
        return
    if uses_development_key():
        raise ImproperlyConfigured(DEVELOPMENT_KEY_MESSAGE)
    problem = weak_key_problem()
    if problem:
        raise ImproperlyConfigured(problem)


@checks.register(checks.Tags.security, deploy=True)
def check_secret_key(app_configs, **kwargs):
    """``check --deploy``: the built-in development key (gymweb.E001) or a weak key (gymweb.E002)
    is an error."""
    if uses_development_key():
        return [checks.Error(DEVELOPMENT_KEY_MESSAGE, id="gymweb.E001")]
    problem = weak_key_problem()
    if problem:
        return [checks.Error(problem, id="gymweb.E002")]
    return []


@checks.register(checks.Tags.security, deploy=True)
def check_collected_static(app_configs, **kwargs):
    """``check --deploy``: with DEBUG off, pages name static files by their hashed names from
    ``collectstatic``'s manifest; without it every page fails. A warning (gymweb.W001) says what
    to run."""
    from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage

    if settings.DEBUG or not isinstance(staticfiles_storage, ManifestFilesMixin):
        return []
    try:
        present = staticfiles_storage.exists(staticfiles_storage.manifest_name)
    except Exception:  # an unusable STATIC_ROOT is reported by Django's own checks
        return []
    if present:
        return []
    return [
        checks.Warning(
            f"No collected static files in {settings.STATIC_ROOT}: with DEBUG off every page fails "
            "to find its stylesheet.",
            hint="Run `python manage.py collectstatic --noinput` (after each update), or set "
            "GYMWEB_STATIC_ROOT to where it wrote them.",
            id="gymweb.W001",
        )
    ]


@checks.register()
def check_unknown_variables(app_configs, **kwargs):
    """A ``GYMWEB_*`` environment variable that gymweb does not read is a warning (gymweb.W010),
    with the closest known name: a typo must not pass silently."""
    from gymweb.conf import unknown_variables

    return [
        checks.Warning(
            f"{name} is set but gymweb reads no such setting.",
            hint=(f"Did you mean {close}? " if close else "")
            + "`gymweb settings` lists every setting (docs/settings.md).",
            id="gymweb.W010",
        )
        for name, close in unknown_variables()
    ]
