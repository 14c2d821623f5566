"""The review filters of the run table (label, no label, notes, corrected reward, which reward the
reward bounds read), as fields of ``rollouts.review.query.RolloutFilterForm``, so the table, the
trajectory page's previous/next, review mode, exports, datasets from a selection and the API all
read one filter.

The querystring names (``label``, ``not_label``, ``notes``, ``corrected``, ``reward_source``):
docs/review.md. Each is optional; invalid values are reported on the field and ignored.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import Exists, F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from rollouts.models import Label, Note, RewardCorrection, RolloutLabel
from rollouts.review.actions import LABEL_NAME

REVIEW_FILTER_FIELDS = ("label", "not_label", "notes", "corrected", "reward_source")
NO_LABEL = "-"
YES_NO = [("", "any"), ("yes", "yes"), ("no", "no")]
ORIGINAL, CORRECTED = "original", "corrected"
REWARD_SOURCES = [(ORIGINAL, "env's reward"), (CORRECTED, "corrected reward")]
EFFECTIVE = "_gw_effective_reward"


def corrected_reward() -> Subquery:
    """The corrected reward in force for ``OuterRef("pk")`` (a rollout): its newest correction's
    ``reward``, NULL when there is none or it was withdrawn."""
    return Subquery(RewardCorrection.objects.filter(rollout=OuterRef("pk")).order_by("-id").values("reward")[:1])


def with_effective_reward(qs: QuerySet, name: str = EFFECTIVE) -> QuerySet:
    """``qs`` (rollouts) with alias ``name`` = the corrected reward where one is in force, else the
    env's ``reward``. An alias (not selected): filter or aggregate on it."""
    return qs.alias(**{name: Coalesce(corrected_reward(), F("reward"))})


class ReviewFilterFields(forms.Form):
    """Base of ``RolloutFilterForm``: the review fields (listed after the form's own fields)."""

    label = forms.ChoiceField(label="label", choices=[("", "any label")], required=False)
    not_label = forms.ChoiceField(label="without label", choices=[("", "—")], required=False)
    notes = forms.ChoiceField(label="has notes", choices=YES_NO, required=False)
    corrected = forms.ChoiceField(label="corrected reward", choices=YES_NO, required=False)
    reward_source = forms.ChoiceField(label="reward bounds and sort read", choices=REWARD_SOURCES, required=False)

    def __init__(self, *args: Any, team_id: int | None = None, **kwargs: Any):
        """``team_id``: the team of the run whose rollouts are filtered; its label set is offered
        (None: no label is offered, a typed label name is still accepted)."""
        super().__init__(*args, **kwargs)
        self._team_id = team_id
        self._label_names: list[str] | None = None
        data = self.data or {}
        for field, first in (("label", [("", "any label"), (NO_LABEL, "(no label)")]), ("not_label", [("", "—")])):
            # Lazy: the labels are read only when a value is validated or the field is rendered.
            self.fields[field].choices = self._label_choices(first, data.get(field))
        for name in REVIEW_FILTER_FIELDS:  # after the subclass's own fields
            self.fields[name] = self.fields.pop(name)

    def _label_choices(self, first: list, wanted: Any):
        def choices() -> list:
            if self._label_names is None:
                self._label_names = list(
                    Label.objects.filter(team_id=self._team_id)
                    .order_by("position", "id")
                    .values_list("name", flat=True)
                )
            out = first + [(n, n) for n in self._label_names]
            # A permalink to a label since removed: an empty result. A value no label could ever
            # have (a NUL, spaces, 500 characters) stays an invalid choice, reported on the field:
            # PostgreSQL refuses a NUL in a query, and nothing can match it anyway.
            if wanted and wanted not in dict(out) and isinstance(wanted, str) and LABEL_NAME.fullmatch(wanted):
                out.append((wanted, wanted))
            return out

        return choices

    def reward_column(self, qs: QuerySet) -> tuple[QuerySet, str]:
        """``(qs, name)``: the column the reward bounds read (``reward_source``)."""
        if getattr(self, "cleaned_data", {}).get("reward_source") == CORRECTED:
            return with_effective_reward(qs), EFFECTIVE
        return qs, "reward"

    def review_terms(self) -> list[tuple[str, str, str]]:
        """``(label, file-name part, shown value)`` of each active review filter, for the form's
        description and download names (``label-good``, ``notes-yes``, ``rewards-corrected``)."""
        value = getattr(self, "cleaned_data", {}).get
        terms = []
        if value("label"):
            terms.append(("label", "label", "none" if value("label") == NO_LABEL else value("label")))
        if value("not_label"):
            terms.append(("without label", "not-label", value("not_label")))
        for name, label in (("notes", "has notes"), ("corrected", "corrected reward")):
            if value(name):
                terms.append((label, name, value(name)))
        if value("reward_source") == CORRECTED:
            terms.append(("reward bounds and sort read", "rewards", "corrected"))
        return terms

    def review_filter(self, qs: QuerySet) -> QuerySet:
        """``qs`` (rollouts) restricted by the valid review fields."""
        value = getattr(self, "cleaned_data", {}).get
        label = value("label")
        if label == NO_LABEL:
            qs = qs.filter(~Exists(RolloutLabel.objects.filter(rollout=OuterRef("pk"))))
        elif label:
            qs = qs.filter(Exists(RolloutLabel.objects.filter(rollout=OuterRef("pk"), label__name=label)))
        if value("not_label"):
            qs = qs.filter(~Exists(RolloutLabel.objects.filter(rollout=OuterRef("pk"), label__name=value("not_label"))))
        notes = Exists(Note.objects.filter(rollout=OuterRef("pk")))
        if value("notes") == "yes":
            qs = qs.filter(notes)
        elif value("notes") == "no":
            qs = qs.filter(~notes)
        if value("corrected") in ("yes", "no"):
            qs = qs.alias(_gw_corrected=corrected_reward()).filter(_gw_corrected__isnull=value("corrected") == "no")
        return qs
