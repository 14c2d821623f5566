"""Content rendering of trajectory items: Markdown messages, folded thinking, tool-call arguments
as fields, diffs, JSON trees (also JSON inside JSON strings). (A folded item's one-line summary is
``rollouts.web.outline.item_summary``.)

Everything rendered here is untrusted model or environment output. The rules:

- Builders (``markdown_text``, ``diffs``, ``json_tree``) write markup as strings: every untrusted piece
  goes through ``django.utils.html.escape`` (Markdown through markdown-it-py with ``html=False``),
  and the markup around it is constant.
- ``sanitise`` is the ONE place that turns markup into something a template prints as HTML: it
  runs nh3 (the Rust ``ammonia`` sanitiser) with explicit allowlists of tags, attributes, CSS
  classes and URL schemes (``http``, ``https``, ``mailto``; relative links; never ``javascript:``;
  ``data:`` only as the ``src`` of an ``img`` holding a PNG, JPEG, GIF or WebP, and ``img`` takes
  no other ``src``; no event handlers, no ``style``, no ``id``, no ``hx-*``), then escapes quotes
  in text as Django's autoescape does. Every body the trajectory page prints comes out of it.
- Functions are pure (no database, no request): ``items`` (the item view models) calls them with an item's
  payload and a character budget.

Display limit: an item shows at most ``max_chars`` characters of its texts (``Budget``; the page
passes ``GYMWEB_DISPLAY_MAX_CHARS``); rendering stops walking a JSON value once the budget is
spent, so a render costs what is shown, not what is stored. Texts longer than ``RICH_MAX_CHARS``
are shown as plain text even when asked in full (Markdown and JSON trees of megabytes would make
a page nobody can read, at a cost linear but large).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString

from rollouts.web.diffs import diff_html, looks_like_diff
from rollouts.web.json_tree import (
    CODE_KEYS,
    fields_html,
    json_block,
    parse_json_text,
    pretty_text,
    string_value_html,
    value_html,
)
from rollouts.web.markdown_text import message_text_html
from rollouts.web.markup import RICH_MAX_CHARS, Budget, elided_note, plural, pre_block
from rollouts.web.sanitiser import DATA_IMAGE_RE, IMAGE_MAX_CHARS, sanitise


@dataclass
class Body:
    """An item's rendered body: ``html`` (sanitised), ``total`` characters of text the item
    holds, ``cut`` True when the body shows less than all of it, ``notes`` (e.g. arguments that
    are not JSON), ``rich`` True when it differs from the plain rendering (fields, JSON tree, diff,
    Markdown, folded thinking)."""

    html: SafeString
    total: int
    cut: bool
    notes: list[str] = field(default_factory=list)
    rich: bool = False


def _content_list(content: Any) -> list[Any]:
    if content is None:
        return []
    return content if isinstance(content, list) else [content]


def _part_texts(content: Any) -> int:
    total = 0
    for part in _content_list(content):
        if isinstance(part, str):
            total += len(part)
        elif isinstance(part, dict):
            for key in ("text", "refusal"):
                if isinstance(part.get(key), str):
                    total += len(part[key])
                    break
            else:
                total += len(pretty_text(part)[0]) if len(_content_list(content)) < 1000 else 0
        else:
            total += len(str(part))
    return total


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parts(content: Any, budget: Budget, plain: bool, markdown: bool) -> str:
    """A message's (or a tool output's) content parts: text (Markdown when ``markdown``),
    refusals, and other parts as JSON."""
    parts = _content_list(content)
    out = []
    for i, part in enumerate(parts):
        if budget.spent:
            budget.cut = True
            n = len(parts) - i
            out.append(elided_note(f"… {plural(n, 'more part')}"))
            break
        if isinstance(part, str):
            out.append(_text(part, budget, plain, markdown))
        elif not isinstance(part, dict):
            shown, note = budget.clip(pretty_text(part)[0])
            out.append(pre_block(shown, "part-json") + elided_note(note))
        else:
            ptype = part.get("type")
            if ptype == "input_image" and not plain and _image_url(part) is not None:
                out.append(_image(part))
            elif ptype == "refusal" or (ptype is None and isinstance(part.get("refusal"), str)):
                shown, note = budget.clip(str(part.get("refusal") or ""))
                out.append(
                    f'<div class="part-refusal"><span class="badge failed">refusal</span> {escape(shown)}</div>'
                    f"{elided_note(note)}"
                )
            elif isinstance(part.get("text"), str):
                if ptype not in ("output_text", "input_text", "text", "summary_text", "reasoning_text", None):
                    out.append(f'<div class="part-label">{escape(_short(ptype))}</div>')
                out.append(_text(part["text"], budget, plain, markdown))
            else:
                label = f'<div class="part-label">{escape(_short(ptype or "part"))}</div>'
                if plain:
                    shown, note = budget.clip(pretty_text(part)[0])
                    out.append(label + pre_block(shown, "part-json") + elided_note(note))
                else:
                    out.append(label + json_block(part, budget))
    return "".join(out)


def _image_url(part: dict) -> str | None:
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    return url if isinstance(url, str) and url else None


def _image(part: dict) -> str:
    """An ``input_image`` part: a data URL of a known type (``DATA_IMAGE_RE``) inlined as an image
    sized to fit (the page enlarges it on click); a remote URL as a link the browser never loads
    unless followed; anything else named but not shown."""
    url = _image_url(part) or ""
    head = url[:40].lower()
    if head.startswith("data:"):
        kind = head[len("data:image/") :].split(";", 1)[0] if head.startswith("data:image/") else "?"
        size = len(url) * 3 // 4
        label = f"image ({escape(kind)}, {_size(size)})"
        if len(url) > IMAGE_MAX_CHARS:
            return (
                f'<div class="part-image-remote"><span class="badge">{label}</span> '
                "too large to show here: see the raw JSON</div>"
            )
        if not DATA_IMAGE_RE.fullmatch(url):
            return (
                f'<div class="part-image-remote"><span class="badge">{label}</span> '
                "not shown: only base64 PNG, JPEG, GIF and WebP images are</div>"
            )
        return f'<div class="part-image"><img class="part-img" src="{escape(url)}" alt="{label}"></div>'
    if head.startswith(("http://", "https://")):
        return (
            f'<div class="part-image-remote"><span class="badge">remote image</span> <a href="{escape(url)}">'
            f"{escape(_short(url, 300))}</a> (not loaded: open the link to see it)</div>"
        )
    return (
        f'<div class="part-image-remote"><span class="badge">image</span> {escape(_short(url, 300))} (not shown)</div>'
    )


def _size(n: int) -> str:
    return f"{n:,} B" if n < 1024 else f"{n / 1024:,.0f} KB" if n < 1024 * 1024 else f"{n / 1024 / 1024:,.1f} MB"


def _text(text: str, budget: Budget, plain: bool, markdown: bool) -> str:
    if markdown:
        return message_text_html(text, budget, plain)
    if plain:
        shown, note = budget.clip(text)
        return pre_block(shown, "out-text") + elided_note(note)
    return _output_text(text, budget)


def _output_text(text: str, budget: Budget) -> str:
    """A tool's output text by content: JSON as a tree, a diff, otherwise text as it came."""
    parsed = parse_json_text(text)
    if parsed is not None:
        return json_block(parsed, budget, 1)
    if len(text) <= RICH_MAX_CHARS and looks_like_diff(text):
        shown, note = budget.clip(text)
        return diff_html(shown, note)
    shown, note = budget.clip(text)
    return pre_block(shown, "out-text") + elided_note(note)


