"""Unified diffs as markup: ``looks_like_diff`` tells one, ``diff_html`` colours its lines under
a ``N files · +A −D`` line. Not yet sanitised (``sanitiser.sanitise``).
"""

from __future__ import annotations

import re

from django.utils.html import escape

from rollouts.web.markup import elided_note, plural

_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", re.M)


def looks_like_diff(text: str) -> bool:
    """True for a unified diff: ``diff --git`` headers, or ``---``/``+++`` file lines followed by
    an ``@@ -a,b +c,d @@`` hunk header (git diff, diff -u, SWE-bench's ``model_patch``)."""
    if "\n" not in text or "@@" not in text:
        return False
    head = text[:20_000]
    if head.lstrip().startswith("diff --git ") and _HUNK_RE.search(head):
        return True
    return bool(re.search(r"^--- .*\n\+\+\+ .*\n@@ ", head, re.M))


def diff_html(text: str, note: str = "") -> str:
    """A unified diff: file lines, hunk headers, added and removed lines in their own classes,
    with a ``N files · +A −D`` line on top."""
    rows, files, added, removed = [], 0, 0, 0
    for line in text.split("\n"):
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
        rows.append(f'<span class="{cls}">{escape(line)}</span>')
    stat = f'<div class="diff-stat">diff · {plural(max(files, 1), "file")} · +{added:,} −{removed:,}</div>'
    body = "\n".join(rows)
    if body.startswith("\n"):
        body = "\n" + body
    return f'{stat}<pre class="diff">{body}</pre>{elided_note(note)}'
