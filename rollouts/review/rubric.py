"""The label set's rubric: named fields a reviewer fills in for a rollout, each a score range
(``min``/``max``) or a list of ``choices``, and the answers, one per reviewer and rollout.

A definition is validated by pydantic (``RubricDefinition``); the pages write it as lines
(``name: 1..5  # what it measures`` or ``name: poor | ok | good``, ``parse_lines``), the API as
JSON. Answers are checked against the rubric in force (``clean_answers``). Every bad input raises
``ReviewError`` naming the rubric field at fault and stores nothing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollouts.lossless import dumps
from rollouts.models import Rollout, Rubric, RubricAnswer
from rollouts.review.actions import ReviewError

FIELD_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,39}$")  # the label names' rule
MAX_FIELDS = 20
MAX_CHOICES = 20
CHOICE_MAX_CHARS = 100
FORM_PREFIX = "rubric_"  # the review panel's inputs: rubric_<field name> (the list's filter rides along)


class RubricField(BaseModel):
    """One field: ``name`` (1–40 of a-z 0-9 . _ -), optional ``description``, ``required``
    (default true), and either ``min`` and ``max`` (a score, min < max, both finite) or ``choices``
    (1–20 distinct strings)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = Field("", max_length=200)
    required: bool = True
    min: float | None = None
    max: float | None = None
    choices: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        value = value.strip().lower()
        if not FIELD_NAME.fullmatch(value):
            raise ValueError("use 1–40 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @model_validator(mode="after")
    def _kind(self) -> RubricField:
        is_range = self.min is not None or self.max is not None
        if is_range == (self.choices is not None):
            raise ValueError("give either a score range (min and max) or choices")
        if is_range:
            if self.min is None or self.max is None:
                raise ValueError("a score range needs both min and max")
            if not (math.isfinite(self.min) and math.isfinite(self.max)):
                raise ValueError("min and max must be finite numbers")
            if self.min >= self.max:
                raise ValueError(f"min ({_num(self.min)}) must be below max ({_num(self.max)})")
        else:
            choices = [c.strip() for c in self.choices or []]
            if len(choices) < 2 or len(choices) > MAX_CHOICES:
                raise ValueError(f"give 2 to {MAX_CHOICES} choices (one choice asks nothing)")
            if any(not c or len(c) > CHOICE_MAX_CHARS for c in choices):
                raise ValueError(f"each choice has 1 to {CHOICE_MAX_CHARS} characters")
            if len(set(choices)) != len(choices):
                raise ValueError("the choices must differ")
            self.choices = choices
        return self

    @property
    def is_range(self) -> bool:
        return self.choices is None

    @property
    def low(self) -> str:
        """``min`` as written (``0``, ``2.5``): the form's bound."""
        return _num(self.min)

    @property
    def high(self) -> str:
        """``max`` as written: the form's bound."""
        return _num(self.max)

    def describe(self) -> str:
        """``1..5`` or ``poor | ok | good``."""
        return f"{_num(self.min)}..{_num(self.max)}" if self.is_range else " | ".join(self.choices or [])


class RubricDefinition(BaseModel):
    """A rubric: 1–20 fields with distinct names, in the order the form shows them."""

    model_config = ConfigDict(extra="forbid")

    fields: list[RubricField] = Field(min_length=1, max_length=MAX_FIELDS)

    @model_validator(mode="after")
    def _distinct(self) -> RubricDefinition:
        seen: set[str] = set()
        for f in self.fields:
            if f.name in seen:
                raise ValueError(f"two fields are named {f.name!r}")
            seen.add(f.name)
        return self


def _num(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _where(loc: tuple, raw: Any) -> str:
    """A pydantic error location as the rubric field it names (``field 'style'``, ``field 2``)."""
    if len(loc) >= 2 and loc[0] == "fields" and isinstance(loc[1], int):
        name = ""
        if isinstance(raw, Mapping) and isinstance(raw.get("fields"), list) and loc[1] < len(raw["fields"]):
            entry = raw["fields"][loc[1]]
            name = str(entry.get("name") or "")[:40] if isinstance(entry, Mapping) else ""
        where = f"rubric field {name!r}" if name else f"rubric field {loc[1] + 1}"
        rest = ".".join(str(p) for p in loc[2:] if p not in ("function-after[_kind()]",))
        return f"{where} ({rest})" if rest else where
    return "rubric" + (f" ({'.'.join(str(p) for p in loc)})" if loc else "")


def parse_definition(raw: Any) -> RubricDefinition:
    """A definition from a dict (the API's JSON) or a ``RubricDefinition``; ``ReviewError``
    (field ``rubric``) naming the rubric field at fault otherwise."""
    if isinstance(raw, RubricDefinition):
        return raw
    try:
        return RubricDefinition.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ReviewError(f"{_where(tuple(first['loc']), raw)}: {message}", "rubric") from None


LINE = re.compile(r"^\s*(?P<name>[^:#]+?)\s*:\s*(?P<spec>[^#]*?)\s*(?:#\s*(?P<desc>.*?)\s*)?$")
RANGE = re.compile(r"^(?P<min>[-+0-9.eE]+)\s*\.\.\s*(?P<max>[-+0-9.eE]+)$")


def parse_lines(text: str) -> RubricDefinition:
    """The pages' form: one field a line, ``name: 1..5`` (a score range) or ``name: a | b | c``
    (choices), then optionally ``# description``; a trailing ``?`` on the name makes it optional.
    Blank lines are skipped. ``ReviewError`` naming the line or field otherwise."""
    fields: list[dict[str, Any]] = []
    for n, line in enumerate(str(text or "").splitlines(), 1):
        if not line.strip():
            continue
        match = LINE.fullmatch(line)
        if match is None or not match["spec"]:
            raise ReviewError(
                f"rubric line {n} ({line.strip()[:60]!r}): write 'name: 1..5' or 'name: choice | choice'", "rubric"
            )
        name, optional = match["name"].strip(), False
        if name.endswith("?"):
            name, optional = name[:-1].strip(), True
        entry: dict[str, Any] = {"name": name, "required": not optional, "description": match["desc"] or ""}
        bounds = RANGE.fullmatch(match["spec"])
        if bounds is not None:
            try:
                entry.update(min=float(bounds["min"]), max=float(bounds["max"]))
            except ValueError:
                raise ReviewError(
                    f"rubric field {name[:40]!r}: {match['spec'][:40]!r} is not a range", "rubric"
                ) from None
        elif ".." in match["spec"] or "|" not in match["spec"]:
            # a mistyped range (``0..inf``, ``0,5``, ``0 - 5``) must not become a one-choice field
            raise ReviewError(
                f"rubric field {name[:40]!r}: {match['spec'][:40]!r} is neither a range of two finite numbers "
                "('0..5') nor choices ('poor | ok | good')",
                "rubric",
            )
        else:
            entry["choices"] = [c.strip() for c in match["spec"].split("|")]
        fields.append(entry)
    if not fields:
        raise ReviewError("the rubric has no field: write one a line ('correctness: 0..5')", "rubric")
    return parse_definition({"fields": fields})


def as_lines(definition: RubricDefinition) -> str:
    """The definition in ``parse_lines``'s form (what the Labels page's box shows)."""
    out = []
    for f in definition.fields:
        line = f"{f.name}{'' if f.required else '?'}: {f.describe()}"
        out.append(f"{line}  # {f.description}" if f.description else line)
    return "\n".join(out)


# -- the rubric in force -----------------------------------------------------------------------
def current() -> Rubric | None:
    """The rubric in force: the newest row, unless it cleared the rubric (an empty definition)."""
    latest = Rubric.objects.order_by("-id").first()
    return latest if latest is not None and definition_of(latest) is not None else None


def definition_of(rubric: Rubric | None) -> RubricDefinition | None:
    """A stored rubric's definition (None for a row that cleared the rubric)."""
    if rubric is None:
        return None
    data = json.loads(rubric.definition_json)
    return RubricDefinition.model_validate(data) if data else None


STAFF_ONLY = "only an admin (staff) may change the rubric: it is every team's"


def may_edit(user) -> bool:
    """Whether ``user`` may set the rubric: it is one per instance (every team's review panel asks
    for it), so only staff and superusers may, not a member of one team."""
    return bool(user is not None and (user.is_staff or user.is_superuser))


def set_rubric(definition: Any, user=None) -> Rubric:
    """Put ``definition`` (dict or ``RubricDefinition``; None clears it) in force. Earlier answers
    keep the rubric they were given against. Who may: ``may_edit``, checked by the page and the API."""
    if definition is None:
        return Rubric.objects.create(definition_json=dumps(None), created_by=user)
    checked = parse_definition(definition)
    return Rubric.objects.create(definition_json=dumps(checked.model_dump(exclude_defaults=False)), created_by=user)


# -- answers -----------------------------------------------------------------------------------
def _score(f: RubricField, raw: Any) -> float | int:
    if isinstance(raw, bool):
        raise ReviewError(f"rubric field {f.name!r}: give a number from {f.describe()}", f.name)
    try:
        value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        raise ReviewError(
            f"rubric field {f.name!r}: {str(raw)[:40]!r} is not a number (give one from {f.describe()})", f.name
        ) from None
    if not math.isfinite(value) or not (f.min is not None and f.max is not None and f.min <= value <= f.max):
        raise ReviewError(f"rubric field {f.name!r}: {str(raw)[:40]} is outside {f.describe()}", f.name)
    return int(value) if value.is_integer() else value


def clean_answers(definition: RubricDefinition, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (field name → a number or a choice; empty strings/None = no answer) checked
    against ``definition``: the answers in the rubric's order. ``ReviewError`` (its ``field``: the
    rubric field's name) for an unknown field, a missing required one, a score out of range or
    not a number, or a choice not offered."""
    known = {f.name for f in definition.fields}
    for name in values:
        if name not in known:
            raise ReviewError(
                f"no rubric field {str(name)[:40]!r} (the rubric has {', '.join(sorted(known))})", str(name)
            )
    out: dict[str, Any] = {}
    for f in definition.fields:
        raw = values.get(f.name)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            if f.required:
                raise ReviewError(f"rubric field {f.name!r}: required ({f.describe()})", f.name)
            continue
        if f.is_range:
            out[f.name] = _score(f, raw)
        else:
            choice = raw.strip() if isinstance(raw, str) else raw
            if choice not in (f.choices or []):
                raise ReviewError(f"rubric field {f.name!r}: {str(raw)[:40]!r} is not one of {f.describe()}", f.name)
            out[f.name] = choice
    return out


def form_values(post: Mapping[str, Any]) -> dict[str, Any]:
    """The rubric inputs of a form post (``rubric_<name>``), by field name."""
    return {k[len(FORM_PREFIX) :]: post.get(k) for k in post if k.startswith(FORM_PREFIX)}


def save_answer(rollout: Rollout, user, values: Mapping[str, Any]) -> RubricAnswer:
    """Store ``user``'s answers for ``rollout`` against the rubric in force (replacing their
    earlier answer). ``ReviewError`` when there is no rubric or an answer is bad."""
    rubric = current()
    definition = definition_of(rubric)
    if rubric is None or definition is None:
        raise ReviewError("the label set has no rubric (define one on the Labels page)", "rubric")
    clean = clean_answers(definition, values)
    with transaction.atomic():
        answer, _ = RubricAnswer.objects.update_or_create(
            rollout=rollout, user=user, defaults={"rubric": rubric, "values_json": dumps(clean)}
        )
    return answer


def answer_values(answer: RubricAnswer) -> dict[str, Any]:
    """An answer's values, field name → number or choice."""
    return json.loads(answer.values_json)


def answers_of(rollout_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """Per rollout id, every reviewer's answers as exported: ``[{"by", "at", "values"}]`` (oldest
    first), in one query."""
    out: dict[int, list[dict[str, Any]]] = {}
    ids = list(rollout_ids)
    if not ids:
        return out
    for answer in RubricAnswer.objects.filter(rollout_id__in=ids).select_related("user").order_by("updated", "id"):
        out.setdefault(answer.rollout_id, []).append(
            {"by": answer.user.get_username(), "at": answer.updated.isoformat(), "values": answer_values(answer)}
        )
    return out
