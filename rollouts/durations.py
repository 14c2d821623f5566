"""Durations as people type them: ``30d``, ``12h``, ``90m``, ``45s``, ``2w``, ``1.5d`` or a bare
number of days. The one reader of ``prune --older-than``, ``api_token --expires-in`` and the
account page's token expiry."""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["MAX_DAYS", "parse_duration"]

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# At most 1000 years: a datetime plus or minus more leaves datetime's range (year 1 to 9999).
MAX_DAYS = 365_000
_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[smhdw])?")


def parse_duration(text: str, *, positive: bool = False) -> timedelta:
    """``text`` as a timedelta: a number written in digits (``1.5`` too) and a unit (s, m, h, d,
    w); a bare number is days. Raises ``ValueError`` naming the text for anything else (``nan``,
    ``1e3d``, ``-1d``, ``1y``), for more than 1000 years, and with ``positive`` for less than 1 s."""
    match = _DURATION.fullmatch((text or "").strip().lower())
    if match is None:
        raise ValueError(f"{text!r}: expected a number and a unit (s, m, h, d, w), e.g. 30d, 12h, 90m or 2w")
    seconds = float(match["number"]) * UNITS[match["unit"] or "d"]
    if seconds > MAX_DAYS * 86400:
        raise ValueError(f"{text!r}: at most 1000 years ({MAX_DAYS}d)")
    if positive and seconds < 1:
        raise ValueError(f"{text!r}: must be at least 1 s")
    return timedelta(seconds=seconds)
