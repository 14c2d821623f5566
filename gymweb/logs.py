"""Log formatting: ``GYMWEB_LOG_FORMAT=json`` writes one JSON object per line (``gymweb.settings.LOGGING``).

Each object has ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger`` and ``message``, plus
``exception`` (the formatted traceback) when there is one and any ``extra={...}`` fields the call
passed whose names do not clash with those.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import orjson

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in the message are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return orjson.dumps(out, default=str).decode()