def _reasoning_html(item: dict, budget: Budget) -> tuple[str, int]:
    """A reasoning item's texts folded: ``(markup, total characters)``."""
    texts = reasoning_texts(item)
    total = sum(len(t) for t in texts)
    if texts:
        inner = []
        for t in texts:
            if budget.spent:
                budget.cut = True
                break
            shown, note = budget.clip(t)
            inner.append(pre_block(shown, "think-text") + elided_note(note))
        html = (
            f'<details class="reasoning"><summary class="think-sum">reasoning <span class="think-len">'
            f"{plural(total, 'character')}</span></summary>{''.join(inner)}</details>"
        )
    else:
        html = (
            '<span class="j-l">'
            + ("(no summary; content encrypted)" if item.get("encrypted_content") else "(no summary)")
            + "</span>"
        )
    return html, total


def _call_html(item: dict, budget: Budget, plain: bool, notes: list[str]) -> tuple[str, int]:
    """A function call's arguments (fields, a JSON tree, or raw when not JSON; ``notes`` gets
    why): ``(markup, total characters)``."""
    arguments = item.get("arguments")
    raw, is_json = pretty_text(arguments) if not isinstance(arguments, str) else (arguments, True)
    total = len(raw)
    parsed = parse_json_text(arguments) if isinstance(arguments, str) else None
    if not isinstance(arguments, str):
        notes.append(f"arguments are a {type(arguments).__name__}, not a JSON string: shown as they came")
        shown, note = budget.clip(pretty_text(arguments)[0])
        html = pre_block(shown, "args args-raw") + elided_note(note)
    elif parsed is None:
        try:
            json.loads(arguments)
            valid = True
        except (ValueError, RecursionError):
            valid = False
        if not valid:
            notes.append("arguments are not valid JSON: shown raw")
        shown, note = budget.clip(arguments)
        html = pre_block(shown, "args" if valid else "args args-raw") + elided_note(note)
    elif plain:
        shown, note = budget.clip(pretty_text(parsed)[0])
        html = pre_block(shown, "args") + elided_note(note)
    elif isinstance(parsed, dict):
        html = fields_html(parsed, budget) if parsed else '<span class="j-l">{}</span>'
    else:
        html = json_block(parsed, budget)
    return html, total


