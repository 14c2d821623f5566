"""Lossless storage of text and JSON on every backend.

PostgreSQL's ``text`` and ``jsonb`` reject U+0000, ``jsonb`` also rejects the ``\\u0000`` escape,
reorders object keys and rewrites numbers (``-0.0`` becomes ``0``, ``1e308`` an integer). An agent,
an env or a file may send any of these, so gymweb stores them in one way on SQLite and PostgreSQL:

- **JSON values** are kept as JSON text in ``text`` columns (``JSONTextField``), written by
  ``dumps`` (``json.dumps`` with non-ASCII kept: it escapes every control character, U+0000
  included, so the text never holds a raw NUL; key order and number spelling are Python's, which is
  what the loop and the exports see). Reading gives back the same Python value.
- **Plain text** (error messages, names, call ids, ...) is kept in ``LosslessTextField`` /
  ``LosslessCharField``: U+0000 is written as ``ESCAPE + "0"`` and ``ESCAPE`` itself as
  ``ESCAPE + ESCAPE``, with ``ESCAPE`` = U+FDD0 (a Unicode noncharacter, "reserved for internal
  use"); every other string, the usual case, is stored as it is. ``decode_text`` reverses it.

Every reader goes through the ORM, whose ``from_db_value`` decodes, so no page, export or command
sees the stored encoding. A SQL function over these columns (``Substr``) must say
``output_field=LosslessTextField()`` to be decoded; SQL that reads inside the JSON text reads it
through ``readable_json`` (a NUL, or on PostgreSQL a lone surrogate, as U+FFFD). Migration
``0006_lossless_text`` moved the existing columns to these fields and encoded existing rows.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from django.db import models

__all__ = [
    "ESCAPE",
    "JSONTextField",
    "LosslessCharField",
    "LosslessTextField",
    "clip_encoded",
    "decode_text",
    "displayable",
    "dumps",
    "encode_text",
    "readable_json",
    "readable_json_text",
    "register_sqlite_functions",
]

ESCAPE = "\ufdd0"
_ENCODED = re.compile(ESCAPE + "(.?)", re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """``value`` as JSON text for storage and for the exported files: ``json.dumps`` with
    ``ensure_ascii=False`` (so ``-0.0``, ``1e+308``, key order and non-ASCII text come out as Python
    writes them, and control characters as ``\\u00XX`` escapes). A lone UTF-16 surrogate (which
    strict readers refuse, but a caller may still hold) is written as its ``\\udXXX`` escape, so the
    text always encodes as UTF-8. Raises ``TypeError``/``ValueError`` for values JSON cannot hold,
    ``RecursionError`` past Python's nesting limit."""
    text = json.dumps(value, ensure_ascii=False)
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


