"""Content rendering of trajectory items: Markdown messages, folded thinking, tool-call arguments
as fields, diffs, JSON trees (also JSON inside JSON strings). (A folded item's one-line summary is
``rollouts.web.outline.item_summary``.)

Everything rendered here is untrusted model or environment output. The rules:

- Builders (``_markdown``, ``_diff``, ``_json`` …) write markup as strings: every untrusted piece
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
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from rollouts.thinking import split_thinking

# Longer texts are shown as plain text (no Markdown, no JSON tree, no diff colouring).
RICH_MAX_CHARS = 200_000
# JSON inside JSON strings is decoded this many levels deep; JSON values nest this deep at most
# in a tree (deeper values are shown as compact JSON text).
NESTED_JSON_LEVELS = 8
JSON_TREE_DEPTH = 40
# Argument and field names whose string values are code or commands: shown as code blocks even on
# one line (any value with a newline is a code block too).
CODE_KEYS = frozenset(
    {
        "command",
        "cmd",
        "commands",
        "code",
        "patch",
        "diff",
        "query",
        "sql",
        "script",
        "shell",
        "bash",
        "python",
        "program",
        "source",
        "snippet",
        "regex",
        "pattern",
        "model_patch",
        "test_patch",
    }
)
# An object whose values are all short scalars is shown on one line up to this length.
COMPACT_OBJECT_CHARS = 100

# -- the one sanitiser -----------------------------------------------------------------------
_TAGS = {
    "p",
    "br",
    "hr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "ul",
    "ol",
    "li",
    "blockquote",
    "pre",
    "code",
    "em",
    "strong",
    "s",
    "del",
    "a",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "details",
    "summary",
    "div",
    "span",
    "dl",
    "dt",
    "dd",
    "img",
}
_ATTRIBUTES = {
    "a": {"href"},
    "ol": {"start"},
    "details": {"open"},
    "img": {"src", "alt"},
    "*": set(),
}  # "*": no generic title/lang
_CLASSES = {
    "div": {
        "md",
        "md-plain",
        "part-refusal",
        "part-label",
        "fields",
        "json",
        "j-in",
        "j-row",
        "diff-stat",
        "think-body",
        "elided",
        "nested-note",
        "out-parts",
        "part-image",
        "part-image-remote",
    },
    "img": {"part-img"},
    "span": {
        "badge",
        "failed",
        "j-k",
        "j-s",
        "j-n",
        "j-l",
        "j-c",
        "j-note",
        "d-a",
        "d-d",
        "d-h",
        "d-f",
        "md-img",
        "think-len",
        "code-lang",
    },
    "pre": {"code", "diff", "out-text", "part-json", "args", "args-raw", "j-m", "think-text", "plain"},
    "details": {"think", "j", "json-block", "reasoning"},
    "summary": {"think-sum", "j-sum"},
    "dl": {"fields"},
    "dt": {"f-k"},
    "dd": {"f-v"},
}
_URL_SCHEMES = {"http", "https", "mailto", "data"}  # data: only as an image's src (_url_filter)
# An inline image: a base64 data URL of a raster type browsers decode safely (never SVG, which
# can carry script). The page's Content-Security-Policy allows exactly ``data:`` images besides its own.
DATA_IMAGE_RE = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*", re.I)
# Larger images are not inlined (a note and the raw JSON link instead).
IMAGE_MAX_CHARS = 8_000_000


def _url_filter(tag: str, attribute: str, value: str) -> str | None:
    """nh3's attribute filter: an ``img`` keeps only a ``src`` that is an inline image
    (``DATA_IMAGE_RE``; never a remote URL the browser would fetch); no other element may carry a
    ``data:`` URL."""
    if tag == "img" and attribute == "src":
        return value if DATA_IMAGE_RE.fullmatch(value) else None
    if attribute in ("href", "src") and value.strip().lower().startswith("data:"):
        return None
    return value


_CLEANER = nh3.Cleaner(
    tags=_TAGS,
    attributes=_ATTRIBUTES,
    allowed_classes=_CLASSES,
    url_schemes=_URL_SCHEMES,
    clean_content_tags={"script", "style"},
    strip_comments=True,
    link_rel="noopener noreferrer nofollow",
    attribute_filter=_url_filter,
)
# nh3's output is well-formed and its attribute values never hold '<' or '>' (it escapes them):
# splitting on tags finds every text node.
_TAG_RE = re.compile(r"(<[^>]*>)")


def sanitise(markup: str) -> SafeString:
    """``markup`` made safe to print: nh3 with the allowlists above, then ``"`` and ``'`` in text
    escaped (``&quot;``, ``&#x27;``) as Django's autoescape writes them, so text reads the same
    whichever way it reached the page. The only function of gymweb that marks untrusted content
    safe (``tests/test_xss.py`` checks this). Returns a ``SafeString``."""
    cleaned = _CLEANER.clean(markup)
    pieces = _TAG_RE.split(cleaned)
    for i in range(0, len(pieces), 2):  # even indexes are text between tags
        if '"' in pieces[i] or "'" in pieces[i]:
            pieces[i] = pieces[i].replace('"', "&quot;").replace("'", "&#x27;")
    return mark_safe("".join(pieces))  # noqa: S308 -- sanitised just above: the one place


# -- budget -----------------------------------------------------------------------------------
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


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# -- small builders ---------------------------------------------------------------------------
def _pre(text: str, cls: str) -> str:
    # An HTML parser drops one newline right after <pre>: write one more so a leading newline stays.
    body = escape(text)
    if body.startswith("\n"):
        body = "\n" + body
    return f'<pre class="{cls}">{body}</pre>'


def _note(note: str) -> str:
    return f'<div class="elided">{escape(note)}</div>' if note else ""


# -- Markdown and thinking --------------------------------------------------------------------
def _render_image(self, tokens, idx, options, env) -> str:
    """Images in model output are not loaded (a tracking or exfiltration URL): shown as text."""
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = token.attrGet("src") or ""
    return f'<span class="md-img">[image: {escape(alt)}] {escape(src)}</span>'


_MD = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "breaks": True})
_MD.enable(["table", "strikethrough"])
_MD.add_render_rule("image", _render_image)


def _think(text: str, note: str, total: int | None = None) -> str:
    n = total if total is not None else len(text)
    return (
        f'<details class="think"><summary class="think-sum">thinking <span class="think-len">'
        f"{_plural(n, 'character')}</span></summary>{_pre(text.strip(chr(10)), 'think-text')}{_note(note)}</details>"
    )


def _markdown(text: str) -> str:
    if len(text) > RICH_MAX_CHARS:
        return _pre(text, "plain")
    return f'<div class="md">{_MD.render(text)}</div>'


def _message_text(text: str, budget: Budget, plain: bool) -> str:
    """A message's text: thinking spans folded, the rest as Markdown (or plain text)."""
    out = []
    for thinking, segment in split_thinking(text):
        shown, note = budget.clip(segment)
        if thinking:
            out.append(_think(shown, note, len(segment)))
        elif not shown.strip():
            out.append(_note(note))
        else:
            out.append(_pre(shown, "plain") if plain else _markdown(shown))
            out.append(_note(note))
        if budget.spent:
            break
    return "".join(out)


# -- diffs -------------------------------------------------------------------------------------
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


def _diff(text: str, note: str = "") -> str:
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
    stat = f'<div class="diff-stat">diff · {_plural(max(files, 1), "file")} · +{added:,} −{removed:,}</div>'
    body = "\n".join(rows)
    if body.startswith("\n"):
        body = "\n" + body
    return f'{stat}<pre class="diff">{body}</pre>{_note(note)}'


# -- JSON ----------------------------------------------------------------------------------------
def parse_json_text(text: str) -> Any:
    """The object or array a string holds as JSON, or None (not JSON, a bare scalar, or longer
    than ``RICH_MAX_CHARS``)."""
    s = text.strip()
    if not s or s[0] not in "{[" or s[-1] not in "}]" or len(s) > RICH_MAX_CHARS:
        return None
    try:
        value = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, (dict, list)) else None


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return f'<span class="j-l">{"null" if value is None else str(value).lower()}</span>'
    if isinstance(value, (int, float)):
        return f'<span class="j-n">{escape(json.dumps(value))}</span>'
    return f'<span class="j-l">{escape(str(value))}</span>'


