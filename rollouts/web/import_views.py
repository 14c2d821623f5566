"""The import page: NeMo Gym result files (one ``rollouts.jsonl`` or several shards, their failure
sidecars and materialised inputs) into one new imported run; a file that is a dataset is offered
as one for a new run.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse

from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import LooksLikeDatasetError, WrongFileError, import_shards
from rollouts.collection.run_names import import_name
from rollouts.evaluation import health
from rollouts.web.forms import MultipleFileField
from rollouts.web.uploads import too_large_uploads, upload_limit_message


class ImportForm(forms.Form):
    rollouts = MultipleFileField(
        label="rollouts.jsonl",
        required=False,
        help_text="NeMo Gym's (or gymweb's) rollouts.jsonl: one result row per line (optional when a failures sidecar "
        "is given). Several files = shards of one run (gym eval aggregate's shards), imported as one run.",
        allow_empty_file=True,  # one empty shard among others is fine; no rows at all is the importer's error
    )
    failures = MultipleFileField(
        label="failures sidecars",
        required=False,
        help_text="optional: the rollouts_failures.jsonl of each file above (one failed attempt per line)",
        allow_empty_file=True,  # NeMo Gym writes an empty sidecar when nothing failed
    )
    materialized = MultipleFileField(
        label="materialised inputs",
        required=False,
        help_text="optional: the rollouts_materialized_inputs.jsonl beside them (the task rows, with the task fields "
        "NeMo Gym's envs leave out of their results; needed to re-verify the run)",
    )
    name = forms.CharField(
        max_length=200,
        required=False,
        help_text="default: the file's folder and name (filled in when the browser gives the folder), else the "
        "file name, numbered when a run already has it",
    )

    def __init__(self, *args, too_large_uploads: set | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.too_large_uploads = too_large_uploads or set()

    def clean(self):
        data = super().clean()
        limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
        for field in ("rollouts", "failures", "materialized"):
            uploads = data.get(field) or []
            too_large = [u.name for u in uploads if u.size > limit]
            if field in self.too_large_uploads or too_large:
                if field in self.errors:  # e.g. "required": the handler dropped the file, say why instead
                    del self.errors[field]
                message = upload_limit_message(limit)
                self.add_error(field, f"{', '.join(too_large)}: {message}" if too_large else message)
        if not self.errors and not data.get("rollouts") and not data.get("failures"):
            self.add_error("rollouts", "Choose a rollouts.jsonl, a failures sidecar, or both.")
        return data


def _upload_sources(uploads, fallback: str, taken: set) -> list[tuple[Any, str]]:
    """``(upload, name for error messages)`` of each upload; a name already used gets a suffix, so
    an error always points at one file."""
    named = []
    for n, upload in enumerate(uploads, 1):
        base = upload.name or (fallback if len(uploads) == 1 else f"{fallback} #{n}")
        source = base
        if source in taken:  # two "rollouts.jsonl" from different folders: say which by position
            source = f"{base} (file {n} of the {fallback} files)" if len(uploads) > 1 else f"{base} (the {fallback})"
        while source in taken:
            source = f"{source}'"
        taken.add(source)
        named.append((upload, source))
    return named


def _dataset_offer(upload, user) -> dict[str, Any]:
    """A rollouts upload that is a dataset: keep it as a dataset (an identical earlier upload is
    reused) and offer the new-run form with it chosen. ``{"dataset": Dataset, "url": ...}``, or
    ``{"error": why}`` when it is not a usable dataset either."""
    from pathlib import PurePath

    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl

    try:
        upload.seek(0)
        parsed = read_jsonl(upload, source=upload.name, max_line_bytes=int(settings.GYMWEB_MAX_LINE_BYTES))
    except DatasetError as exc:
        return {"error": str(exc)}
    dataset, reused = runs.store_or_reuse_dataset(parsed, PurePath(upload.name or "dataset.jsonl").name, user)
    return {"dataset": dataset, "reused": reused, "url": reverse("run_new") + f"?dataset={dataset.pk}"}


@login_required
def import_rollouts(request):
    """The import page: one ``rollouts.jsonl`` (and its sidecar, or the sidecar alone, and optionally
    its materialised inputs), or several shards of one run with their sidecars, into one new
    imported run (``importer.import_shards``)."""
    offer = None
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES, too_large_uploads=too_large_uploads(request))
        if form.is_valid():
            taken: set = set()
            shards = _upload_sources(form.cleaned_data.get("rollouts") or [], "rollouts.jsonl", taken)
            sidecars = _upload_sources(form.cleaned_data.get("failures") or [], "failures sidecar", taken)
            inputs = _upload_sources(form.cleaned_data.get("materialized") or [], "materialised inputs", taken)
            sidecar_sources = {src for _, src in sidecars}
            input_sources = {src for _, src in inputs}
            try:
                name = import_name(form.cleaned_data.get("name") or "", [u.name or "" for u, _ in shards + sidecars])
                summary = import_shards(shards, sidecars, inputs, name=name, user=request.user)
            except LooksLikeDatasetError as exc:
                form.add_error("rollouts", str(exc))
                if len(shards) == 1:
                    offer = _dataset_offer(shards[0][0], request.user)
            except WrongFileError as exc:
                form.add_error(
                    None if exc.swapped else ("failures" if exc.source in sidecar_sources else "rollouts"), str(exc)
                )
            except DatasetError as exc:
                field = (
                    "failures"
                    if exc.source in sidecar_sources
                    else "materialized"
                    if exc.source in input_sources
                    else "rollouts"
                )
                form.add_error(field, str(exc))
            else:
                parts = [f"{summary.succeeded} succeeded", f"{summary.failed} failed"]
                if summary.not_run:
                    parts.append(f"{summary.not_run} never run (rows without a result)")
                files = f" from {len(shards)} shards" if len(shards) > 1 else ""
                messages.success(
                    request, f"Imported {summary.rows} rollout(s){files} into “{summary.run.name}”: {', '.join(parts)}."
                )
                health.auto_check(summary.run)  # the verdicts show on the run page
                return redirect(reverse("run", args=[summary.run.pk]))
    else:
        form = ImportForm()
    return render(request, "rollouts/import.html", {"form": form, "offer": offer}, status=400 if form.errors else 200)
