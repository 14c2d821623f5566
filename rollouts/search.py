"""Content search across a run: which rollouts hold a text in any trajectory item, call a
tool, have a tool output holding a text, or failed with a message holding a text.

**What is indexed.** Every ``TrajectoryItem`` carries ``search_text`` (``item_search_text``): the
item's string values, decoded (JSON escapes undone, so a quote, a newline or text after U+0000 is
found as it reads), lowercased, joined by newlines. Structural values (``type``, ``id``, ``status``,
``role``) are left out so "assistant" or "completed" do not match every item. A string that holds
JSON (tool-call ``arguments``, a tool output that is a JSON document) also contributes its decoded
strings when they differ from the raw text (escapes inside). U+0000 becomes a space (PostgreSQL's
``text`` cannot hold it, and a search box cannot type it): "a\\x00secret" is found by "secret".
The column is filled by ``TrajectoryItem``'s manager on every ``bulk_create``/``save`` (the worker,
``collect``, imports, reverify, tests), and for rows stored before by migration
``0013_content_search``.

**The index, per backend** (``ensure_index``, run by the migration and after every ``migrate``):

- SQLite (≥ 3.34): an FTS5 table ``rollouts_item_fts`` with the ``trigram`` tokenizer over the
  items' ``search_text`` (external content: the text is not stored twice), kept in step by
  triggers on ``rollouts_trajectoryitem``. A search is a quoted FTS5 phrase, i.e. a case-insensitive
  substring match; FTS operators (``AND``, ``*``, ``NEAR(``, quotes) in the query are literal text.
- PostgreSQL: a GIN index with ``pg_trgm``'s ``gin_trgm_ops`` on ``search_text``; a search is
  ``search_text LIKE '%<lowercased, escaped>%'``, which that index serves.

A query shorter than 3 characters has no trigram; it is answered by a scan of the run's items (each
rollout probed through the ``(rollout, seq)`` index), correct but not indexed. Tool names are
matched exactly on ``TrajectoryItem.name`` of ``function_call`` items (index ``item_kind_name``);
failure messages by a case-insensitive substring of ``Rollout.error`` within the run (a scan of the
run's rows: a few hundred thousand short strings at most).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from django.db import connection as default_connection
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.expressions import RawSQL

__all__ = [
    "MAX_TEXT",
    "MIN_INDEXED",
    "ensure_index",
    "filter_error",
    "filter_output",
    "filter_text",
    "filter_tool",
    "item_search_text",
    "normalise_query",
]

# Longest search text kept per item (characters): a multi-megabyte tool output is indexed by its
# first 2,000,000 characters.
MAX_TEXT = 2_000_000
# Queries shorter than this have no trigram and are answered by a scan.
MIN_INDEXED = 3
# A text found in at least this many items is "common": the run's rollouts are walked instead of
# listing every hit from the index (benchmarks/README.md, bench-search).
COMMON_ITEMS = 20_000
SKIPPED_KEYS = frozenset({"type", "id", "status", "role"})
FTS_TABLE = "rollouts_item_fts"
ITEM_TABLE = "rollouts_trajectoryitem"
TRGM_INDEX = "rollouts_item_search_trgm"
OUTPUT_KIND = "function_call_output"
CALL_KIND = "function_call"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    if "\x00" in text:
        text = text.replace("\x00", " ")
    if not text.isascii() and _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    return text


def normalise_query(text: str) -> str:
    """A user's query as the index holds text: lowercased, U+0000 as a space, lone surrogates as
    U+FFFD (``item_search_text``'s rules), so both sides compare alike."""
    return _clean(text).lower()


def _strings(value: Any, out: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        out.append(value)
        stripped = value.lstrip()
        # JSON inside a string (tool arguments, a JSON tool output): its decoded strings too, when
        # decoding changes something (an escaped quote, newline, unicode or U+0000).
        if depth < 4 and "\\" in value and stripped[:1] in ("{", "[", '"'):
            try:
                inner = json.loads(value)
            except (ValueError, RecursionError):
                return
            _strings(inner, out, depth + 1)
    elif isinstance(value, dict):
        for key, inner in value.items():
            if depth == 0 and key in SKIPPED_KEYS:
                continue
            _strings(inner, out, depth)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            _strings(inner, out, depth)


def item_search_text(item: Any) -> str:
    """The searchable text of one trajectory item (a decoded JSON value, usually a dict): its string
    values joined by ``"\\n"``, lowercased, U+0000 as a space, at most ``MAX_TEXT`` characters
    (rules in the module docstring). ``""`` for an item without text."""
    out: list[str] = []
    try:
        _strings(item, out)
    except RecursionError:  # deeper than Python nests: index what was read
        pass
    text = "\n".join(out)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT]
    return normalise_query(text)


def fill_missing(items: Iterable[Any]) -> None:
    """Set ``search_text`` on each unsaved ``TrajectoryItem`` of ``items`` whose text is not set yet
    (``TrajectoryItem``'s manager calls this before every ``bulk_create``)."""
    for item in items:
        if not item.search_text and item.payload is not None:
            item.search_text = item_search_text(item.payload)


# -- the index ---------------------------------------------------------------------------------
def sqlite_has_trigram(connection=default_connection) -> bool:
    """True when this SQLite can build FTS5 trigram tables (3.34 or newer, FTS5 compiled in)."""
    import sqlite3

    return sqlite3.sqlite_version_info >= (3, 34)


def _sqlite_index_present(cursor) -> bool:
    cursor.execute(
        "SELECT name FROM sqlite_master WHERE name IN (%s, %s, %s, %s)",
        [FTS_TABLE, f"{FTS_TABLE}_ai", f"{FTS_TABLE}_ad", f"{FTS_TABLE}_au"],
    )
    return len(cursor.fetchall()) == 4


def fts_available(connection=default_connection) -> bool:
    """True when the FTS5 index exists on this SQLite database (``ensure_index`` made it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s", [FTS_TABLE])
        return cursor.fetchone() is not None


def ensure_index(connection=default_connection) -> str:
    """Create the content-search index of ``connection``'s backend when it is missing, and fill it
    from the items' ``search_text``. Idempotent and cheap when everything is in place.

    SQLite: the FTS5 table and its three triggers; when any was missing (a first install, or a
    later migration that rebuilt ``rollouts_trajectoryitem``, which drops triggers) the table is
    rebuilt from the items. PostgreSQL: ``CREATE EXTENSION pg_trgm`` and the GIN index; where the
    extension cannot be created (no privilege) the search still works, by scanning.
    Returns what it did: ``"present"``, ``"built"``, ``"unavailable"`` or ``"unsupported"``."""
    vendor = connection.vendor
    if vendor == "sqlite":
        if not sqlite_has_trigram(connection):
            return "unavailable"
        with connection.cursor() as cursor:
            if _sqlite_index_present(cursor):
                return "present"
            cursor.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5("
                f"search_text, content='{ITEM_TABLE}', content_rowid='id', tokenize='trigram')"
            )
            cursor.execute(
                f"CREATE TRIGGER IF NOT EXISTS {FTS_TABLE}_ai AFTER INSERT ON {ITEM_TABLE} BEGIN "
                f"INSERT INTO {FTS_TABLE}(rowid, search_text) VALUES (new.id, new.search_text); END"
            )
            cursor.execute(
                f"CREATE TRIGGER IF NOT EXISTS {FTS_TABLE}_ad AFTER DELETE ON {ITEM_TABLE} BEGIN "
                f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, search_text) VALUES ('delete', old.id, old.search_text); END"
            )
            cursor.execute(
                f"CREATE TRIGGER IF NOT EXISTS {FTS_TABLE}_au AFTER UPDATE OF search_text ON {ITEM_TABLE} BEGIN "
                f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, search_text) VALUES ('delete', old.id, old.search_text); "
                f"INSERT INTO {FTS_TABLE}(rowid, search_text) VALUES (new.id, new.search_text); END"
            )
            cursor.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')")
        return "built"
    if vendor == "postgresql":
        from django.db import transaction

        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [TRGM_INDEX])
            if cursor.fetchone():
                return "present"
            try:
                with transaction.atomic(using=connection.alias):
                    cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except Exception:  # no privilege: searches scan instead
                return "unavailable"
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {TRGM_INDEX} ON {ITEM_TABLE} USING gin (search_text gin_trgm_ops)"
            )
        return "built"
    return "unsupported"


# -- the filters -------------------------------------------------------------------------------
def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _fts_phrase(text: str) -> str:
    """``text`` as one FTS5 string: every character literal (``"`` doubled), so ``AND``, ``OR``,
    ``NOT``, ``NEAR(``, ``*``, ``^``, ``:`` and parentheses mean themselves."""
    return '"' + text.replace('"', '""') + '"'


def _index_sql(text: str, kind: str | None) -> tuple[str, list] | None:
    """``(sql, params)`` selecting ``rollout_id`` of the items whose search text contains ``text``
    (normalised) through the backend's index; None when no index serves this query."""
    vendor = default_connection.vendor
    # ``kind || ''``: checked on the text index's hits, never through the (kind, name) index,
    # which PostgreSQL would otherwise AND with them (300,000 entries for the outputs of 100,000
    # rollouts, to keep a few).
    kind_sql, kind_params = (" AND (i.kind || '') = %s", [kind]) if kind else ("", [])
    if len(text) < MIN_INDEXED:
        return None
    if vendor == "sqlite" and sqlite_has_trigram() and fts_available():
        return (
            f"SELECT i.rollout_id FROM {FTS_TABLE} f JOIN {ITEM_TABLE} i ON i.id = f.rowid "
            f"WHERE f.{FTS_TABLE} MATCH %s{kind_sql}",
            [_fts_phrase(text), *kind_params],
        )
    if vendor == "postgresql" and _pg_index_present():
        return (
            f"SELECT i.rollout_id FROM {ITEM_TABLE} i WHERE i.search_text LIKE %s{kind_sql}",
            [_like_pattern(text), *kind_params],
        )
    return None


_PG_INDEX: dict[str, bool] = {}


def _pg_index_present() -> bool:
    key = default_connection.settings_dict.get("NAME") or ""
    if not _PG_INDEX.get(key):
        with default_connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [TRGM_INDEX])
            _PG_INDEX[key] = cursor.fetchone() is not None
    return _PG_INDEX[key]


def _is_common(sql: str, params: list) -> bool:
    """True when the indexed query matches at least ``COMMON_ITEMS`` items (anywhere): then walking
    the run's rollouts and stopping at each one's first hit is cheaper than listing every hit."""
    with default_connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({sql} LIMIT {COMMON_ITEMS}) hits", params)
        return cursor.fetchone()[0] >= COMMON_ITEMS


def _filter_items(qs: QuerySet, text: str, kind: str | None) -> QuerySet:
    from rollouts.models import TrajectoryItem

    needle = normalise_query(text)
    if not needle:
        return qs
    indexed = _index_sql(needle, kind)
    if indexed is not None and not _is_common(*indexed):
        return qs.filter(pk__in=RawSQL(*indexed))
    # A common text (or one the index cannot serve): each rollout of the run is probed through the
    # (rollout, seq) index until its first hit.
    items = TrajectoryItem.objects.filter(rollout=OuterRef("pk"), search_text__contains=needle)
    if kind:
        items = items.filter(kind=kind)
    return qs.filter(Exists(items))


def filter_text(qs: QuerySet, text: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those with an item whose text contains ``text``
    (case-insensitive substring; any characters literal)."""
    return _filter_items(qs, text, None)


def filter_output(qs: QuerySet, text: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those with a tool output (a ``function_call_output`` item)
    containing ``text`` (case-insensitive substring)."""
    return _filter_items(qs, text, OUTPUT_KIND)


def filter_tool(qs: QuerySet, name: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those that called tool ``name`` (a ``function_call`` item of
    that exact name)."""
    from rollouts.models import TrajectoryItem

    return qs.filter(pk__in=TrajectoryItem.objects.filter(kind=CALL_KIND, name=name).values("rollout_id"))


def filter_error(qs: QuerySet, text: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those whose failure message (``Rollout.error``) contains
    ``text``, case-insensitively (on SQLite, ASCII letters only fold, as its ``LIKE`` does)."""
    from rollouts.lossless import encode_text

    # The column holds lossless-encoded text (U+0000 as U+FDD0 "0"): compare encoded with encoded.
    return qs.filter(error__icontains=encode_text(text)) if text else qs
