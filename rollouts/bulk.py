"""Bulk inserts of model rows as one ``executemany`` of a statement built once per backend and
model: ``insert_ignoring_conflicts`` (the workers' writer, restoring an archived run),
``insert_from_template`` (a run's pending rollouts, alike but for their keys), and
``plain_types``, the value types a field sends unchanged."""

from __future__ import annotations

from typing import Any

from django.db import models

__all__ = ["insert_from_template", "insert_ignoring_conflicts", "plain_types"]

_insert_sql: dict[tuple, tuple[str, list]] = {}  # (vendor, model[, "plain"]) → statement, fields

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


def insert_from_template(model: type[models.Model], template: models.Model, varying: list[str], values: list) -> None:
    """Insert one ``model`` row per item of ``values``: ``template``'s values for every field (each
    prepared once, as ``bulk_create`` would send it: ``pre_save`` fills ``auto_now_add``), but the
    attnames in ``varying``, taken from the item (a sequence in ``varying``'s order). A plain
    ``INSERT`` as one ``executemany``: what ``bulk_create`` stores, without building an instance
    and compiling every value of every row (most of a 512-row batch's launch). No ids come back.
    Raises what the database raises."""
    from django.db import connection

    key = (connection.vendor, model, "plain")
    if key not in _insert_sql:
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        qn = connection.ops.quote_name
        sql = "INSERT INTO %s (%s) VALUES (%s)" % (
            qn(model._meta.db_table),
            ", ".join(qn(f.column) for f in fields),
            ", ".join(["%s"] * len(fields)),
        )
        _insert_sql[key] = (sql, [(f, f.attname, plain_types(f, connection)) for f in fields])
    sql, fields = _insert_sql[key]
    base = [f.get_db_prep_save(f.pre_save(template, add=True), connection) for f, _attname, _plain in fields]
    at = {attname: i for i, (_f, attname, _plain) in enumerate(fields)}
    slots = [(at[name], fields[at[name]][0], fields[at[name]][2]) for name in varying]
    params = []
    for item in values:
        row = list(base)
        for (i, f, plain), v in zip(slots, item):
            row[i] = v if type(v) in plain else f.get_db_prep_save(v, connection)
        params.append(row)
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
