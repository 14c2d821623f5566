"""The content-search index over ``TrajectoryItem.search_text``, per backend (``ensure_index``, run
by migration 0013 and after every ``migrate``):

- SQLite (>= 3.34): an FTS5 table ``rollouts_item_fts`` with the ``trigram`` tokenizer over the
  items' ``search_text`` (external content: the text is not stored twice), kept in step by
  triggers on ``rollouts_trajectoryitem``.
- PostgreSQL: a GIN index with ``pg_trgm``'s ``gin_trgm_ops`` on ``search_text``.

Raw SQL on the table names; no models.
"""

from __future__ import annotations

from django.db import connection as default_connection

__all__ = ["FTS_TABLE", "ITEM_TABLE", "TRGM_INDEX", "ensure_index", "fts_available", "pg_index_present"]

FTS_TABLE = "rollouts_item_fts"
ITEM_TABLE = "rollouts_trajectoryitem"
TRGM_INDEX = "rollouts_item_search_trgm"


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
                f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, search_text) "
                "VALUES ('delete', old.id, old.search_text); END"
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


_PG_INDEX: dict[str, bool] = {}


def pg_index_present() -> bool:
    """True when the pg_trgm index exists on the default PostgreSQL database (cached once found)."""
    key = default_connection.settings_dict.get("NAME") or ""
    if not _PG_INDEX.get(key):
        with default_connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [TRGM_INDEX])
            _PG_INDEX[key] = cursor.fetchone() is not None
    return _PG_INDEX[key]
