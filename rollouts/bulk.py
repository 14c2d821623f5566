"""Bulk inserts of model rows that ignore conflicts, as one ``executemany`` of a statement built
once per backend and model: ``insert_ignoring_conflicts``, and ``plain_types``, the value types a
field sends unchanged. Used by the workers' writer and by restoring an archived run."""

from __future__ import annotations

from typing import Any

from django.db import models

__all__ = ["insert_ignoring_conflicts", "plain_types"]

_insert_sql: dict[tuple[str, type], tuple[str, list]] = {}

_PROBES = {int: 7, float: 1.5, bool: True, str: "x"}


def plain_types(field: Any, connection: Any) -> frozenset:
    """The value types whose ``field.get_db_prep_save(value, connection)`` is the value itself,
    so the writer can pass them through without Django's per-value conversion. Only Django's own
    integer, float, boolean, text and foreign-key fields are candidates (lossless and JSON fields
    always convert), and each candidate type is kept only if this backend sends a probe value of
    it unchanged (PostgreSQL's psycopg wraps integers in ``Int4`` and the like: they convert
    there). ``tests/test_dispatch_insert.py`` checks the result against ``get_db_prep_save``."""
    exact = type(field)
    if exact in (
        models.ForeignKey,
        models.IntegerField,
        models.PositiveIntegerField,
        models.PositiveSmallIntegerField,
        models.SmallIntegerField,
        models.BigIntegerField,
    ):
        candidates: tuple[type, ...] = (int,)  # a foreign key to a non-integer key fails the probe below
    elif exact is models.FloatField:
        candidates = (float,)
    elif exact is models.BooleanField:
        candidates = (bool,)
    elif exact in (models.CharField, models.TextField):
        candidates = (str,)
    else:
        return frozenset()
    plain = set()
    for kind in candidates:
        try:
            sent = field.get_db_prep_save(_PROBES[kind], connection)
        except (TypeError, ValueError):
            continue
        if type(sent) is kind and sent == _PROBES[kind]:
            plain.add(kind)
    if plain and field.get_db_prep_save(None, connection) is None:
        plain.add(type(None))
    return frozenset(plain)


def insert_ignoring_conflicts(model: type[models.Model], objs: list) -> None:
    """``model.objects.bulk_create(objs, ignore_conflicts=True)`` as one ``executemany`` of a
    statement built once per backend: the same SQL Django writes (``INSERT OR IGNORE`` on SQLite,
    ``ON CONFLICT DO NOTHING`` on PostgreSQL) and the same values (each field's
    ``get_db_prep_save``, so lossless encoding applies), without compiling the insert for every
    batch (the compiler was most of the writer's CPU). ``objs``: instances of ``model``, or any
    objects with an attribute per concrete field's ``attname`` (the workers' ``CallRow`` and
    ``ItemRow``, cheaper to build). Raises what the database raises."""
    from django.db import connection
    from django.db.models.constants import OnConflict

    key = (connection.vendor, model)
    if key not in _insert_sql:
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        ops, qn = connection.ops, connection.ops.quote_name
        sql = "%s %s (%s) VALUES (%s) %s" % (
            ops.insert_statement(on_conflict=OnConflict.IGNORE),
            qn(model._meta.db_table),
            ", ".join(qn(f.column) for f in fields),
            ", ".join(["%s"] * len(fields)),
            ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, None, None),
        )
        _insert_sql[key] = (sql.rstrip(), [(f, f.attname, plain_types(f, connection)) for f in fields])
    sql, fields = _insert_sql[key]
    params = [
        [
            v if type(v) in plain else f.get_db_prep_save(v, connection)
            for f, attname, plain in fields
            for v in (getattr(obj, attname),)
        ]
        for obj in objs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
