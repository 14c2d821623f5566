"""The dispatcher's update that ends a running attempt, built once per set of fields and kept. It
sends the values Django would (each field's ``get_db_prep_save``) without compiling a query for
every batch. The raw insert of many rows is ``rollouts.bulk``."""

from __future__ import annotations

from typing import Any

from rollouts.models import Rollout

__all__ = ["finish_rollout", "finish_rollouts"]

_update_sql: dict[tuple[str, tuple[str, ...]], tuple[str, list]] = {}


def _statement(connection: Any, fields: dict[str, Any]) -> tuple[str, list]:
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
    return _update_sql[key]


def _params(connection: Any, model_fields: list, rollout_id: int, worker: str, fields: dict[str, Any]) -> list:
    params = [f.get_db_prep_save(v, connection) for f, v in zip(model_fields, fields.values())]
    return [*params, rollout_id, Rollout.Status.RUNNING, worker]


def finish_rollout(rollout_id: int, worker: str, fields: dict[str, Any]) -> int:
    """``Rollout.objects.filter(pk=rollout_id, status=RUNNING, worker=worker).update(**fields)``
    with the statement built once per set of field names. Returns the rows updated (0: the lease
    was taken over)."""
    from django.db import connection

    sql, model_fields = _statement(connection, fields)
    with connection.cursor() as cursor:
        cursor.execute(sql, _params(connection, model_fields, rollout_id, worker, fields))
        return cursor.rowcount


def finish_rollouts(worker: str, ends: list[tuple[int, dict[str, Any]]]) -> bool:
    """``finish_rollout`` of every ``(rollout_id, fields)`` of ``ends`` (all with the same field
    names, in that order) as one ``executemany``: one trip to the database instead of one a
    rollout. All or nothing: True when every rollout was updated; when a lease was taken over (a
    row not updated) the updates are undone (a savepoint) and False says to call
    ``finish_rollout`` one by one. Call inside a transaction."""
    from django.db import connection, transaction

    sql, model_fields = _statement(connection, ends[0][1])
    rows = [_params(connection, model_fields, rollout_id, worker, fields) for rollout_id, fields in ends]
    sid = transaction.savepoint()
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)
        updated = cursor.rowcount
    if updated == len(ends):
        transaction.savepoint_commit(sid)
        return True
    transaction.savepoint_rollback(sid)
    return False
