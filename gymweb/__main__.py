"""``python -m gymweb`` is the ``gymweb`` command (gymweb.cli)."""

from gymweb.cli import main

raise SystemExit(main())