def _string_value(key: str, text: str, budget: Budget, levels: int, in_json: bool) -> str:
    """A string found in arguments, a tool output, a JSON value or a verify field, by content:
    JSON (decoded and shown as a tree), a diff, code or multi-line text (whitespace kept), or a
    one-line string."""
    if levels < NESTED_JSON_LEVELS:
        nested = parse_json_text(text)
        if nested is not None:
            return '<div class="nested-note"><span class="j-note">JSON in a string</span></div>' + _json(
                nested, budget, levels + 1
            )
    if len(text) <= RICH_MAX_CHARS and looks_like_diff(text):
        shown, note = budget.clip(text)
        return _diff(shown, note)
    if "\n" in text or (not in_json and key.lower() in CODE_KEYS):
        shown, note = budget.clip(text)
        return _pre(shown, "code" if not in_json else "j-m") + _note(note)
    shown, note = budget.clip(text)
    if in_json:
        return f'<span class="j-s">{escape(json.dumps(shown, ensure_ascii=False))}</span>{_note(note)}'
    return f'<span class="j-s">{escape(shown)}</span>{_note(note)}'


def _json(value: Any, budget: Budget, levels: int = 0, depth: int = 0) -> str:
    """A JSON value as a foldable tree (objects and arrays are ``<details open>``)."""
    if isinstance(value, str):
        return _string_value("", value, budget, levels, True)
    if not isinstance(value, (dict, list)):
        return _scalar(value)
    if not value:
        return '<span class="j-l">{}</span>' if isinstance(value, dict) else '<span class="j-l">[]</span>'
    if depth >= JSON_TREE_DEPTH:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, RecursionError):
            text = str(value)[:10_000]
        shown, note = budget.clip(text)
        return _pre(shown, "part-json") + _note(note)
    is_dict = isinstance(value, dict)
    compact = _compact(value, is_dict) if depth else None  # the outermost value is always a tree
    if compact is not None:
        shown, note = budget.clip(compact)
        return f'<span class="j-s">{escape(shown)}</span>{_note(note)}'
    entries: Iterable = value.items() if isinstance(value, dict) else enumerate(value)
    rows = []
    listed = 0
    for k, v in entries:
        if budget.spent:
            budget.cut = True
            break
        key = str(k)
        label = f'<span class="j-k">{escape(key)}</span>: ' if is_dict else ""
        rows.append(
            f'<div class="j-row">{label}{_json(v, budget, levels, depth + 1) if isinstance(v, (dict, list)) else _leaf(key, v, budget, levels)}</div>'
        )
        listed += 1
    if listed < len(value):
        left = len(value) - listed
        rows.append(_note(f"… {left:,} more entr{'y' if left == 1 else 'ies'}"))
    size = _plural(len(value), "key") if is_dict else _plural(len(value), "item")
    opener, closer = ("{", "}") if is_dict else ("[", "]")
    return (
        f'<details class="j" open><summary class="j-sum">{opener} <span class="j-c">{size}</span></summary>'
        f'<div class="j-in">{"".join(rows)}</div>{closer}</details>'
    )


