"""A run's task and verify fields kept as rows (``FieldValue``), so the run table's sorts and filters
on a field read a narrow indexed table instead of every row's stored JSON text.

The values of one (run, field) are extracted once, in SQL with the very expressions the table reads
otherwise (``columns.FieldNumber``/``FieldText``), so a sort or filter gives the same rows in the
same order either way; ``ensure`` is called before a field is sorted or filtered on: the first
time, that request extracts the field when the run is small (``INLINE_ROWS``), else a worker does
(``extract_later``) and the request reads the JSON text as before; ``prepare_run`` extracts a run's
discovered fields ahead (benchmarks, an operator's shell).
Nothing on the collection write path writes here: a run's later results (a running run, a retry)
are added when the field is next read, found by ``Rollout.result_seq`` past the extract's mark
(a higher number always commits later); tasks never change once stored, so a task field adds tasks
past its mark. ``forget`` drops a run's extracts where its stored replies change in place (archive,
restore).

- SQLite: ``number`` is the value as a number (numbers, booleans as 1/0), ``text`` the value's
  ``json_extract`` text for any other value, so ``(number, text)`` orders as the JSON value does.
- PostgreSQL: ``number`` as above, ``text`` the value as text (``#>>``) for every value.
- Both: a NUL in a value reads as U+FFFD (``lossless.readable_json``), as in the table's columns.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, FilteredRelation, Max, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Collate, NullIf

from rollouts.lossless import readable_json
from rollouts.models import FieldExtract, FieldValue, Rollout, Run, forget_field_values
from rollouts.review import columns

__all__ = [
    "CHUNK",
    "INLINE_ROWS",
    "PREPARE_FIELDS",
    "ensure",
    "extract",
    "extract_later",
    "forget",
    "kept_expressions",
    "prepare_run",
    "sort_head",
    "sort_terms",
    "text_of_strings",
]

CHUNK = 5_000  # rows read per insert (each its own short transaction)
PREPARE_FIELDS = 24  # a run's discovered fields extracted ahead by ``prepare_run``
# Rows a page request extracts itself (well under a second); past it a worker extracts them and the
# request reads the JSON text meanwhile, as without kept values.
INLINE_ROWS = 20_000
QUEUED_S = 600


def _mark(run_id: int, source: str) -> int:
    """The run's newest result number (verify) or rollout id (task): 0 when there is none."""
    if source == "verify":
        qs = Rollout.objects.filter(run_id=run_id, result_seq__isnull=False).order_by("-result_seq")
        return qs.values_list("result_seq", flat=True).first() or 0
    return Rollout.objects.filter(run_id=run_id).aggregate(m=Max("id"))["m"] or 0


def _select(qs: QuerySet, column: str, keys: list[str]) -> tuple[str, list]:
    """``SELECT id, number, text`` of ``qs``'s rows whose value is not missing or null."""
    if connection.vendor == "postgresql":
        return _select_postgresql(qs, column, keys)
    number = columns.FieldNumber(column, keys)
    text = columns.FieldText(column, keys)
    inner = qs.annotate(_n=number, _t=text).values_list("id", "_n", "_t")
    sql, params = inner.query.sql_with_params()
    pick = "s._n, CASE WHEN s._n IS NULL THEN s._t END"  # SQLite parses a row's JSON once (its cache)
    return f"SELECT %s, %s, s.id, {pick} FROM ({sql}) s WHERE s._n IS NOT NULL OR s._t IS NOT NULL", list(params)


def _select_postgresql(qs: QuerySet, column: str, keys: list[str]) -> tuple[str, list]:
    """PostgreSQL: ``columns.FieldNumber``/``FieldText`` of the value node read once per row (the
    ``OFFSET 0`` keeps the planner from inlining it into each use: one detoast and parse a row),
    through ``lossless.readable_json`` as they are."""
    inner = qs.annotate(_c=NullIf(F(column), Value(""), output_field=TextField())).values_list("id", "_c")
    sql, params = inner.query.sql_with_params()
    node = f"(({readable_json('i._c', 'postgresql')})::json #> %s)"
    number = (
        "CASE json_typeof(s.v) WHEN 'number' THEN (s.v #>> '{}')::double precision "
        "WHEN 'boolean' THEN (CASE WHEN (s.v #>> '{}') = 'true' THEN 1.0 ELSE 0.0 END) END"
    )
    select = (
        f"SELECT %s, %s, s.id, {number}, s.v #>> '{{}}' "
        f"FROM (SELECT i.id, {node} AS v FROM ({sql}) i OFFSET 0) s WHERE s.v #>> '{{}}' IS NOT NULL"
    )
    return select, [keys, *params]


