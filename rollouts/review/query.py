"""The run table's rollout filter (``RolloutFilterForm``), read from a querystring: status,
failure kind, reward bounds, task, health verdict and finding, content search (``rollouts.search``),
the review fields (``rollouts.review.filters``) and the sort. The run page, the trajectory page's
previous/next, review mode, downloads, datasets from a selection, ``export_sft`` and the API all
read a list through ``filtered_rollouts``; ``export_filename`` names a filtered download.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.core.validators import ProhibitNullCharactersValidator
from django.db import connection
from django.db.models import F, QuerySet

from rollouts.collection import runs
from rollouts.evaluation.health_checks import CHECK_IDS, GYMWEB_CHECK_IDS
from rollouts.models import Rollout, RolloutHealth
from rollouts.review import columns, field_values
from rollouts.review.filters import (
    CORRECTED,
    EFFECTIVE,
    REVIEW_FILTER_FIELDS,
    ReviewFilterFields,
    with_effective_reward,
)
from rollouts.search import queries as search

SEARCH_MAX = 500  # characters of a content-search query

TASK_ORDER = ("task_index", "rollout_index", "attempt", "id")
SORTS = {  # the primary term; ties always break in task order
    "task": (),
    "reward": (F("reward").asc(nulls_last=True),),
    "duration": (F("duration_ms").asc(nulls_last=True),),
    "calls": (F("num_agent_calls").asc(),),
}
SORT_CHOICES = [
    ("task", "task ↑"),
    ("-task", "task ↓"),
    ("reward", "reward ↑"),
    ("-reward", "reward ↓"),
    ("duration", "duration ↑"),
    ("-duration", "duration ↓"),
    ("calls", "agent calls ↑"),
    ("-calls", "agent calls ↓"),
]
# The content search (``rollouts.search``): text in any item, a tool called, a tool
# output's text, a failure message's text.
CONTENT_FIELDS = ("text", "tool", "output", "error")
FILTER_FIELDS = (
    ("status", "kind", "reward_min", "reward_max", "task", "verdict", "check")
    + CONTENT_FIELDS
    + ("sort",)
    + REVIEW_FILTER_FIELDS
)
# Fields that choose how the list reads, not which rows it holds.
NOT_RESTRICTING = ("sort", "reward_source")
# What else a run table's querystring may carry (shown columns, the page): not filters, never refused.
LIST_FIELDS = ("cols", "page")


def unknown_filter_names(names) -> list[str]:
    """The names of ``names`` (a querystring's keys) that are no filter of the run table, sorted:
    an action on a filtered list refuses them, since a typo (``reward_mn``) would act on the whole
    run. Column filters (``f.<column>``) and ``LIST_FIELDS`` are known."""
    return sorted({n for n in names if n not in FILTER_FIELDS and n not in LIST_FIELDS and not str(n).startswith("f.")})


def _descending(term):
    return F(term.expression.name).desc(nulls_last=True)


class RolloutFilterForm(ReviewFilterFields):
    """Filters of a run's rollout table, read from the querystring (so a filtered view is a
    permalink). Invalid values are reported on the field and not applied; the run table and the
    API then show no rows (a 400 in the API), so a mistyped filter never reads as a bigger list.
    The review fields (label, notes, corrected reward) come from ``rollouts.review.filters``."""

    status = forms.ChoiceField(choices=[("", "any status")] + list(Rollout.Status.choices), required=False)
    kind = forms.ChoiceField(label="failure kind", choices=[("", "any failure kind")], required=False)
    reward_min = forms.FloatField(
        label="reward ≥",
        required=False,
        help_text="succeeded rollouts only: a failed one has no reward",
        widget=forms.NumberInput(
            attrs={"step": "any", "size": 5, "title": "succeeded rollouts only: a failed one has no reward"}
        ),
    )
    reward_max = forms.FloatField(
        label="reward ≤",
        required=False,
        help_text="succeeded rollouts only: a failed one has no reward",
        widget=forms.NumberInput(
            attrs={"step": "any", "size": 5, "title": "succeeded rollouts only: a failed one has no reward"}
        ),
    )
    task = forms.IntegerField(label="task", required=False, widget=forms.NumberInput(attrs={"size": 5}))
    # Health verdicts of the last health check (rollouts.evaluation.health), one row per checked rollout.
    verdict = forms.ChoiceField(
        label="health", choices=[("", "any health")] + list(RolloutHealth.Verdict.choices), required=False
    )
    check = forms.ChoiceField(
        label="finding", choices=[("", "any finding")] + [(c, c) for c in CHECK_IDS + GYMWEB_CHECK_IDS], required=False
    )
    # Content search (rollouts.search): case-insensitive substrings, every character literal.
    text = forms.CharField(
        label="trajectory contains",
        max_length=SEARCH_MAX,
        required=False,
        widget=forms.TextInput(attrs={"type": "search", "size": 14, "placeholder": "any item's text"}),
    )
    tool = forms.CharField(
        label="tool called",
        max_length=300,
        required=False,
        widget=forms.TextInput(attrs={"type": "search", "size": 10, "placeholder": "exact name"}),
    )
    output = forms.CharField(
        label="tool output contains",
        max_length=SEARCH_MAX,
        required=False,
        widget=forms.TextInput(attrs={"type": "search", "size": 12}),
    )
    error = forms.CharField(
        label="failure message contains",
        max_length=SEARCH_MAX,
        required=False,
        widget=forms.TextInput(attrs={"type": "search", "size": 12}),
    )
    sort = forms.ChoiceField(choices=SORT_CHOICES, required=False)

    def __init__(self, data=None, *, kinds: list[str] | None = None, **kwargs: Any):
        super().__init__(data if data is not None else {}, **kwargs)
        choices = [("", "any failure kind")] + [(k, k) for k in kinds or []]
        wanted = (data or {}).get("kind")
        if wanted and wanted not in dict(choices):  # a permalink to a kind this run lacks: empty result, not an error
            choices.append((wanted, wanted))
        self.fields["kind"].choices = choices
        # Task and verify fields (rollouts.review.columns): the chosen columns (``cols``), a sort on
        # any field (``sort=-verify.score``) and one filter per field (``f.verify.score=0.5..1``).
        getlist = getattr(data, "getlist", None)
        raw_cols = getlist("cols") if getlist else ([(data or {}).get("cols")] if (data or {}).get("cols") else [])
        self.columns = columns.parse_columns([str(v) for v in raw_cols])
        self.field_filters: dict[str, str] = {}
        self._bad_field_filters: list[str] = []  # parameters refused in ``clean`` (a NUL: see there)
        self._unknown_field_filters: list[str] = []  # ``f.`` parameters that name no field
        self.refused_field_filters: dict[str, str] = {}  # refused ranges, as typed (shown in their box)
        for key in list((data or {}).keys()):
            name = key[2:] if isinstance(key, str) and key.startswith("f.") else ""
            value = str((data or {}).get(key) or "").strip()[:SEARCH_MAX]
            if isinstance(key, str) and key.startswith("f.") and value and not columns.parse_field(name):
                self._unknown_field_filters.append(key)  # a mistyped filter must not read as the whole run
            elif columns.parse_field(name) and value and len(self.field_filters) < columns.MAX_COLUMNS:
                if "\x00" in value:
                    self._bad_field_filters.append(key)
                else:
                    self.field_filters[name] = value
        sort = str((data or {}).get("sort") or "")
        if columns.parse_field(sort.lstrip("-")):
            self.fields["sort"].choices = [*SORT_CHOICES, (sort, sort)]
        # Fields whose kept values (rollouts.review.field_values) the sort and filters read
        # instead of the JSON text: set by ``use_kept_values``.
        self.kept: set[str] = set()
        self.kept_run_id: int | None = None  # the run whose kept values those are
        self.head: QuerySet | None = None  # a cheap prefix of the sort's order (``page_ids``)
        self.is_valid()  # fills cleaned_data with the valid fields

    def clean(self) -> dict[str, Any]:
        """Refuse filters that can match nothing or that no database can run: ``reward_min`` above
        ``reward_max``; a field filter (``f.<field>``) holding a NUL (PostgreSQL refuses a NUL in a
        query; no kept value holds one: ``lossless.readable_json``); a field range
        ``columns.range_problem`` refuses; an ``f.`` parameter that names no field (``f.bogus``: a
        mistyped filter must never read as the whole run). Field errors are keyed by the parameter,
        which the page's error list and the API's 400 name, and such a filter is not applied."""
        data = super().clean() or {}
        low, high = data.get("reward_min"), data.get("reward_max")
        if low is not None and high is not None and low > high:
            self.add_error("reward_min", f"above reward_max ({high:g})")
        for key in self._bad_field_filters:
            # Not a declared field, so not ``add_error`` (which wants one).
            self._errors[key] = self.error_class([str(ProhibitNullCharactersValidator.message)])
        for key in self._unknown_field_filters:
            named = key[2:]
            self._errors[key] = self.error_class(
                [f"{named!r} is not a field: filter a task field as f.task.<name>, a verify field as f.verify.<name>"]
            )
        for name, value in list(self.field_filters.items()):
            problem = columns.range_problem(value)
            if problem:
                del self.field_filters[name]
                self.refused_field_filters[name] = value
                hint = f'; to match it as text, write it in double quotes: "{value}"'
                self._errors[f"f.{name}"] = self.error_class([problem.rstrip(".") + hint])
        return data

    def filter_reward(self, qs: QuerySet) -> QuerySet:
        """``qs`` restricted to ``reward_min <= reward <= reward_max`` (the env's reward, or the corrected
        one with ``reward_source``). Only succeeded rollouts have a reward: a failed one's stored 0.0 is
        NeMo Gym's failure-row value, and it cannot be corrected (``review.actions.correct_reward``)."""
        qs, reward = self.reward_column(qs)
        qs = qs.filter(status=Rollout.Status.SUCCEEDED)
        if self.value("reward_min") is not None:
            qs = qs.filter(**{f"{reward}__gte": self.value("reward_min")})
        if self.value("reward_max") is not None:
            qs = qs.filter(**{f"{reward}__lte": self.value("reward_max")})
        return qs

    def fields_read(self) -> list[str]:
        """The task and verify fields the sort and the filters read (each once)."""
        names = list(self.field_filters)
        column = self.sort_key.lstrip("-")
        if columns.parse_field(column) and column not in names:
            names.append(column)
        return names

    def use_kept_values(self, run) -> None:
        """Read the sort's and the filters' fields from ``run``'s kept values, brought up to date
        first (``field_values.ensure``: the first time a field of a small run is read, this extracts
        it; a large run's are extracted by a worker, and read from the JSON text until then)."""
        self.kept = {name for name in self.fields_read() if field_values.ensure(run, name)}
        self.kept_run_id = run.pk

    def field_filter_value(self, name: str) -> str:
        """What field ``name``'s filter box shows: its filter as typed, refused or not."""
        return self.field_filters.get(name) or self.refused_field_filters.get(name, "")

    def value(self, name: str) -> Any:
        return self.cleaned_data.get(name) if hasattr(self, "cleaned_data") else None

    @property
    def sort_key(self) -> str:
        return self.value("sort") or "task"

    def filter(self, qs: QuerySet) -> QuerySet:
        """``qs`` (a run's rollouts) restricted by the valid filters (not sorted)."""
        if self.value("status"):
            qs = qs.filter(status=self.value("status"))
        if self.value("kind"):
            qs = qs.filter(failure_kind=self.value("kind"))
        if self.value("reward_min") is not None or self.value("reward_max") is not None:
            qs = self.filter_reward(qs)
        if self.value("task") is not None:
            qs = qs.filter(task_index=self.value("task"))
        if self.value("verdict"):
            qs = qs.filter(health__verdict=self.value("verdict"))
        if self.value("check"):
            qs = qs.filter(health__checks__contains=f",{self.value('check')},")
        if self.value("text"):
            qs = search.filter_text(qs, self.value("text"))
        if self.value("tool"):
            qs = search.filter_tool(qs, self.value("tool"))
        if self.value("output"):
            qs = search.filter_output(qs, self.value("output"))
        if self.value("error"):
            qs = search.filter_error(qs, self.value("error"))
        for name, value in self.field_filters.items():
            if name in self.kept and self.kept_run_id is not None:
                qs = field_values.filter_field(qs, self.kept_run_id, name, value)
            else:
                qs = columns.filter_field(qs, name, value)
        return self.review_filter(qs)

    @property
    def searching(self) -> bool:
        """True when a content search (text, tool, output, error) restricts the list."""
        return any(self.value(n) for n in CONTENT_FIELDS)

    @property
    def highlight(self) -> str:
        """What the rollout page should highlight (its ``?q=``) for this filter: the searched text,
        else the tool output's text, the failure message's text, the tool name; ``""`` when none."""
        for name in ("text", "output", "error", "tool"):
            if self.value(name):
                return self.value(name)
        return ""

    def order(self, qs: QuerySet) -> QuerySet:
        key = self.sort_key
        column = key.lstrip("-")
        if column == "task":
            terms = tuple(F(t).desc() for t in TASK_ORDER) if key.startswith("-") else TASK_ORDER
        elif column in self.kept and self.kept_run_id is not None:  # kept values (review.field_values): same order
            self.head = field_values.sort_head(qs, self.kept_run_id, column, key.startswith("-"), then=TASK_ORDER)
            qs, terms = field_values.sort_terms(qs, self.kept_run_id, column, key.startswith("-"))
            terms += TASK_ORDER
        elif column not in SORTS:  # a task or verify field: numbers, then texts, then missing (both ways)
            text, number = columns.field_expressions(column)  # type: ignore[misc]
            desc = key.startswith("-")
            if connection.vendor == "sqlite" and not desc:
                # json_extract keeps JSON types, and SQLite orders numbers before texts before
                # NULL: one expression (one read of the JSON per row)
                qs = qs.alias(_sort_text=text)
                names: tuple[str, ...] = ("_sort_text",)
            else:
                qs = qs.alias(_sort_number=number)
                qs = qs.alias(_sort_text=field_values.text_of_strings(qs, F("_sort_number"), text))
                names = ("_sort_number", "_sort_text")
            terms = tuple(F(n).desc(nulls_last=True) if desc else F(n).asc(nulls_last=True) for n in names)
            terms += TASK_ORDER
        elif column == "reward" and self.value("reward_source") == CORRECTED:
            # the corrected reward where one is in force, else the env's (as the bounds read it)
            if EFFECTIVE not in qs.query.annotations:
                qs = with_effective_reward(qs)
            term = F(EFFECTIVE)
            terms = (term.desc(nulls_last=True) if key.startswith("-") else term.asc(nulls_last=True),) + TASK_ORDER
        else:
            terms = tuple(_descending(t) for t in SORTS[column]) if key.startswith("-") else SORTS[column]
            terms += TASK_ORDER
        return qs.order_by(*terms)

    def apply(self, qs: QuerySet) -> QuerySet:
        return self.order(self.filter(qs))

    def page_ids(self, qs: QuerySet) -> PagedIds | QuerySet:
        """The ids of ``qs`` (``apply``'s result) for a ``Paginator``: with a sort on a field's kept
        numbers, a ``PagedIds`` that reads the first pages from the index (``field_values.sort_head``);
        else ``qs``'s ids."""
        ids = qs.values_list("id", flat=True)
        return PagedIds(ids, self.head.values_list("id", flat=True)) if self.head is not None else ids

    @property
    def active(self) -> bool:
        """True when any filter (not the sort) restricts the list."""
        return bool(self.field_filters) or any(
            self.value(n) not in (None, "") for n in FILTER_FIELDS if n not in NOT_RESTRICTING
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The valid filter values as querystring parameters, with ``changes`` applied."""
        out = {}
        for name in FILTER_FIELDS:
            value = changes[name] if name in changes else self.value(name)
            if name == "sort" and value == "task":
                continue
            if value not in (None, ""):
                out[name] = str(value)
        cols = changes.get("cols", self.columns)
        if cols:
            out["cols"] = ",".join(cols)
        for name, value in changes.get("field_filters", self.field_filters).items():
            out[f"f.{name}"] = value
        return out

    def querystring(self, **changes: Any) -> str:
        return urlencode(self.params(**changes))

    # -- how the active filter reads (next to the download links) and in file names -------------
    def _terms(self) -> list[tuple[str, str, str]]:
        """``(label, file-name part, shown value)`` of each active filter, in field order."""
        terms = []
        if self.value("status"):
            terms.append(("status", "status", self.value("status")))
        if self.value("kind"):
            terms.append(("failure kind", "kind", self.value("kind")))
        for name, label, word in (("reward_min", "reward ≥", "ge"), ("reward_max", "reward ≤", "le")):
            if self.value(name) is not None:
                terms.append((label, f"reward-{word}", _number(self.value(name))))
        if self.value("task") is not None:
            terms.append(("task", "task", str(self.value("task"))))
        for name, label in (
            ("text", "trajectory contains"),
            ("tool", "tool called"),
            ("output", "tool output contains"),
            ("error", "failure message contains"),
        ):
            if self.value(name):
                terms.append((label, name, f"“{self.value(name)}”" if name != "tool" else self.value(name)))
        for name, value in self.field_filters.items():
            literal = columns.literal_text(value)
            if literal is not None:
                shown = f"“{literal}”"
            else:
                shown = value if columns.parse_range(value) is not None else f"“{value}”"
            terms.append((name, name, shown))
        terms.extend(self.review_terms())  # label, notes, corrected reward (rollouts.review.filters)
        return terms

    def describe(self) -> str:
        """The active filter for people: ``"status failed · reward ≥ 1"``; ``""`` when none."""
        return " · ".join(f"{label} {value}" for label, _, value in self._terms())

    def file_suffix(self) -> str:
        """The active filter for file names: ``"status-failed_reward-ge-1"``; ``""`` when none.
        Only ``[A-Za-z0-9._-]``: other characters (an imported failure kind may hold any) become
        ``_``; at most 120 characters."""
        parts = [
            f"{name}-{value.replace('-', 'minus', 1) if value.startswith('-') else value}"
            for _, name, value in self._terms()
        ]
        return _FILE_UNSAFE.sub("_", "_".join(parts).replace("“", "").replace("”", ""))[:120]


class PagedIds:
    """A sorted list's ids as a ``Paginator`` reads them (``count()``, slices): ``ids`` (a queryset
    of them), and ``head``, the ids of a prefix of the same order that the database reads cheaply
    (``field_values.sort_head``). A slice ending within ``HEAD_ROWS`` is read from ``head`` and kept
    when it comes back full (then it is that slice of ``ids``), else read from ``ids``."""

    HEAD_ROWS = 1_000

    def __init__(self, ids: QuerySet, head: QuerySet):
        self.ids, self.head = ids, head

    def count(self) -> int:
        return self.ids.count()

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step is None and key.stop is not None and key.stop <= self.HEAD_ROWS:
            start = key.start or 0
            got = list(self.head[key])
            if len(got) == key.stop - start:
                return got
        return list(self.ids[key]) if isinstance(key, slice) else self.ids[key]


_FILE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _number(value: float) -> str:
    """A filter bound as typed: ``1.0`` → ``"1"``, ``0.25`` → ``"0.25"``."""
    return f"{value:g}" if value == value else str(value)


def export_filename(run_id: int, kind: str, filt: RolloutFilterForm | None = None) -> str:
    """The download name of one of a run's files: ``run-12_rollouts.jsonl``, and with an active
    filter ``run-12_rollouts_reward-ge-1.jsonl``, so downloads never overwrite each other.
    ``kind``: ``rollouts``, ``rollouts_failures`` or ``rollouts_materialized_inputs``."""
    suffix = filt.file_suffix() if filt is not None and filt.active else ""
    return f"run-{run_id}_{kind}{'_' + suffix if suffix else ''}.jsonl"


def filter_problem(form: RolloutFilterForm) -> str:
    """The first invalid filter value of ``form`` as one line (``"reward_min: Enter a number."``),
    or ``""`` when every value is valid. Pages show a bad value on its field and ignore it; actions
    that act on the list (downloads, a dataset from the list) refuse it with this text instead, so
    a mistyped filter never yields a bigger list than asked for."""
    for name, errors in form.errors.items():
        return f"{name}={str(form.data.get(name, ''))[:60]!r}: {errors[0]}" if name != "__all__" else str(errors[0])
    return ""


def filtered_rollouts(run, data, kinds: list[str] | None = None) -> tuple[QuerySet, RolloutFilterForm]:
    """A run's rollouts filtered and sorted by querystring ``data`` (a QueryDict or dict), and the
    form that read it. Other pages (a rollout's prev/next) can call this with the querystring
    that the run page put on their link."""
    form = RolloutFilterForm(data, kinds=kinds, team_id=run.team_id)
    form.use_kept_values(run)
    return form.apply(runs.without_superseded(Rollout.objects.filter(run=run))), form