def _is_plain_scalar(v: Any) -> bool:
    if isinstance(v, str):
        return len(v) <= 80 and "\n" not in v and v.strip()[:1] not in ("{", "[")
    return v is None or isinstance(v, (bool, int, float))


def _compact(value: Any, is_dict: bool) -> str | None:
    """One line of JSON for a container of plain scalars (short one-line strings, numbers,
    literals): an array of any length, an object up to ``COMPACT_OBJECT_CHARS``; None otherwise
    (shown as a tree)."""
    values = value.values() if is_dict else value
    if not all(_is_plain_scalar(v) for v in values):
        return None
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if not is_dict or len(text) <= COMPACT_OBJECT_CHARS else None


def _leaf(key: str, value: Any, budget: Budget, levels: int) -> str:
    if isinstance(value, str):
        return _string_value(key, value, budget, levels, True)
    return _scalar(value)


def _json_block(value: Any, budget: Budget, levels: int = 0) -> str:
    return f'<div class="json">{_json(value, budget, levels)}</div>'


def _pretty_text(value: Any) -> tuple[str, bool]:
    """``(text, is_json)``: JSON (a string holding JSON, or a value) pretty-printed with a
    2-space indent; other strings as they are."""
    if isinstance(value, str):
        parsed = parse_json_text(value)
        if parsed is None:
            try:
                json.loads(value)
                return value, True
            except (ValueError, RecursionError):
                return value, False
        value = parsed
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str), True
    except (ValueError, RecursionError, TypeError):
        try:
            return json.dumps(value, ensure_ascii=False, default=str), True
        except (ValueError, RecursionError, TypeError):
            return str(value)[:10_000], False


