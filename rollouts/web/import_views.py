"""The import page: NeMo Gym result files (one ``rollouts.jsonl`` or several shards, their failure
sidecars and materialised inputs) into one new imported run; a file that is a dataset is offered
as one for a new run.
"""

from __future__ import annotations

import os
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse

from rollouts import background
from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import LooksLikeDatasetError, WrongFileError, import_shards
from rollouts.collection.run_names import import_name
from rollouts.evaluation import health
from rollouts.models import BackgroundTask, Team
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


def _dataset_offer(upload, source: str, user) -> dict[str, Any]:
    """A rollouts file that is a dataset: keep it as a dataset (an identical earlier upload is
    reused; ``collection.streamed_upload``: bounded memory, short transactions, refused past the key
    limit before anything is stored) and offer the new-run form with it chosen. ``{"dataset": its
    id, "reused": bool, "url": ...}``, or ``{"error": why}`` when it is not a usable dataset either."""
    from pathlib import PurePath

    from rollouts.collection import streamed_upload

    line_limit = int(settings.GYMWEB_MAX_LINE_BYTES)
    try:
        found = streamed_upload.scan(upload, source, int(settings.GYMWEB_MAX_KEYS_PER_RUN), line_limit)
        dataset, reused = streamed_upload.store_dataset(
            upload, source, found, name=PurePath(source or "dataset.jsonl").name, user=user, max_line_bytes=line_limit
        )
    except DatasetError as exc:
        return {"error": str(exc)}
    return {"dataset": dataset.pk, "reused": reused, "url": reverse("run_new") + f"?dataset={dataset.pk}"}


def import_job(task, progress) -> background.Done:
    """The background task of an import: the files kept with ``task`` into one new imported run
    (``importer.import_shards``), then its health check. A refusal is a ``TaskFailed`` whose
    result names the form field it belongs to (and a dataset offer)."""
    from contextlib import ExitStack

    by_slot: dict[str, list[tuple[Any, str]]] = {"rollouts": [], "failures": [], "materialized": []}
    with ExitStack() as stack:
        for kept, source in zip(task.params["files"], task.params["sources"], strict=True):
            by_slot[kept["slot"]].append((stack.enter_context(open(kept["path"], "rb")), source))
        shards, sidecars, inputs = by_slot["rollouts"], by_slot["failures"], by_slot["materialized"]
        handles = [fh for fh, _ in shards + sidecars + inputs]
        total = sum(os.fstat(fh.fileno()).st_size for fh in handles) or 1
        progress(0.0, f"Reading {len(handles)} file(s)…", force=True)

        def read_so_far() -> None:  # after each batch written: the share of the bytes read
            done = sum(fh.tell() for fh in handles if not fh.closed)
            progress(0.9 * done / total, f"Imported {done / total:.0%} of the bytes…")

        try:
            summary = import_shards(
                shards,
                sidecars,
                inputs,
                name=import_name(task.params.get("name") or "", [src for _, src in shards + sidecars]),
                user=task.user,
                team=Team.objects.filter(pk=task.params["team"]).first() if "team" in task.params else None,
                on_batch=read_so_far,
            )
        except LooksLikeDatasetError as exc:
            offer = _dataset_offer(*shards[0], task.user) if len(shards) == 1 else None
            if offer is not None:
                offer["materialized"] = exc.materialized  # say where that file belongs, too
            raise background.TaskFailed(str(exc), {"field": "rollouts", "offer": offer}) from exc
        except WrongFileError as exc:
            sidecar = exc.source in {src for _, src in sidecars}
            materialised = exc.source in {src for _, src in inputs}
            field = None if exc.swapped else ("failures" if sidecar else "materialized" if materialised else "rollouts")
            raise background.TaskFailed(str(exc), {"field": field}) from exc
        except DatasetError as exc:
            field = (
                "failures"
                if exc.source in {src for _, src in sidecars}
                else "materialized"
                if exc.source in {src for _, src in inputs}
                else "rollouts"
            )
            raise background.TaskFailed(str(exc), {"field": field}) from exc
    progress(0.9, "Checking the run's health…", force=True)
    health.auto_check(summary.run)  # the verdicts show on the run page
    parts = [f"{summary.succeeded} succeeded", f"{summary.failed} failed"]
    if summary.not_run:
        parts.append(f"{summary.not_run} never run (rows without a result)")
    files = f" from {len(shards)} shards" if len(shards) > 1 else ""
    return background.Done(
        f"Imported {summary.rows} rollout(s){files} into “{summary.run.name}”: {', '.join(parts)}.",
        url=reverse("run", args=[summary.run.pk]),
        result={"run": summary.run.pk},
    )


def _offer_view(offer: dict[str, Any] | None) -> dict[str, Any] | None:
    from rollouts.models import Dataset

    if not offer or "dataset" not in offer:
        return offer
    dataset = Dataset.objects.filter(pk=offer["dataset"]).first()
    return {**offer, "dataset": dataset} if dataset else None


def start_import(
    user, name: str, uploads: dict[str, list[Any]], team_id: int | None = None
) -> tuple[BackgroundTask, bool]:
    """Queue an import of ``uploads`` (``{"rollouts"|"failures"|"materialized": [upload, ...]}``)
    for ``user`` as a background task (``import_job``): ``(task, created)``; the run goes to team
    ``team_id`` if given (an API token's team), else the user's first. The same name and files
    (names and bytes) while such an import of the user's is queued or running hand back that task
    (``created`` False), from the page or the API alike. Raises ``background.TooManyTasks``."""
    taken: set = set()
    named = [
        (slot, upload, source)
        for slot, fallback in (
            ("rollouts", "rollouts.jsonl"),
            ("failures", "failures sidecar"),
            ("materialized", "materialised inputs"),
        )
        for upload, source in _upload_sources(uploads.get(slot) or [], fallback, taken)
    ]
    key = background.content_hash([name, *(f"{slot}:{source}" for slot, _, source in named)] + [u for _, u, _ in named])
    params: dict[str, Any] = {"name": name, "sources": [source for _, _, source in named]}
    if team_id is not None:
        params["team"] = team_id
        key = background.content_hash([key, f"team:{team_id}"])
    return background.start(
        str(BackgroundTask.Kind.IMPORT),
        user,
        params,
        files=[(slot, upload) for slot, upload, _ in named],
        dedupe_key=key,
    )


@login_required
def import_rollouts(request):
    """The import page: one ``rollouts.jsonl`` (and its sidecar, or the sidecar alone, and optionally
    its materialised inputs), or several shards of one run with their sidecars, into one new
    imported run, as a background task (``import_job``); the page follows the task. The same files
    while an import of them is queued or running follow that import."""
    offer = None
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES, too_large_uploads=too_large_uploads(request))
        if form.is_valid():
            try:
                task, _ = start_import(
                    request.user,
                    form.cleaned_data.get("name") or "",
                    {slot: form.cleaned_data.get(slot) or [] for slot in ("rollouts", "failures", "materialized")},
                )
            except background.TooManyTasks as exc:
                form.add_error(None, str(exc))
            else:
                if not task.is_finished:
                    return redirect(reverse("task", args=[task.pk]))
                if task.status == BackgroundTask.Status.DONE:  # ran inline (GYMWEB_TASKS_INLINE)
                    messages.success(request, task.message)
                    return redirect(task.result_url)
                form.add_error(task.result.get("field") if "field" in task.result else "rollouts", task.message)
                offer = _offer_view(task.result.get("offer"))
    else:
        form = ImportForm()
    return render(request, "rollouts/import.html", {"form": form, "offer": offer}, status=400 if form.errors else 200)
