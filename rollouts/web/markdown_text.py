"""Message text as markup: Markdown (markdown-it-py, raw HTML off, images shown as text) with
thinking spans folded. Not yet sanitised (``sanitiser.sanitise``).
"""

from __future__ import annotations

from django.utils.html import escape
from markdown_it import MarkdownIt

from rollouts.thinking import split_thinking
from rollouts.web.highlight import code_block, lexer_for
from rollouts.web.markup import RICH_MAX_CHARS, Budget, elided_note, plural, pre_block


def _render_image(self, tokens, idx, options, env) -> str:
    """Images in model output are not loaded (a tracking or exfiltration URL): shown as text."""
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = token.attrGet("src") or ""
    return f'<span class="md-img">[image: {escape(alt)}] {escape(src)}</span>'


def _highlight(content: str, language: str, attrs: str) -> str:
    """A fenced code block of a known language, highlighted (``highlight.code_block``); ``""``
    lets markdown-it write it as usual (escaped)."""
    return code_block(content, language) if lexer_for(language) is not None else ""


_MD = MarkdownIt(
    "commonmark",
    {"html": False, "linkify": False, "typographer": False, "breaks": True, "highlight": _highlight},
)
_MD.enable(["table", "strikethrough"])
_MD.add_render_rule("image", _render_image)


def thinking_html(text: str, note: str, total: int | None = None) -> str:
    n = total if total is not None else len(text)
    return (
        f'<details class="think"><summary class="think-sum">thinking <span class="think-len">'
        f"{plural(n, 'character')}</span></summary>{pre_block(text.strip(chr(10)), 'think-text')}"
        f"{elided_note(note)}</details>"
    )


def markdown_html(text: str) -> str:
    if len(text) > RICH_MAX_CHARS:
        return pre_block(text, "plain")
    return f'<div class="md">{_MD.render(text)}</div>'


def message_text_html(text: str, budget: Budget, plain: bool) -> str:
    """A message's text: thinking spans folded, the rest as Markdown (or plain text)."""
    out = []
    for thinking, segment in split_thinking(text):
        shown, note = budget.clip(segment)
        if thinking:
            out.append(thinking_html(shown, note, len(segment)))
        elif not shown.strip():
            out.append(elided_note(note))
        else:
            out.append(pre_block(shown, "plain") if plain else markdown_html(shown))
            out.append(elided_note(note))
        if budget.spent:
            break
    return "".join(out)
