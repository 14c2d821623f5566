"""WSGI entry point: ``gunicorn gymweb.wsgi`` (docs/production.md); runserver loads it too.

With DEBUG off it refuses to start on the built-in development secret key (``gymweb.checks``).
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gymweb.settings")
application = get_wsgi_application()

from gymweb.checks import refuse_development_key  # noqa: E402  (needs the settings set up above)

refuse_development_key()