def _insert(run_id: int, name: str, qs: QuerySet, column: str, keys: list[str]) -> int:
    select, params = _select(qs, column, keys)
    table = FieldValue._meta.db_table
    cols = 'run_id, field, rollout_id, number, "text"'
    if connection.vendor == "sqlite":
        sql = f"INSERT OR IGNORE INTO {table} ({cols}) {select}"
    else:
        sql = f"INSERT INTO {table} ({cols}) {select} ON CONFLICT DO NOTHING"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [run_id, name, *params])
        return cursor.rowcount


def _extract(run_id: int, name: str, source: str, keys: list[str], after: int, upto: int) -> None:
    """Insert the values of the run's rollouts past ``after`` up to ``upto`` (result numbers for a
    verify field, ``after`` 0 meaning every row, numbered or not; rollout ids for a task field),
    ``CHUNK`` rows per transaction."""
    base = Rollout.objects.filter(run_id=run_id)  # rows without a value are left out by ``_select``
    if source == "task":
        base, column = base.filter(id__gt=after, id__lte=upto), "task__row_json"
    else:
        column = "verify_json"
        base = base.filter(result_seq__gt=after, result_seq__lte=upto) if after else base
    ids = list(base.order_by("id").values_list("id", flat=True))
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        _insert(run_id, name, base.filter(id__gte=chunk[0], id__lte=chunk[-1]), column, keys)


def ensure(run: Run, name: str) -> bool:
    """Make field ``name``'s kept values of ``run`` current (extracting them the first time, and a
    verify field's values of results finished since); True when the table may read them, False for
    a name that is not a field, or while more than ``INLINE_ROWS`` rows wait to be extracted: those
    are extracted by a background task (``extract_later``) and this request reads the JSON text."""
    parsed = columns.parse_field(name)
    if parsed is None:
        return False
    source, keys = parsed
    mark = _mark(run.pk, source)
    ext = FieldExtract.objects.filter(run=run, field=name).first()
    have = (ext.upto_seq if source == "verify" else ext.upto_id) if ext is not None else None
    if have is not None and have >= mark:
        return True
    waiting = Rollout.objects.filter(run=run).count() if ext is None else mark - (have or 0)
    if waiting > INLINE_ROWS and not settings.GYMWEB_TASKS_INLINE:
        extract_later(run.pk, name)
        return False
    _catch_up(run, name, ext)
    return True


def _catch_up(run: Run, name: str, ext: FieldExtract | None) -> None:
    """Extract ``name``'s values of ``run`` past the extract's mark (all of them without one)."""
    source, keys = columns.parse_field(name)  # type: ignore[misc]
    mark = _mark(run.pk, source)
    column = "upto_seq" if source == "verify" else "upto_id"
    if ext is None:
        _extract(run.pk, name, source, keys, 0, mark)
        if connection.vendor == "postgresql":  # the planner's row counts of the new values, at once
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {FieldValue._meta.db_table}")
        try:
            with transaction.atomic():
                FieldExtract.objects.create(run=run, field=name, **{column: mark})
        except IntegrityError:  # another request made it meanwhile
            pass
        return
    have = getattr(ext, column) or 0
    _extract(run.pk, name, source, keys, have, mark)
    FieldExtract.objects.filter(pk=ext.pk, **{f"{column}__lt": mark}).update(**{column: mark})


def _queued_key(run_id: int, name: str) -> str:
    return f"gymweb:field-extract:{run_id}:{name}"


def extract_later(run_id: int, name: str) -> None:
    """Queue ``extract(run_id, name)`` for a worker, once per (run, field) while it waits (the cache
    remembers it for ``QUEUED_S``; a cache that is down queues again, and the extract is idempotent)."""
    if cache.add(_queued_key(run_id, name), 1, timeout=QUEUED_S):
        from django_q.tasks import async_task

        async_task("rollouts.review.field_values.extract", run_id, name, task_name=f"run-{run_id}-field-values")


def extract(run_id: int, name: str) -> str:
    """The background task of ``extract_later``: bring field ``name`` of run ``run_id`` up to date.
    Returns what it did (django-q keeps it as the task's result)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or columns.parse_field(name) is None:
        return f"run {run_id}: nothing to extract for {name!r}"
    _catch_up(run, name, FieldExtract.objects.filter(run=run, field=name).first())
    cache.delete(_queued_key(run_id, name))
    return f"run {run_id}: {name} kept"


def forget(run_id: int) -> None:
    """Drop run ``run_id``'s kept values (``models.forget_field_values``, in one transaction)."""
    with transaction.atomic():
        forget_field_values(run_id)


