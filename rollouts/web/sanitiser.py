"""The one sanitiser of rendered content: ``sanitise`` turns builder markup into a ``SafeString``
a template prints as HTML (nh3 with explicit allowlists of tags, attributes, CSS classes and URL
schemes; ``data:`` only as an inline raster image's ``src``). Nothing else in gymweb marks
untrusted content safe (``tests/test_xss.py`` checks this).
"""

from __future__ import annotations

import re

import nh3
from django.utils.safestring import SafeString, mark_safe

from rollouts.lossless import displayable
from rollouts.web.highlight import HL_CLASSES

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
        "w-a",
        "w-d",
        "md-img",
        "think-len",
        "code-lang",
        *HL_CLASSES,  # Pygments' token classes (``hl-k``, ``hl-s2``…), in highlighted code
    },
    "pre": {"hl", "code", "diff", "out-text", "part-json", "args", "args-raw", "j-m", "think-text", "plain"},
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
    markup = displayable(markup)  # a lone surrogate as U+FFFD: no page can encode it
    cleaned = _CLEANER.clean(markup)
    pieces = _TAG_RE.split(cleaned)
    for i in range(0, len(pieces), 2):  # even indexes are text between tags
        if '"' in pieces[i] or "'" in pieces[i]:
            pieces[i] = pieces[i].replace('"', "&quot;").replace("'", "&#x27;")
    return mark_safe("".join(pieces))  # noqa: S308 -- sanitised just above: the one place