def item_body(payload: Any, kind: str, *, max_chars: int, plain: bool = False) -> Body:
    """The body of one trajectory item (``kind``: ``message``, ``reasoning``, ``function_call``,
    ``function_call_output``, anything else as generic JSON) rendered by content, at most
    ``max_chars`` characters of its texts; ``plain`` shows texts and JSON as they came (the
    "plain text"/"raw" toggle). Never raises on odd shapes: a value the contract does not know
    is shown as JSON."""
    budget = Budget(max_chars)
    item = payload if isinstance(payload, dict) else {"type": None, "value": payload}
    notes: list[str] = []
    if kind == "message":
        content = item.get("content")
        total = _part_texts(content)
        html = _parts(content, budget, plain, markdown=True) or '<span class="j-l">(empty)</span>'
    elif kind == "reasoning":
        html, total = _reasoning_html(item, budget)
    elif kind == "function_call":
        html, total = _call_html(item, budget, plain, notes)
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            total = _part_texts(output)
            html = _parts(output, budget, plain, markdown=False) or '<span class="j-l">(empty)</span>'
        elif isinstance(output, str):
            total = len(output)
            if plain:
                shown, note = budget.clip(pretty_text(output)[0])
                html = pre_block(shown, "out-text") + elided_note(note)
            else:
                html = _output_text(output, budget) if output else '<span class="j-l">(empty)</span>'
        else:
            text = pretty_text(output)[0]
            total = len(text)
            shown, note = budget.clip(text)
            html = pre_block(shown, "part-json") + elided_note(note)
    else:
        text = pretty_text(item)[0]
        total = len(text)
        if plain or len(text) > RICH_MAX_CHARS:
            shown, note = budget.clip(text)
            html = pre_block(shown, "part-json") + elided_note(note)
        else:
            html = json_block(item, budget)
    rich = any(marker in html for marker in _RICH_MARKERS)
    return Body(sanitise(html), total, budget.cut, notes, rich)


_RICH_MARKERS = ('class="json"', 'class="fields"', 'class="diff"', 'class="md"', 'class="think"', 'class="part-image')


def reasoning_texts(item: dict) -> list[str]:
    """A reasoning item's summary texts then its content texts (the Responses API's shapes)."""
    texts = []
    for key in ("summary", "content"):
        value = item.get(key)
        for part in value if isinstance(value, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str) and key == "summary":
                texts.append(part)
    return texts


def value_body(key: str, value: Any, *, max_chars: int, plain: bool = False) -> Body:
    """One named value (a verify field) rendered by content (``value_html``; ``plain``: as
    pretty-printed JSON text), at most ``max_chars`` characters of its texts."""
    budget = Budget(max_chars)
    text = value if isinstance(value, str) else pretty_text(value)[0]
    if plain or len(text) > RICH_MAX_CHARS:
        shown, note = budget.clip(text)
        html = pre_block(shown, "part-json") + elided_note(note)
    else:
        html = value_html(key, value, budget)
    return Body(sanitise(html), len(text), budget.cut, rich=any(m in html for m in _RICH_MARKERS))


def fields_body(fields: Iterable[tuple[str, Any]], *, max_chars: int) -> Body:
    """Named values (verify fields such as SWE-bench's ``metadata.model_patch``) rendered by
    content (``value_html``), sharing one budget of ``max_chars`` characters; a ``<dl>``."""
    budget = Budget(max_chars)
    rows, total = [], 0
    for key, value in fields:
        total += len(value) if isinstance(value, str) else len(pretty_text(value)[0])
        rows.append(
            f'<dt class="f-k">{escape(str(key))}</dt><dd class="f-v">{value_html(str(key), value, budget)}</dd>'
        )
    return Body(sanitise(f'<dl class="fields">{"".join(rows)}</dl>'), total, budget.cut, rich=True)


def text_body(key: str, text: str, *, max_chars: int) -> Body:
    """A judge's or env's text (a verify field) rendered by content: JSON as a tree, a diff, code
    for code-like keys (``CODE_KEYS``), otherwise Markdown with thinking folded; at most
    ``max_chars`` characters."""
    budget = Budget(max_chars)
    if (
        parse_json_text(text) is not None
        or (len(text) <= RICH_MAX_CHARS and looks_like_diff(text))
        or key.lower() in CODE_KEYS
    ):
        html = string_value_html(key, text, budget, 0, False)
    else:
        html = message_text_html(text, budget, False) or '<span class="j-l">(empty)</span>'
    return Body(sanitise(html), len(text), budget.cut, rich=True)


def tree_body(value: Any, *, max_chars: int) -> Body:
    """A list or object (a verify field) as a JSON tree, at most ``max_chars`` characters of its
    texts (``value_body`` shows an object as a field list instead)."""
    budget = Budget(max_chars)
    text = pretty_text(value)[0]
    if len(text) > RICH_MAX_CHARS:
        shown, note = budget.clip(text)
        html = pre_block(shown, "part-json") + elided_note(note)
    else:
        html = json_block(value, budget)
    return Body(sanitise(html), len(text), budget.cut, rich=True)
