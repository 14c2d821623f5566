"""Syntax highlighting of code blocks (Markdown fences) and code-like arguments with Pygments,
server side. Output is markup of ``<span class="hl-…">`` (Pygments escapes the text), still to be
sanitised (``sanitiser.sanitise`` allows exactly the classes ``HL_CLASSES`` names).
"""

from __future__ import annotations

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

from rollouts.web.markup import pre_block

PREFIX = "hl-"
# every class Pygments' HTML formatter can write, prefixed: the sanitiser's allowlist for spans
HL_CLASSES = frozenset(PREFIX + name for name in STANDARD_TYPES.values() if name)
# longer texts are shown without highlighting (Pygments runs at about 1 MB/s)
HIGHLIGHT_MAX_CHARS = 100_000
# argument and field names whose values are code of a known language
KEY_LANGUAGES = {
    "command": "bash",
    "cmd": "bash",
    "commands": "bash",
    "shell": "bash",
    "bash": "bash",
    "script": "bash",
    "code": "python",
    "python": "python",
    "program": "python",
    "sql": "sql",
}
_FORMATTER = HtmlFormatter(nowrap=True, classprefix=PREFIX)


def lexer_for(language: str) -> Lexer | None:
    """The Pygments lexer of a fence's language name (``python``, ``sh``, ``diff``…), or None for
    an unknown or empty name. Leading and trailing newlines are kept (the text reads as stored)."""
    name = (language or "").strip().split()[0].lower() if (language or "").strip() else ""
    if not name or len(name) > 40:
        return None
    try:
        return get_lexer_by_name(name, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def code_block(text: str, language: str, cls: str = "code") -> str:
    """``text`` as ``<pre class="{cls} hl">`` highlighted as ``language``; a plain ``pre_block``
    when the language is unknown or the text longer than ``HIGHLIGHT_MAX_CHARS``."""
    lexer = lexer_for(language)
    if lexer is None or len(text) > HIGHLIGHT_MAX_CHARS:
        return pre_block(text, cls)
    body = highlight(text, lexer, _FORMATTER)
    if not text.endswith("\n") and body.endswith("\n"):  # some lexers end every text with a newline
        body = body[:-1]
    if body.startswith("\n"):  # an HTML parser drops one newline right after <pre>
        body = "\n" + body
    return f'<pre class="{cls} hl">{body}</pre>'


def key_language(key: str) -> str:
    """The language of a code-like argument or field name (``KEY_LANGUAGES``), ``""`` if none."""
    return KEY_LANGUAGES.get(key.lower(), "")


def stylesheet() -> str:
    """Pygments' token colours for ``.hl`` blocks, light and (under prefers-color-scheme: dark)
    dark: the text of ``gymweb/static/gymweb/highlight.css``."""
    light = HtmlFormatter(classprefix=PREFIX, style="default").get_style_defs(".hl")
    dark = HtmlFormatter(classprefix=PREFIX, style="monokai").get_style_defs(".hl")
    keep = [line for line in light.splitlines() if line.startswith(".hl .")]
    keep_dark = ["  " + line for line in dark.splitlines() if line.startswith(".hl .")]
    return (
        "/* Pygments token colours for highlighted code (generated: rollouts.web.highlight.stylesheet). */\n"
        + "pre.hl { background:var(--code-bg); color:var(--fg); }\n"
        + "\n".join(keep)
        + "\n@media (prefers-color-scheme: dark) {\n"
        + "\n".join(keep_dark)
        + "\n}\n"
    )
