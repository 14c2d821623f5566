"""The run page's content-search filters on a queryset of rollouts: a text in any item, a tool
called, a tool output holding a text, a failure message holding a text.

On SQLite a search is a quoted FTS5 phrase, i.e. a case-insensitive substring match; FTS operators
(``AND``, ``*``, ``NEAR(``, quotes) in the query are literal text. On PostgreSQL it is
``search_text LIKE '%<lowercased, escaped>%'``, which the pg_trgm index serves (``index``).

A query shorter than 3 characters has no trigram; it is answered by a scan of the run's items (each
rollout probed through the ``(rollout, seq)`` index), correct but not indexed. Tool names are
matched exactly on ``TrajectoryItem.name`` of ``function_call`` items (index ``item_kind_name``);
failure messages by a case-insensitive substring of ``Rollout.error`` within the run (a scan of the
run's rows: a few hundred thousand short strings at most).
"""

from __future__ import annotations

import json

from django.db import connection as default_connection
from django.db.models import BooleanField, Exists, F, Func, OuterRef, Q, QuerySet
from django.db.models.expressions import RawSQL

from rollouts.lossless import encode_text, readable_json
from rollouts.models import TrajectoryItem
from rollouts.search.index import FTS_TABLE, ITEM_TABLE, fts_available, pg_index_present, sqlite_has_trigram
from rollouts.search.text import normalise_query

__all__ = ["MIN_INDEXED", "filter_error", "filter_output", "filter_text", "filter_tool"]

# Queries shorter than this have no trigram and are answered by a scan.
MIN_INDEXED = 3
# A text found in at least this many items is "common": the run's rollouts are walked instead of
# listing every hit from the index (benchmarks/README.md, bench-search).
COMMON_ITEMS = 20_000
OUTPUT_KIND = "function_call_output"
CALL_KIND = "function_call"


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
    if vendor == "postgresql" and pg_index_present():
        return (
            f"SELECT i.rollout_id FROM {ITEM_TABLE} i WHERE i.search_text LIKE %s{kind_sql}",
            [_like_pattern(text), *kind_params],
        )
    return None


def _is_common(sql: str, params: list) -> bool:
    """True when the indexed query matches at least ``COMMON_ITEMS`` items (anywhere): then walking
    the run's rollouts and stopping at each one's first hit is cheaper than listing every hit."""
    with default_connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({sql} LIMIT {COMMON_ITEMS}) hits", params)
        return cursor.fetchone()[0] >= COMMON_ITEMS


def _items_condition(needle: str, kind: str | None) -> Q:
    """Rollouts with an item (of ``kind``) whose search text holds ``needle`` (normalised)."""
    indexed = _index_sql(needle, kind)
    if indexed is not None and not _is_common(*indexed):
        return Q(pk__in=RawSQL(*indexed))
    # A common text (or one the index cannot serve): each rollout of the run is probed through the
    # (rollout, seq) index until its first hit.
    items = TrajectoryItem.objects.filter(rollout=OuterRef("pk"), search_text__contains=needle)
    if kind:
        items = items.filter(kind=kind)
    return Q(Exists(items))


def _filter_items(qs: QuerySet, text: str, kind: str | None) -> QuerySet:
    needle = normalise_query(text)
    if not needle:
        return qs
    return qs.filter(_items_condition(needle, kind))


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class JsonStringHolds(Func):
    """True when a string value of the JSON text column holds ``needle`` (case-insensitive; any
    characters literal); keys never match, nor gymweb's ``agent_ref`` stamp, nor (on SQLite) the
    values of the structural keys the item index leaves out (``type``, ``id``, ``status``,
    ``role``). A blank column is false.

    SQLite: a ``LIKE`` on the raw text picks the candidates (one read of the text), then
    ``json_tree`` walks only those. PostgreSQL: ``jsonb_path_exists`` with a literal ``like_regex``
    (the text cast through ``jsonb`` with its ``\\u0000`` and lone surrogate escapes made U+FFFD, which
    jsonb refuses)."""

    output_field = BooleanField()
    arity = 1

    def __init__(self, column: str, needle: str):
        self.needle = needle
        super().__init__(F(column))

    def as_sqlite(self, compiler, connection, **extra):
        col, params = compiler.compile(self.source_expressions[0])
        raw = "%" + _like_escaped(json.dumps(self.needle, ensure_ascii=False)[1:-1]) + "%"
        value = "%" + _like_escaped(self.needle) + "%"
        sql = (
            f"({col} LIKE %s ESCAPE '\\' AND EXISTS (SELECT 1 FROM json_tree(NULLIF({col}, '')) j "
            f"WHERE j.type = 'text' AND (j.key IS NULL OR j.key NOT IN ('type', 'id', 'status', 'role')) "
            f"AND substr(j.fullkey, 1, 11) <> '$.agent_ref' AND substr(j.fullkey, 1, 13) <> '$.\"agent_ref\"' "
            f"AND j.value LIKE %s ESCAPE '\\'))"
        )
        return sql, [*params, raw, *params, value]

    def as_postgresql(self, compiler, connection, **extra):
        col, params = compiler.compile(self.source_expressions[0])
        literal = json.dumps(self.needle, ensure_ascii=True)
        path = f'strict $.** ? (@.type() == "string" && @ like_regex {literal} flag "iq")'
        # jsonb refuses ``\\u0000`` and a lone surrogate escape (``\\ud800``), which lossless JSON
        # text may hold: both are read as U+FFFD for the search (``readable_json``).
        readable = readable_json(col, "postgresql")
        as_jsonb = f"({readable}::jsonb - 'agent_ref')"
        sql = f"(NULLIF({col}, '') IS NOT NULL AND jsonb_path_exists({as_jsonb}, %s::jsonpath))"
        return sql, [*params, *params * readable.count(col), path]


def filter_text(qs: QuerySet, text: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those with an item whose text contains ``text``, or with a
    string value of the env's verify reply (``verify_json``) or of the task row (``Task.row_json``)
    that does (case-insensitive substring; any characters literal). The items go through the
    index; the verify reply and the task row are read row by row (``JsonStringHolds``)."""
    needle = normalise_query(text)
    if not needle:
        return qs
    return qs.filter(
        _items_condition(needle, None)
        | Q(JsonStringHolds("verify_json", text))
        | Q(JsonStringHolds("task__row_json", text))
    )


def filter_output(qs: QuerySet, text: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those with a tool output (a ``function_call_output`` item)
    containing ``text`` (case-insensitive substring)."""
    return _filter_items(qs, text, OUTPUT_KIND)


def filter_tool(qs: QuerySet, name: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those that called tool ``name`` (a ``function_call`` item of
    that exact name)."""
    return qs.filter(pk__in=TrajectoryItem.objects.filter(kind=CALL_KIND, name=name).values("rollout_id"))


def filter_error(qs: QuerySet, text: str) -> QuerySet:
    """``qs`` (rollouts) restricted to those whose failure message (``Rollout.error``) contains
    ``text``, case-insensitively (on SQLite, ASCII letters only fold, as its ``LIKE`` does)."""
    # The column holds lossless-encoded text (U+0000 as U+FDD0 "0"): compare encoded with encoded.
    return qs.filter(error__icontains=encode_text(text)) if text else qs
