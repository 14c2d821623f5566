"""Unified diffs as markup: ``looks_like_diff`` tells one, ``diff_html`` colours its lines under
a ``N files · +A −D`` line, and with ``words`` marks the words that differ within a removed line
and the added line that replaced it (``mark_words``). Every piece of text is escaped; the result is
not yet sanitised (``sanitiser.sanitise``).
"""

from __future__ import annotations

import difflib
import re

from django.utils.html import escape

from rollouts.web.markup import elided_note, plural

_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", re.M)
_TOKEN_RE = re.compile(r"\w+|\s+|[^\w\s]")  # words, runs of space, single punctuation marks
WORD_LINE_MAX_CHARS = 2_000  # a longer line is shown whole: its words are not compared
WORD_MAX_CHARS = 40_000  # characters of line pairs compared word by word per diff
WORD_MIN_RATIO = 0.5  # a pair sharing less than this (of its tokens) is a rewrite: lines shown whole


def looks_like_diff(text: str) -> bool:
    """True for a unified diff: ``diff --git`` headers, or ``---``/``+++`` file lines followed by
    an ``@@ -a,b +c,d @@`` hunk header (git diff, diff -u, SWE-bench's ``model_patch``)."""
    if "\n" not in text or "@@" not in text:
        return False
    head = text[:20_000]
    if head.lstrip().startswith("diff --git ") and _HUNK_RE.search(head):
        return True
    return bool(re.search(r"^--- .*\n\+\+\+ .*\n@@ ", head, re.M))


def mark_words(old: str, new: str) -> tuple[str, str] | None:
    """``old`` and ``new`` escaped, with the tokens (words, spaces, punctuation) only one of them
    has wrapped in ``<span class="w-d">`` (in ``old``) and ``<span class="w-a">`` (in ``new``);
    None when the two share less than ``WORD_MIN_RATIO`` of their tokens (marking would mark
    nearly everything) or a line is longer than ``WORD_LINE_MAX_CHARS``."""
    if len(old) > WORD_LINE_MAX_CHARS or len(new) > WORD_LINE_MAX_CHARS:
        return None
    a, b = _TOKEN_RE.findall(old), _TOKEN_RE.findall(new)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < WORD_MIN_RATIO:
        return None
    out_a, out_b = [], []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        left, right = escape("".join(a[i1:i2])), escape("".join(b[j1:j2]))
        if op == "equal":
            out_a.append(left)
            out_b.append(right)
            continue
        if left:
            out_a.append(f'<span class="w-d">{left}</span>')
        if right:
            out_b.append(f'<span class="w-a">{right}</span>')
    return "".join(out_a), "".join(out_b)


def _word_pairs(lines: list[str]) -> dict[int, str]:
    """Line index → marked body (``mark_words``) for each removed line of a run of removed lines
    followed by added lines and its added counterpart (the n-th removed with the n-th added),
    within the ``WORD_MAX_CHARS`` budget."""
    marked: dict[int, str] = {}
    budget, i = WORD_MAX_CHARS, 0
    while i < len(lines):
        start = i
        while i < len(lines) and lines[i].startswith("-") and not lines[i].startswith("--- "):
            i += 1
        removed = list(range(start, i))
        first_added = i
        while i < len(lines) and lines[i].startswith("+") and not lines[i].startswith("+++ "):
            i += 1
        added = list(range(first_added, i))
        for r, a in zip(removed, added):
            budget -= len(lines[r]) + len(lines[a])
            if budget < 0:
                return marked
            pair = mark_words(lines[r][1:], lines[a][1:])
            if pair is not None:
                marked[r], marked[a] = "-" + pair[0], "+" + pair[1]
        if i == start:
            i += 1
    return marked


def diff_html(text: str, note: str = "", words: bool = False) -> str:
    """A unified diff: file lines, hunk headers, added and removed lines in their own classes,
    with a ``N files · +A −D`` line on top; ``words``: the differing words of a replaced line
    marked too (``mark_words``)."""
    rows, files, added, removed = [], 0, 0, 0
    lines = text.split("\n")
    marked = _word_pairs(lines) if words else {}
    for n, line in enumerate(lines):
        if (
            line.startswith("diff --git ")
            or line.startswith("+++ ")
            or line.startswith("--- ")
            or line.startswith("index ")
        ):
            cls = "d-f"
            if line.startswith("+++ "):
                files += 1
        elif line.startswith("@@"):
            cls = "d-h"
        elif line.startswith("+"):
            cls, added = "d-a", added + 1
        elif line.startswith("-"):
            cls, removed = "d-d", removed + 1
        else:
            rows.append(escape(line))
            continue
        rows.append(f'<span class="{cls}">{marked[n] if n in marked else escape(line)}</span>')
    stat = f'<div class="diff-stat">diff · {plural(max(files, 1), "file")} · +{added:,} −{removed:,}</div>'
    body = "\n".join(rows)
    if body.startswith("\n"):
        body = "\n" + body
    return f'{stat}<pre class="diff">{body}</pre>{elided_note(note)}'