# -- fields ------------------------------------------------------------------------------------
def value_html(key: str, value: Any, budget: Budget) -> str:
    """One named value (a tool-call argument, a verify field) rendered by content: a string by
    ``_string_value``; an object as a field list; an array as a JSON tree; other values as JSON
    literals. Markup, not yet sanitised."""
    if isinstance(value, str):
        return _string_value(key, value, budget, 0, False)
    if isinstance(value, dict) and value:
        return _fields(value, budget)
    if isinstance(value, list):
        compact = _compact(value, False)
        if compact is not None:
            shown, note = budget.clip(compact)
            return f'<span class="j-s">{escape(shown)}</span>{_note(note)}'
    if isinstance(value, (dict, list)):
        return _json_block(value, budget)
    return _scalar(value)


def _fields(mapping: dict, budget: Budget) -> str:
    rows = []
    items = list(mapping.items())
    for i, (k, v) in enumerate(items):
        if budget.spent:
            budget.cut = True
            rows.append(f'<dt class="f-k">…</dt><dd class="f-v">{_note(f"{len(items) - i:,} more field(s)")}</dd>')
            break
        rows.append(f'<dt class="f-k">{escape(str(k))}</dt><dd class="f-v">{value_html(str(k), v, budget)}</dd>')
    return f'<dl class="fields">{"".join(rows)}</dl>'


# -- item bodies ---------------------------------------------------------------------------------
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
                total += len(_pretty_text(part)[0]) if len(_content_list(content)) < 1000 else 0
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
            out.append(_note(f"… {_plural(n, 'more part')}"))
            break
        if isinstance(part, str):
            out.append(_text(part, budget, plain, markdown))
        elif not isinstance(part, dict):
            shown, note = budget.clip(_pretty_text(part)[0])
            out.append(_pre(shown, "part-json") + _note(note))
        else:
            ptype = part.get("type")
            if ptype == "input_image" and not plain and _image_url(part) is not None:
                out.append(_image(part))
            elif ptype == "refusal" or (ptype is None and isinstance(part.get("refusal"), str)):
                shown, note = budget.clip(str(part.get("refusal") or ""))
                out.append(
                    f'<div class="part-refusal"><span class="badge failed">refusal</span> {escape(shown)}</div>{_note(note)}'
                )
            elif isinstance(part.get("text"), str):
                if ptype not in ("output_text", "input_text", "text", "summary_text", "reasoning_text", None):
                    out.append(f'<div class="part-label">{escape(_short(ptype))}</div>')
                out.append(_text(part["text"], budget, plain, markdown))
            else:
                label = f'<div class="part-label">{escape(_short(ptype or "part"))}</div>'
                if plain:
                    shown, note = budget.clip(_pretty_text(part)[0])
                    out.append(label + _pre(shown, "part-json") + _note(note))
                else:
                    out.append(label + _json_block(part, budget))
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
            return f'<div class="part-image-remote"><span class="badge">{label}</span> too large to show here: see the raw JSON</div>'
        if not DATA_IMAGE_RE.fullmatch(url):
            return f'<div class="part-image-remote"><span class="badge">{label}</span> not shown: only base64 PNG, JPEG, GIF and WebP images are</div>'
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
        return _message_text(text, budget, plain)
    if plain:
        shown, note = budget.clip(text)
        return _pre(shown, "out-text") + _note(note)
    return _output_text(text, budget)


