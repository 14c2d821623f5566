"""Template helpers for trajectory pages. Everything shown here is untrusted text from agents and
envs: filters return escaped strings (``django.utils.html.escape``) and never mark raw data safe."""

from __future__ import annotations

import json
import re
from typing import Any

from django import template
from django.utils.html import escape, format_html, format_html_join

from rollouts.collection.archive import shown_folder
from rollouts.display import duration_ms, number

register = template.Library()


def pretty_json_text(value: Any) -> tuple[str, bool]:
    """``(text, is_json)``: a JSON string or value pretty-printed (2-space indent, non-ASCII kept);
    a string that is not JSON comes back as it is with ``is_json`` False."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to read here: as it is
            return value, False
        if not isinstance(parsed, (dict, list)):
            return value, True  # a bare JSON scalar reads best as written
        value = parsed
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str), True
    except RecursionError:
        # Nesting deeper than the indenting (pure Python) encoder can go: compact, as valid JSON
        # can still be (the C encoder nests much deeper).
        try:
            return json.dumps(value, ensure_ascii=False, default=str), True
        except (TypeError, ValueError, RecursionError):
            return str(value)[:10_000], False
    except (TypeError, ValueError):
        return str(value), False


@register.filter(name="pretty_json", is_safe=False)
def pretty_json(value: Any) -> str:
    """A JSON string or value, pretty-printed and HTML-escaped; other text escaped as it is."""
    text, _ = pretty_json_text(value)
    return escape(text)


# The numbers' formats are rollouts.display's, one place for the pages and these filters.
register.filter("ms", duration_ms)
register.filter("num", number)


_BREAK_AFTER = re.compile(r"(?<=[/_.\-])")


@register.filter(name="soft_breaks")
def soft_breaks(value: Any) -> str:
    """``value`` escaped, with a line-break opportunity (``<wbr>``) after each ``/``, ``_``, ``.`` and
    ``-``, so a long file-like name wraps between its parts rather than mid-word (``format_html``
    escapes every part)."""
    parts = _BREAK_AFTER.split(str(value))
    head = format_html_join("", "{}<wbr>", ((part,) for part in parts[:-1]))
    return format_html("{}{}", head, parts[-1])


_NOT_VERIFIED_TITLE = (
    "no reward: the rollout failed before the env's verify gave one. NeMo Gym's files record 0.0 for a "
    "failure (the downloads keep it); it is not a verdict."
)
_VERIFY_FAILED_TITLE = (
    "no reward: the env's verify did not give a usable reply. NeMo Gym's files record 0.0 for a failure "
    "(the downloads keep it); it is not a verdict."
)


@register.filter(name="reward_text")
def reward_text(rollout: Any, digits: Any = None) -> str:
    """An attempt's env reward as the pages show it (HTML, escaped): the number only when the env's
    verify gave one, i.e. on a success (``digits`` decimals, else ``display.number``); a failure reads
    "— not verified" (its stored 0.0 is NeMo Gym's failure-row value, kept in the files, no verdict);
    an attempt without a result reads "—"."""
    status = getattr(rollout, "status", None)
    reward = getattr(rollout, "reward", None)
    if status == "succeeded" and reward is not None:
        text = f"{float(reward):.{int(digits)}f}" if digits not in (None, "") else number(reward)
        return format_html("{}", text)
    if status == "failed":
        kind = getattr(rollout, "failure_kind", "")
        title = _VERIFY_FAILED_TITLE if kind == "verify_failed" else _NOT_VERIFIED_TITLE
        return format_html('<span class="muted not-verified" title="{}">— not verified</span>', title)
    return format_html('<span class="muted">{}</span>', "—")


@register.filter(name="archive_folder")
def archive_folder(run: Any, user: Any) -> str:
    """``{{ run|archive_folder:request.user }}``: the run's archive folder as that user may read it
    (``rollouts.collection.archive.shown_folder``: the full path for staff, else its name)."""
    return shown_folder(run, user)
