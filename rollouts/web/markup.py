"""What the content builders share: the character ``Budget`` of one item, the note of a cut text,
and small escaped blocks (``pre_block``, ``elided_note``). Markup as strings, not yet sanitised.
"""

from __future__ import annotations

from django.utils.html import escape

# Longer texts are shown as plain text (no Markdown, no JSON tree, no diff colouring).
RICH_MAX_CHARS = 200_000


class Budget:
    """The characters one item may still show: each text takes what is left; the rest is cut.
    ``cut`` becomes True once any text was cut or left out."""

    def __init__(self, limit: int):
        self.left = limit
        self.cut = False

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def clip(self, text: str) -> tuple[str, str]:
        """``(shown text, note)``; the note (``"… 1,234 more characters"``) is ``""`` when the
        whole text fits."""
        if len(text) <= self.left:
            self.left -= len(text)
            return text, ""
        shown, more = text[: max(self.left, 0)], len(text) - max(self.left, 0)
        self.left = 0
        self.cut = True
        return shown, more_text(more)


def more_text(more: int) -> str:
    """The note of a cut text: ``"… 1,234 more characters"``; ``""`` when nothing was cut."""
    return f"… {more:,} more character{'' if more == 1 else 's'}" if more > 0 else ""


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def pre_block(text: str, cls: str) -> str:
    # An HTML parser drops one newline right after <pre>: write one more so a leading newline stays.
    body = escape(text)
    if body.startswith("\n"):
        body = "\n" + body
    return f'<pre class="{cls}">{body}</pre>'


def elided_note(note: str) -> str:
    return f'<div class="elided">{escape(note)}</div>' if note else ""
