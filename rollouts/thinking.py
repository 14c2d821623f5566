"""Thinking spans in a model's text: ``<think>…</think>`` (or ``<thinking>``) as reasoning models
write them inside a message. One reader for the trajectory page (which folds them) and the SFT
export (which drops or moves what the page folds). No Django here."""

from __future__ import annotations

import re

_THINK_RE = re.compile(r"<(/?)(think|thinking)>", re.I)


def split_thinking(text: str) -> list[tuple[bool, str]]:
    """``text`` as ``[(is_thinking, segment), ...]`` in order: spans between ``<think>`` and
    ``</think>`` (or ``<thinking>``/``</thinking>``) are thinking. A closing tag with no opening
    one makes everything before it thinking (models whose template opens the span in the prompt,
    e.g. Qwen3); an opening tag never closed makes the rest thinking. Tags are left out."""
    matches = list(_THINK_RE.finditer(text))
    if not matches:
        return [(False, text)] if text else []
    out: list[tuple[bool, str]] = []
    pos, inside = 0, False
    if matches[0].group(1):  # starts with a closing tag: the opening one was in the prompt
        inside = True
    for m in matches:
        closing = bool(m.group(1))
        if closing and inside:
            out.append((True, text[pos : m.start()]))
            pos, inside = m.end(), False
        elif not closing and not inside:
            out.append((False, text[pos : m.start()]))
            pos, inside = m.end(), True
        # a stray tag of the wrong kind (nested or repeated) stays in the text
    out.append((inside, text[pos:]))
    return [(t, s) for t, s in out if s]
