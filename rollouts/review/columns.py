"""Task and verify fields as run-table columns: names, discovery, SQL expressions, filters.

A field is ``task.<path>`` (a scalar of the task row, ``Task.row_json``) or ``verify.<path>`` (a
scalar of the env's /verify reply, ``Rollout.verify_json``); ``<path>`` is the dotted key path
(``verify.reward_components.correctness``). Both columns hold JSON text, so values are read in SQL:
SQLite's ``json_extract``/``json_type``, PostgreSQL's ``json`` operators (``#>``, ``#>>``,
``json_typeof``), on the text as ``lossless.readable_json`` gives it (a NUL reads as U+FFFD on both,
a lone surrogate too on PostgreSQL). A blank column (a failure has no verify reply) reads as NULL.

- ``FieldText``: the value as SQL (SQLite: its JSON type; PostgreSQL: text), for display and for
  string filters (``?f.task.category=math``: equality with the value as text; a quoted value,
  ``?f.task.id="nan"``, is always text, matched against string values only).
- ``FieldNumber``: numbers and booleans (``true`` 1, ``false`` 0) as a float, NULL otherwise, for
  ranges (``?f.verify.score=0.5..1``, ``..1``, ``0.5..``, ``1``) and sorting.
- ``discover``: the fields of a run, from a bounded sample of its rows, with their types.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from django.db.models import F, FloatField, Func, QuerySet, TextField

from rollouts.lossless import readable_json

__all__ = [
    "FIELD_RE",
    "MAX_COLUMNS",
    "FieldInfo",
    "FieldNumber",
    "FieldText",
    "discover",
    "field_expressions",
    "literal_text",
    "parse_columns",
    "parse_range",
    "range_problem",
    "scalar_leaves",
]

MAX_COLUMNS = 20  # chosen columns read per request
PREVIEWS = {"prompt": "prompt", "answer": "final answer"}  # preview columns, chosen like fields
SAMPLE_ROWS = 200  # rows read to discover a run's fields
MAX_DEPTH = 4  # nested objects opened for field names
MAX_FIELDS = 200  # fields listed per source
MAX_STRING = 200  # a longer (or multi-line) string is a text, not a column value
FIELD_RE = re.compile(r"^(task|verify)\.([A-Za-z0-9_\-:@$ ]{1,80}(?:\.[A-Za-z0-9_\-:@$ ]{1,80}){0,5})$")
SKIP_VERIFY = frozenset({"response", "responses_create_params", "agent_ref"})
SKIP_TASK = frozenset({"responses_create_params", "agent_ref"})
SOURCES = {"task": "task__row_json", "verify": "verify_json"}


def parse_field(name: str) -> tuple[str, list[str]] | None:
    """``"verify.a.b"`` → ``("verify", ["a", "b"])``; None for a name that is not a field."""
    match = FIELD_RE.match(name or "")
    if not match:
        return None
    return match.group(1), match.group(2).split(".")


def parse_columns(values: list[str]) -> list[str]:
    """The chosen columns from ``?cols=`` values (comma-separated, repeated or both): valid field
    names and the previews (``prompt``, ``answer``), first occurrence kept, at most ``MAX_COLUMNS``."""
    out: list[str] = []
    for value in values:
        for name in str(value).split(","):
            name = name.strip()
            if (parse_field(name) or name in PREVIEWS) and name not in out:
                out.append(name)
    return out[:MAX_COLUMNS]


def literal_text(text: str) -> str | None:
    """The text a quoted field filter matches: ``'"nan"'`` → ``"nan"``, ``'"1..0"'`` → ``"1..0"``,
    ``'""'`` → ``""`` (one pair of double quotes around the whole value is taken off, whatever is
    inside kept as typed, quotes and spaces included); None for a value that is not quoted, which
    reads as a number range (``parse_range``) when it can, else as text."""
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else None


def parse_range(text: str) -> tuple[float | None, float | None] | None:
    """A number filter: ``"0.5..1"`` → (0.5, 1.0), ``"..1"``, ``"0.5.."``, ``"1"`` → (1, 1),
    ``"true"``/``"false"`` → (1, 1)/(0, 0); None when ``text`` is not a number or range."""
    text = text.strip().lower()
    if text in ("true", "false"):
        v = 1.0 if text == "true" else 0.0
        return v, v
    low, sep, high = text.partition("..")
    try:
        lo = float(low) if low.strip() else None
        hi = float(high) if high.strip() else None
    except ValueError:
        return None
    if not sep:
        return (lo, lo) if lo is not None else None
    if lo is None and hi is None:
        return None
    return lo, hi


def range_problem(text: str) -> str | None:
    """Why the number filter ``text`` can match nothing (``".."``, a bound that is NaN or infinite
    such as ``1e400``, a low end above the high end), or None when it is fine or not a number
    (a text filter, quoted or not)."""
    if literal_text(text) is not None:
        return None
    if text.strip() == "..":
        return "a range needs at least one bound (e.g. 0.5..1, ..1 or 0.5..)"
    bounds = parse_range(text)
    if bounds is None:
        return None
    lo, hi = bounds
    if any(b is not None and not math.isfinite(b) for b in bounds):
        return "Enter a finite number (not NaN or infinity)."
    if lo is not None and hi is not None and lo > hi:
        return f"the low end {lo:g} is above the high end {hi:g}"
    return None


def _sqlite_path(keys: list[str]) -> str:
    return "$" + "".join('."' + k.replace('"', '""') + '"' for k in keys)


class _Field(Func):
    """Base: one JSON text column (``F("verify_json")`` or ``F("task__row_json")``) and a key path,
    read through ``lossless.readable_json``."""

    arity = 1

    def __init__(self, column: str, keys: list[str], **extra: Any):
        self.keys = list(keys)
        super().__init__(F(column), **extra)

    def _column_sql(self, compiler, connection):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"NULLIF({readable_json(sql, connection.vendor)}, '')", list(params) * 3


class FieldText(_Field):
    """A field's value: SQLite ``json_extract`` (its JSON type), PostgreSQL the text (``#>>``)."""

    output_field = TextField()

    def as_sqlite(self, compiler, connection, **extra):
        col, params = self._column_sql(compiler, connection)
        return f"json_extract({col}, %s)", [*params, _sqlite_path(self.keys)]

    def as_postgresql(self, compiler, connection, **extra):
        col, params = self._column_sql(compiler, connection)
        return f"(({col})::json #>> %s)", [*params, self.keys]

    def as_sql(self, compiler, connection, **extra):  # other backends: not supported
        raise NotImplementedError(f"task/verify fields need SQLite or PostgreSQL, not {connection.vendor}")


