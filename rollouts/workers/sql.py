"""The dispatcher's update that ends a running attempt, built once per set of fields and kept. It
sends the values Django would (each field's ``get_db_prep_save``) without compiling a query for
every batch. The raw insert of many rows is ``rollouts.bulk``."""

from __future__ import annotations

from typing import Any

from rollouts.models import Rollout

__all__ = ["finish_rollout"]

_update_sql: dict[tuple[str, tuple[str, ...]], tuple[str, list]] = {}


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