def displayable(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate (which ``json.loads`` gives for a ``"\\ud800"``
    escape, and which no page can encode as UTF-8) as U+FFFD; other text unchanged. For pages
    only: stored values and downloads keep the escape."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub("\ufffd", text)


# One JSON escape that a database's JSON functions cannot turn into text, or one they can that
# must be left alone: an escaped backslash (so ``\\u0000`` is six characters of text), a
# surrogate pair (one character), ``\u0000``, a lone surrogate.
_JSON_ESCAPE = re.compile(
    r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u0000|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)


def _readable_escape(match: re.Match) -> str:
    found = match.group()
    return found if found == "\\\\" or len(found) == 12 else "\\ufffd"


def readable_json_text(text: str | None) -> str | None:
    """``text`` (JSON text) with ``\\u0000`` and every lone surrogate escape written as
    ``\\ufffd``: what ``readable_json`` gives on SQLite, where it is the SQL function
    ``gymweb_readable_json`` (registered on every connection: ``register_sqlite_functions``)."""
    if text is None or "\\u" not in text:
        return text
    return _JSON_ESCAPE.sub(_readable_escape, text)


def register_sqlite_functions(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: the SQL functions ``readable_json`` uses on SQLite."""
    if connection.vendor == "sqlite":
        connection.connection.create_function("gymweb_readable_json", 1, readable_json_text, deterministic=True)


def encode_text(text: str) -> str:
    """Plain text as stored: U+0000 → ``ESCAPE 0``, ``ESCAPE`` → ``ESCAPE ESCAPE``; other text
    unchanged. ``decode_text(encode_text(s)) == s`` for every string."""
    if "\x00" not in text and ESCAPE not in text:
        return text
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace("\x00", ESCAPE + "0")


def _decode_one(match: re.Match) -> str:
    nxt = match.group(1)
    if nxt == "0":
        return "\x00"
    return nxt or ""  # ESCAPE ESCAPE -> ESCAPE; a lone ESCAPE at the end (a cut value) is dropped


def decode_text(text: str) -> str:
    """The text ``encode_text`` stored. A value cut by SQL (``Substr``) in the middle of a pair
    decodes without its dangling half."""
    if ESCAPE not in text:
        return text
    return _ENCODED.sub(_decode_one, text)


def clip_encoded(text: str, limit: int) -> str:
    """The longest prefix of ``text`` whose encoded form fits in ``limit`` characters."""
    encoded = encode_text(text)
    if len(encoded) <= limit:
        return text
    out, used = [], 0
    for ch in text:
        cost = 2 if ch in ("\x00", ESCAPE) else 1
        if used + cost > limit:
            break
        out.append(ch)
        used += cost
    return "".join(out)


# PostgreSQL regular expressions (ARE) of a lone surrogate escape: a low one not after a high one,
# a high one not before a low one (``lossless.dumps`` writes only lone ones as escapes).
_LONE_LOW = r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_LONE_HIGH = r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"


def readable_json(sql: str, vendor: str) -> str:
    """SQL of the stored JSON text ``sql`` (a ``JSONTextField`` column, ``dumps``'s text) with
    every escape the database's JSON functions cannot turn into text written as ``\\ufffd``
    (U+FFFD, as the content search and the run table's fields read them): ``\\u0000`` on both
    backends (PostgreSQL refuses it, SQLite cuts the value there) and, on PostgreSQL, a lone
    surrogate escape (refused too). An escaped backslash before ``u0000`` is left alone: escaped
    backslashes are set aside first as a control character, which JSON text never holds raw.
    Text without such an escape is read as it is. ``sql`` appears three times in the result
    (repeat its parameters)."""
    if vendor != "postgresql":
        # SQLite's JSON functions give a lone surrogate as bytes that are not UTF-8 (no text can
        # read them) and cut a value at a NUL; no regular expressions in SQL: rows holding an
        # escape (rare: ``dumps`` writes non-ASCII as itself) go through Python once.
        return f"(CASE WHEN instr({sql}, '\\u') > 0 THEN gymweb_readable_json({sql}) ELSE {sql} END)"
    mark = "chr(1)"
    protected = f"replace({sql}, '\\\\', {mark})"
    fixed = f"replace({protected}, '\\u0000', '\\ufffd')"
    fixed = f"regexp_replace(regexp_replace({fixed}, '{_LONE_LOW}', '\\ufffd', 'g'), '{_LONE_HIGH}', '\\ufffd', 'g')"
    needs = f"{sql} ~ '\\\\u(0000|[dD][89a-fA-F])'"
    return f"(CASE WHEN {needs} THEN replace({fixed}, {mark}, '\\\\') ELSE {sql} END)"


class _ValueOnInstances:
    """For the type checker only: on a model instance the attribute holds the value, not the field
    (Django's own fields get this from django-stubs, which gymweb does not use)."""

    if TYPE_CHECKING:

        def __get__(self, instance: Any, owner: Any) -> Any: ...

        def __set__(self, instance: Any, value: Any) -> None: ...


class _Lossless(_ValueOnInstances):
    """Shared by the two plain-text fields: encode on the way in, decode on the way out."""

    def from_db_value(self, value, expression, connection):
        return decode_text(value) if isinstance(value, str) else value

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if isinstance(value, str):
            max_length = getattr(self, "max_length", None)
            if max_length is not None:
                value = clip_encoded(value, max_length)
            return encode_text(value)
        return value


class LosslessTextField(_Lossless, models.TextField):
    """A ``TextField`` that holds any string, U+0000 included, on every backend (``encode_text``)."""


class LosslessCharField(_Lossless, models.CharField):
    """A ``CharField`` that holds any string, U+0000 included (``encode_text``). A value whose
    encoding is longer than ``max_length`` is cut to fit (these columns hold labels whose whole
    value lives in a JSON column beside them)."""


class JSONTextField(_ValueOnInstances, models.TextField):
    """A JSON value stored as JSON text (``dumps``) in a ``text`` column on every backend: exact
    (key order, ``-0.0``, ``1.0``, big numbers, ``\\u0000`` anywhere) where ``jsonb`` is not. Reads
    give the decoded value; ``None`` is SQL NULL (so a JSON ``null`` reads back as ``None`` too).
    No JSON path lookups: nothing in gymweb queries inside these values."""

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        return json.loads(value)

    def to_python(self, value):
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    def get_prep_value(self, value):
        if value is None:
            return None
        return dumps(value)

    def value_to_string(self, obj):
        return dumps(self.value_from_object(obj))