class FieldNumber(_Field):
    """A field as a number: JSON numbers, ``true`` as 1 and ``false`` as 0; NULL otherwise."""

    output_field = FloatField()

    def as_sqlite(self, compiler, connection, **extra):
        col, params = self._column_sql(compiler, connection)
        path = _sqlite_path(self.keys)
        sql = (
            f"(CASE json_type({col}, %s) WHEN 'integer' THEN json_extract({col}, %s) "
            f"WHEN 'real' THEN json_extract({col}, %s) WHEN 'true' THEN 1.0 WHEN 'false' THEN 0.0 END)"
        )
        return sql, [*params, path, *params, path, *params, path]

    def as_postgresql(self, compiler, connection, **extra):
        col, params = self._column_sql(compiler, connection)
        node = f"(({col})::json #> %s)"
        sql = (
            f"(CASE json_typeof({node}) WHEN 'number' THEN ({node} #>> '{{}}')::double precision "
            f"WHEN 'boolean' THEN (CASE WHEN ({node} #>> '{{}}') = 'true' THEN 1.0 ELSE 0.0 END) END)"
        )
        return sql, [*params, self.keys, *params, self.keys, *params, self.keys]  # ``node`` three times

    def as_sql(self, compiler, connection, **extra):
        raise NotImplementedError(f"task/verify fields need SQLite or PostgreSQL, not {connection.vendor}")


def field_expressions(name: str) -> tuple[FieldText, FieldNumber] | None:
    """``(text, number)`` expressions of field ``name`` on a queryset of rollouts; None when
    ``name`` is not a field."""
    parsed = parse_field(name)
    if parsed is None:
        return None
    source, keys = parsed
    return FieldText(SOURCES[source], keys), FieldNumber(SOURCES[source], keys)


def filter_field(qs: QuerySet, name: str, value: str) -> QuerySet:
    """``qs`` restricted by one field filter: a quoted value (``literal_text``: ``?f.task.id="1..0"``)
    is equality with a string value (never a number's or a boolean's text); else a number range
    (``parse_range``) on the numeric value; else equality of the value as text (a string field,
    ``?f.task.category=math``)."""
    exprs = field_expressions(name)
    if exprs is None or not value.strip():
        return qs
    text, number = exprs
    alias = "_f_" + re.sub(r"\W", "_", name)
    literal = literal_text(value)
    if literal is not None:
        # PostgreSQL's text of the number 1 is "1": only rows without a number are strings
        qs = qs.alias(**{alias: text, alias + "_n": number})
        return qs.filter(**{alias: literal, f"{alias}_n__isnull": True})
    bounds = parse_range(value)
    if bounds is not None:
        qs = qs.alias(**{alias: number})
        lo, hi = bounds
        if lo is not None:
            qs = qs.filter(**{f"{alias}__gte": lo})
        if hi is not None:
            qs = qs.filter(**{f"{alias}__lte": hi})
        return qs
    return qs.alias(**{alias: text}).filter(**{alias: value})


