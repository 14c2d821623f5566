"""How the pages write numbers, durations and sizes: one function per format, plain strings, no
Django (the template filters ``num`` and ``ms`` are these functions).

- ``number``: ``3``, ``1.0``, ``0.1235`` (floats to at most 4 decimals); ``signed_number`` the same
  with its sign (a delta: ``+0.25``, ``-1``, ``0``).
- ``duration_ms``: ``12.3 ms``, ``250 ms``, ``1.24 s``.
- ``svg_number``: an SVG coordinate, ``12.5``, ``0``.
- ``binary_size``: ``512 bytes``, ``1.5 KB``, ``200 MB`` (Django's ``filesizeformat`` writes
  ``200.0 MB`` with a no-break space, keeping the ``.0``: not the text the forms and the 413 page show).

Formats kept elsewhere on purpose: chart axis labels (``rollouts.web.charts``: significant digits,
thousands separators, ``min``/``h``), the reports' text (``rollouts.evaluation``: the ``profile``
command's lines and NeMo Gym's compare report, fixed decimals), the rendered item notes
(``rollouts.web.rendering``: ``1,234 B``, ``12 KB``), file-name parts (``rollouts.review.query``).
Thousands separators are ``f"{n:,}"`` in code and ``django.contrib.humanize``'s ``intcomma`` in
templates.
"""

from __future__ import annotations

from typing import Any


def number(value: Any) -> str:
    """A number for display: integers as they are, floats with up to 4 decimals (an integral float
    keeps one: ``1.0``); ``""`` for None, other values as ``str``."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e15:
            return f"{value:.1f}"
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def signed_number(value: float | None) -> str:
    """A difference, signed, up to 4 decimals without trailing zeros: ``+0.25``, ``-1``, ``0``; ``—``
    for None."""
    if value is None:
        return "—"
    return f"{value:+.4f}".rstrip("0").rstrip(".") if value else "0"


def duration_ms(value: Any) -> str:
    """Milliseconds for display: ``"12.3 ms"``, ``"250 ms"``, ``"1.24 s"``; ``""`` for None, ``""``
    or anything not a number."""
    if value is None or value == "":
        return ""
    try:
        n = float(value)
    except (TypeError, ValueError):
        return ""
    if n >= 1000:
        return f"{n / 1000:.2f} s"
    if n >= 100:
        return f"{n:.0f} ms"
    return f"{n:.1f} ms"


def svg_number(value: float) -> str:
    """An SVG coordinate: at most two decimals, no trailing zeros (``"12.5"``, ``"0"``)."""
    return f"{value:.2f}".rstrip("0").rstrip(".") or "0"


def binary_size(n: float) -> str:
    """``1536`` → ``"1.5 KB"``; ``200 * 1024**2`` → ``"200 MB"`` (binary units, up to GB)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} bytes"  # pragma: no cover