def _output_text(text: str, budget: Budget) -> str:
    """A tool's output text by content: JSON as a tree, a diff, otherwise text as it came."""
    parsed = parse_json_text(text)
    if parsed is not None:
        return _json_block(parsed, budget, 1)
    if len(text) <= RICH_MAX_CHARS and looks_like_diff(text):
        shown, note = budget.clip(text)
        return _diff(shown, note)
    shown, note = budget.clip(text)
    return _pre(shown, "out-text") + _note(note)


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
        texts = reasoning_texts(item)
        total = sum(len(t) for t in texts)
        if texts:
            inner = []
            for t in texts:
                if budget.spent:
                    budget.cut = True
                    break
                shown, note = budget.clip(t)
                inner.append(_pre(shown, "think-text") + _note(note))
            html = (
                f'<details class="reasoning"><summary class="think-sum">reasoning <span class="think-len">'
                f"{_plural(total, 'character')}</span></summary>{''.join(inner)}</details>"
            )
        else:
            html = (
                '<span class="j-l">'
                + ("(no summary; content encrypted)" if item.get("encrypted_content") else "(no summary)")
                + "</span>"
            )
    elif kind == "function_call":
        arguments = item.get("arguments")
        raw, is_json = _pretty_text(arguments) if not isinstance(arguments, str) else (arguments, True)
        total = len(raw)
        parsed = parse_json_text(arguments) if isinstance(arguments, str) else None
        if not isinstance(arguments, str):
            notes.append(f"arguments are a {type(arguments).__name__}, not a JSON string: shown as they came")
            shown, note = budget.clip(_pretty_text(arguments)[0])
            html = _pre(shown, "args args-raw") + _note(note)
        elif parsed is None:
            try:
                json.loads(arguments)
                valid = True
            except (ValueError, RecursionError):
                valid = False
            if not valid:
                notes.append("arguments are not valid JSON: shown raw")
            shown, note = budget.clip(arguments)
            html = _pre(shown, "args" if valid else "args args-raw") + _note(note)
        elif plain:
            shown, note = budget.clip(_pretty_text(parsed)[0])
            html = _pre(shown, "args") + _note(note)
        elif isinstance(parsed, dict):
            html = _fields(parsed, budget) if parsed else '<span class="j-l">{}</span>'
        else:
            html = _json_block(parsed, budget)
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            total = _part_texts(output)
            html = _parts(output, budget, plain, markdown=False) or '<span class="j-l">(empty)</span>'
        elif isinstance(output, str):
            total = len(output)
            if plain:
                shown, note = budget.clip(_pretty_text(output)[0])
                html = _pre(shown, "out-text") + _note(note)
            else:
                html = _output_text(output, budget) if output else '<span class="j-l">(empty)</span>'
        else:
            text = _pretty_text(output)[0]
            total = len(text)
            shown, note = budget.clip(text)
            html = _pre(shown, "part-json") + _note(note)
    else:
        text = _pretty_text(item)[0]
        total = len(text)
        if plain or len(text) > RICH_MAX_CHARS:
            shown, note = budget.clip(text)
            html = _pre(shown, "part-json") + _note(note)
        else:
            html = _json_block(item, budget)
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
    text = value if isinstance(value, str) else _pretty_text(value)[0]
    if plain or len(text) > RICH_MAX_CHARS:
        shown, note = budget.clip(text)
        html = _pre(shown, "part-json") + _note(note)
    else:
        html = value_html(key, value, budget)
    return Body(sanitise(html), len(text), budget.cut, rich=any(m in html for m in _RICH_MARKERS))


def fields_body(fields: Iterable[tuple[str, Any]], *, max_chars: int) -> Body:
    """Named values (verify fields such as SWE-bench's ``metadata.model_patch``) rendered by
    content (``value_html``), sharing one budget of ``max_chars`` characters; a ``<dl>``."""
    budget = Budget(max_chars)
    rows, total = [], 0
    for key, value in fields:
        total += len(value) if isinstance(value, str) else len(_pretty_text(value)[0])
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
        html = _string_value(key, text, budget, 0, False)
    else:
        html = _message_text(text, budget, False) or '<span class="j-l">(empty)</span>'
    return Body(sanitise(html), len(text), budget.cut, rich=True)


def tree_body(value: Any, *, max_chars: int) -> Body:
    """A list or object (a verify field) as a JSON tree, at most ``max_chars`` characters of its
    texts (``value_body`` shows an object as a field list instead)."""
    budget = Budget(max_chars)
    text = _pretty_text(value)[0]
    if len(text) > RICH_MAX_CHARS:
        shown, note = budget.clip(text)
        html = _pre(shown, "part-json") + _note(note)
    else:
        html = _json_block(value, budget)
    return Body(sanitise(html), len(text), budget.cut, rich=True)
