"""The dispatcher's SQL statements, built once per backend and model (or set of fields) and kept:
the raw insert of many rows ignoring conflicts, and the update that ends a running attempt. They
send the values Django would (each field's ``get_db_prep_save``) without compiling a query for
every batch."""

from __future__ import annotations

from typing import Any

from django.db import models

from rollouts.models import Rollout

__all__ = ["finish_rollout", "insert_ignoring_conflicts", "plain_types"]

_insert_sql: dict[tuple[str, type], tuple[str, list]] = {}
_update_sql: dict[tuple[str, tuple[str, ...]], tuple[str, list]] = {}


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
    batch (issue 14: the compiler was most of the writer's CPU). Raises what the database raises."""
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


def finish_rollout(rollout_id: int, worker: str, fields: dict[str, Any]) -> int:
    """``Rollout.objects.filter(pk=rollout_id, status=RUNNING, worker=worker).update(**fields)``
    with the statement built once per set of field names. Returns the rows updated (0: the lease
    was taken over)."""
    from django.db import connection

    key = (connection.vendor, tuple(fields))
    if key not in _update_sql:
        meta, qn = Rollout._meta, connection.ops.quote_name
        model_fields = [meta.get_field(name) for name in fields]
        sql = "UPDATE %s SET %s WHERE %s = %%s AND %s = %%s AND %s = %%s" % (
            qn(meta.db_table),
            ", ".join(f"{qn(f.column)} = %s" for f in model_fields),
            qn(meta.pk.column),
            qn(meta.get_field("status").column),
            qn(meta.get_field("worker").column),
        )
        _update_sql[key] = (sql, model_fields)
    sql, model_fields = _update_sql[key]
    params = [f.get_db_prep_save(v, connection) for f, v in zip(model_fields, fields.values())]
    params += [rollout_id, Rollout.Status.RUNNING, worker]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