def prepare_run(run_id: int) -> str:
    """Extract ahead run ``run_id``'s first ``PREPARE_FIELDS`` discovered fields (``columns.discover``),
    so the first sort or filter on them reads kept values. Returns what it did."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return f"run {run_id} is gone"
    found = columns.discover(Rollout.objects.filter(run=run), imported=run.status == Run.Status.IMPORTED)
    names = [f.name for f in found][:PREPARE_FIELDS]
    for name in names:
        ensure(run, name)
    return f"run {run_id}: {len(names)} field(s) kept"


def kept_expressions(qs: QuerySet, run_id: int, name: str) -> tuple[QuerySet, F, F]:
    """``qs`` (rollouts of run ``run_id``) joined to field ``name``'s kept values (once, however often
    asked) and ``(number, text)`` expressions of them (NULL where the value is missing).
    PostgreSQL: the join names the run, so a hash join reads that (run, field)'s rows from the
    (run, field, number) index, not every kept value of the field name (all runs, all fields);
    SQLite joins row by row on (rollout, field), and naming the run there makes its planner start
    from the number index and sort where it would walk the task order and stop at the page."""
    relation = "field_values"
    alias = "_kv_" + re.sub(r"\W", "_", name)
    if alias not in qs.query._filtered_relations:
        condition = Q(**{f"{relation}__field": name})
        if connection.vendor == "postgresql":
            condition &= Q(**{f"{relation}__run_id": run_id})
        qs = qs.alias(**{alias: FilteredRelation(relation, condition=condition)})
    return qs, F(f"{alias}__number"), F(f"{alias}__text")


def filter_field(qs: QuerySet, run_id: int, name: str, value: str) -> QuerySet:
    """``columns.filter_field`` on the kept values of run ``run_id`` (``qs``: its rollouts): a number
    range on ``number``, else equality with ``text`` (a quoted value: with the ``text`` of a string)."""
    if not value.strip():
        return qs
    qs, number, text = kept_expressions(qs, run_id, name)
    literal = columns.literal_text(value)
    if literal is not None:  # a string value only (PostgreSQL keeps a number's text too)
        return qs.filter(**{text.name: literal, f"{number.name}__isnull": True})
    bounds = columns.parse_range(value)
    if bounds is None:
        return qs.filter(**{f"{text.name}": value})
    lo, hi = bounds
    limits = {f"{number.name}__gte": lo, f"{number.name}__lte": hi}
    # One filter() call: a second one on the joined values would join them again.
    return qs.filter(**{k: v for k, v in limits.items() if v is not None})


def text_of_strings(qs: QuerySet, number, text):
    """The sort term of a field's texts (``number``/``text``: its expressions on ``qs``): ``text``
    where ``number`` is NULL (PostgreSQL's text of the number 1 is ``"1"``, which would order equal
    numbers by their spelling; SQLite keeps none), compared by code point on both backends
    (PostgreSQL: ``COLLATE "C"``, whatever the database's collation; SQLite's is binary UTF-8)."""
    only = Case(When(Q(**{f"{number.name}__isnull": True}), then=text), output_field=TextField())
    return Collate(only, "C") if connection.vendor == "postgresql" else only


def sort_terms(qs: QuerySet, run_id: int, name: str, desc: bool) -> tuple[QuerySet, tuple]:
    """``qs`` (rollouts of run ``run_id``) and the primary sort terms of field ``name`` on its kept
    values, in the order the JSON value sorts (``RolloutFilterForm.order``), the same on both
    backends and both ways: numbers (booleans as 1/0) first, then texts (by code point), then
    missing values (docs/trajectory.md)."""
    qs, number, text = kept_expressions(qs, run_id, name)
    alias = "_sort_kvt_" + re.sub(r"\W", "_", name)
    qs = qs.alias(**{alias: text_of_strings(qs, number, text)})
    if not desc:
        return qs, (number.asc(nulls_last=True), F(alias).asc(nulls_last=True))
    return qs, (number.desc(nulls_last=True), F(alias).desc(nulls_last=True))


def sort_head(qs: QuerySet, run_id: int, name: str, desc: bool, then: tuple = ()) -> QuerySet | None:
    """The head of ``sort_terms``'s order where it starts with the numbers: ``qs`` (rollouts of run
    ``run_id``) restricted to rows whose kept ``number`` is set, in the same order, its first term
    written as the (run, field, number) index reads (descending: nulls first, none being left),
    so the database walks the index and stops at the page instead of joining and sorting every
    value. Rows without a number sort after all of these, so any slice of this that comes back
    full is the same slice of the whole order. PostgreSQL only (None on SQLite: its planner
    reaches the kept values row by row, and there the head of a text field, which holds no number,
    probed every row before the whole order was read). ``then``: the terms after the field's
    (``sort_terms`` leaves them to the caller)."""
    if connection.vendor != "postgresql":
        return None
    qs, terms = sort_terms(qs, run_id, name, desc)
    _, number, _ = kept_expressions(qs, run_id, name)
    first = number.desc(nulls_first=True) if desc else number.asc(nulls_last=True)
    return qs.filter(**{f"{number.name}__isnull": False}).order_by(first, *terms[1:], *then)