# -- discovery -----------------------------------------------------------------------------------
@dataclass
class FieldInfo:
    """One discovered field: ``name`` (``verify.resolved``), ``type`` (``number``, ``bool``,
    ``string``, or ``mixed``), ``seen`` (rows of the sample holding it)."""

    name: str
    type: str
    seen: int

    @property
    def source(self) -> str:
        return self.name.partition(".")[0]

    @property
    def label(self) -> str:
        return self.name.partition(".")[2]


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str) and len(value) <= MAX_STRING and "\n" not in value:
        return "string"
    return None


def scalar_leaves(value: Any, prefix: str = "", depth: int = 0, skip: frozenset = frozenset()):
    """``(dotted path, scalar)`` of the scalar leaves of a JSON object (numbers, booleans, short
    one-line strings), objects opened up to ``MAX_DEPTH`` levels; lists are not opened. Keys that
    ``FIELD_RE`` cannot name, ``_ng_*`` keys and ``skip`` (at the top) are left out."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        if not isinstance(key, str) or (depth == 0 and (key in skip or key.startswith("_ng_"))):
            continue
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(item, dict):
            if depth + 1 < MAX_DEPTH:
                yield from scalar_leaves(item, path, depth + 1)
        elif _kind(item) is not None:
            yield path, item


def discover(qs: QuerySet, sample: int = SAMPLE_ROWS, imported: bool = False) -> list[FieldInfo]:
    """The task and verify fields of ``qs`` (a run's rollouts), read from its first ``sample``
    succeeded rows (any rows when none succeeded) and their tasks: task fields first, each source
    in the order first seen, at most ``MAX_FIELDS`` per source. A field both rows hold with the
    same value on every sampled row is listed once: as a task field (the env echoed the task row),
    or for an ``imported`` run (whose task row is the imported result row) as a verify field."""
    rows = list(qs.filter(status="succeeded").order_by("id").values_list("verify_json", "task__row_json")[:sample])
    if not rows:
        rows = list(qs.order_by("id").values_list("verify_json", "task__row_json")[:sample])
    found: dict[str, dict[str, Any]] = {}
    echoed: dict[str, bool] = {}
    for verify_text, task_text in rows:
        task = _loads(task_text)
        verify = _loads(verify_text)
        for path, value in scalar_leaves(task, skip=SKIP_TASK):
            _note(found, "task." + path, value)
        for path, value in scalar_leaves(verify, skip=SKIP_VERIFY | {"reward"}):
            name = "verify." + path
            top = path.split(".")[0]
            same = isinstance(task, dict) and top in task and _get(task, path) == value
            echoed[name] = echoed.get(name, True) and same
            _note(found, name, value)
    out = []
    counts = {"task": 0, "verify": 0}
    for name, info in found.items():
        source = name.partition(".")[0]
        twin = "verify." + name[5:] if source == "task" else "task." + name[7:]
        both = echoed.get(name if source == "verify" else twin, False) and twin in found
        if both and (source == "verify") != imported:
            continue
        if counts[source] >= MAX_FIELDS or not FIELD_RE.match(name):
            continue
        counts[source] += 1
        kinds = info["kinds"]
        kind = next(iter(kinds)) if len(kinds) == 1 else ("number" if kinds <= {"number", "bool"} else "mixed")
        out.append(FieldInfo(name=name, type=kind, seen=info["seen"]))
    return out


def _note(found: dict[str, dict[str, Any]], name: str, value: Any) -> None:
    info = found.setdefault(name, {"kinds": set(), "seen": 0})
    info["kinds"].add(_kind(value))
    info["seen"] += 1


def _get(obj: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return object()
        obj = obj[key]
    return obj


def _loads(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def value_at(obj: Any, keys: list[str]) -> Any:
    """The scalar at ``keys`` in parsed JSON ``obj``, or None (missing, or not a scalar)."""
    for key in keys:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj if _kind(obj) is not None or obj is None else None
