"""The API's run routes (registered on ``rollouts.api.router.api``): list, import (and its task's
status), one run, cancel,
retry, the NeMo Gym files and the SFT export (streamed), a dataset from a filtered list."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from ninja import File, Form
from ninja.errors import HttpError
from ninja.files import UploadedFile
from ninja.responses import Status

from rollouts import targets
from rollouts.api.errors import FieldsError, review_error
from rollouts.api.lookups import OFFSET, filtered, limit_query, page_limit, runs_for
from rollouts.api.payloads import dataset_out, run_out, task_out
from rollouts.api.router import api
from rollouts.api.schemas import DatasetOut, Error, RetryOut, RunDetailOut, RunOut, TaskOut
from rollouts.collection import archive, environments, runs
from rollouts.evaluation import run_summary
from rollouts.models import Run
from rollouts.review import curated, selection, sft
from rollouts.review.actions import ReviewError
from rollouts.review.corrected_summary import reward_aggregates
from rollouts.review.query import export_filename
from rollouts.web.access import run_for
from rollouts.web.uploads import too_large_uploads, upload_limit_message


@api.get("/runs", response=list[RunOut], summary="List runs (newest first)")
def list_runs(request, limit: int = limit_query(50), offset: int = OFFSET):
    limit = page_limit(limit)
    page = list(runs_for(request).select_related("dataset").order_by("-created", "-id")[offset : offset + limit])
    progress = run_summary.progress_for_runs(page)
    return [run_out(request, run, progress[run.pk]) for run in page]


@api.post(
    "/runs/import",
    response={202: TaskOut, 400: Error, 413: Error, 429: Error},
    summary="Import NeMo Gym output files as a run (a background task)",
)
def import_run(
    request,
    rollouts: UploadedFile | None = File(None, description="rollouts.jsonl (successes); optional with failures"),
    failures: UploadedFile | None = File(None, description="rollouts_failures.jsonl (the failures sidecar)"),
    materialized: UploadedFile | None = File(None, description="rollouts_materialized_inputs.jsonl (the task rows)"),
    name: str = Form("", description="defaults to the file names"),
):
    """The import page's three slots, as the page's background task (``import_views.import_job``):
    202 with the task (``url``: ``GET /tasks/{id}`` until its status is ``done``, then ``run`` is
    the new run, status ``imported``; or ``failed``, its ``message`` naming the file and line of a
    bad row). All or nothing; every imported file downloads again byte for byte. The same name and
    files while an import of them is queued or running answer that task again (nothing new is
    queued). Up to ``GYMWEB_MAX_UPLOAD_BYTES`` per file (413); 429 past
    ``GYMWEB_MAX_TASKS_PER_USER`` queued or running tasks."""
    from rollouts import background
    from rollouts.teams import team_for_new
    from rollouts.web.import_views import start_import

    limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
    uploads = {"rollouts": rollouts, "failures": failures, "materialized": materialized}
    for field, upload in uploads.items():
        if field in too_large_uploads(request) or (upload is not None and upload.size > limit):
            raise HttpError(413, upload_limit_message(limit))
    if rollouts is None and failures is None:
        raise FieldsError(
            "no file: send 'rollouts', 'failures' or both (and optionally 'materialized') as multipart fields",
            {"rollouts": ["this field is required"]},
        )
    try:
        task, _ = start_import(
            request.user,
            name,
            {f: [u] for f, u in uploads.items() if u is not None},
            team_id=team_for_new(request.user),  # a token of one team imports into that team
        )
    except background.TooManyTasks as exc:
        raise HttpError(429, str(exc)) from None
    return Status(202, task_out(task))


@api.get("/tasks/{task_id}", response=TaskOut, summary="A background task's status (an import)")
def get_task(request, task_id: int, response: HttpResponse):
    """One of the token's user's background tasks (404 for anyone else's): poll it until its
    ``status`` is ``done`` (``run``: what it made) or ``failed`` (``message``, ``errors``)."""
    from django.shortcuts import get_object_or_404

    from rollouts import background
    from rollouts.models import BackgroundTask

    response["Cache-Control"] = "no-store"  # a poll must see the task's progress, never a copy
    return task_out(background.current(get_object_or_404(BackgroundTask, pk=task_id, user=request.user)))


@api.get("/runs/{run_id}", response=RunDetailOut, summary="A run's status, progress and aggregates")
def get_run(request, run_id: int):
    run = run_for(request, run_id)
    summary = run_summary.run_summary(run)
    both = reward_aggregates(run)
    out = run_out(request, run, summary.progress)
    out["aggregates"] = {
        "reward": {**vars(summary.reward)},
        "reward_corrected": both["corrected"],
        "corrections": both["corrections"],
        "failure_kinds": {k["failure_kind"]: k["n"] for k in summary.failure_kinds},
        "terminal_failures": summary.terminal_failures,
        "tokens": summary.tokens,
        "usage_reported": summary.usage_reported,
        "finished_attempts": summary.finished_attempts,
    }
    return out


@api.post("/runs/{run_id}/cancel", response=RunOut, summary="Cancel a run")
def cancel_run(request, run_id: int):
    """Pending rollouts are cancelled at once, in-flight ones within seconds. A final run is left as it is."""
    run = run_for(request, run_id)
    runs.cancel(run)
    return run_out(request, run)


@api.post(
    "/runs/{run_id}/retry",
    response={200: RetryOut, 400: Error, 409: Error},
    summary="Retry failed and not-run rollouts",
)
def retry_run(request, run_id: int):
    """New attempts for failed keys (up to the run's max attempts; terminal failures never) and for
    cancelled or interrupted ones; ``retried`` says how many. 400 (nothing queued) when the target
    policy now refuses the run's agent or env URL: the message names the rule and the setting; 409
    while the run is archived (as every other action that needs its items)."""
    run = run_for(request, run_id)
    if run.status == Run.Status.IMPORTED:
        raise HttpError(400, "an imported run has no services to run against")
    if run.is_archived:
        raise HttpError(409, str(archive.RunArchived(run, "a retry")))
    try:
        environments.refresh_env_url(run)  # a NeMo Gym environment: found again by name
    except environments.HeadServerError as exc:
        raise HttpError(400, f"not retried: {exc}") from None
    refused = targets.refused_services(run.agent_url, run.env_url)
    if refused:  # nothing is queued: the attempts would only fail with target_refused
        raise HttpError(400, "not retried: " + " ".join(refused))
    n = runs.resume(run)
    run.refresh_from_db()
    return {"retried": n, "run": run_out(request, run)}


def _file(request, run_id: int, kind: str):
    run = run_for(request, run_id)
    qs, form = filtered(request, run)
    options = curated.ExportOptions.from_params(request.GET)
    refused = archive.download_refusal(run, kind, form.active, options.plain)
    if refused:
        raise HttpError(409, refused)
    return curated.streaming_response(
        curated.lines(run, kind, qs if form.active else None, options), export_filename(run.pk, kind, form), options
    )


_FILE_DOC = (
    "Streams NeMo Gym JSONL. Querystring: the run table's filter (as for /runs/{id}/rollouts), "
    "`reward_source=corrected` (rows' reward is the corrected one where in force; `_gymweb_reward_source` says which), "
    "`review=1` (adds `gymweb_review`). Headers X-Gymweb-Reward-Source and X-Gymweb-Review say what was used."
)


@api.get("/runs/{run_id}/rollouts.jsonl", summary="rollouts.jsonl (successes)", description=_FILE_DOC)
def file_rollouts(request, run_id: int):
    return _file(request, run_id, "rollouts")


@api.get(
    "/runs/{run_id}/rollouts_failures.jsonl",
    summary="rollouts_failures.jsonl (one row per failed attempt)",
    description=_FILE_DOC,
)
def file_failures(request, run_id: int):
    return _file(request, run_id, "rollouts_failures")


@api.get("/runs/{run_id}/rollouts_materialized_inputs.jsonl", summary="rollouts_materialized_inputs.jsonl")
def file_materialized(request, run_id: int):
    return _file(request, run_id, "rollouts_materialized_inputs")


@api.get(
    "/runs/{run_id}/sft.jsonl",
    summary="SFT export (OpenAI chat format)",
    description='The filtered successes as `{"messages", "tools"}` rows. `reasoning=keep|think|drop`, '
    '`reward_source`, `metadata=1`. See README, "SFT export".',
)
def file_sft(request, run_id: int, reasoning: str = "keep", metadata: bool = False):
    run = run_for(request, run_id)
    refused = archive.download_refusal(run, "sft", False, True)
    if refused:
        raise HttpError(409, refused)
    if reasoning not in sft.REASONING_MODES:
        raise HttpError(400, f"reasoning must be one of {', '.join(sft.REASONING_MODES)}")
    qs, form = filtered(request, run)
    options = curated.ExportOptions.from_params(request.GET)
    return curated.sft_response(
        run,
        qs if form.active else None,
        options,
        export_filename(run.pk, "sft", form),
        reasoning=reasoning,
        metadata=metadata,
    )


@api.post(
    "/runs/{run_id}/selection/dataset",
    response={201: DatasetOut, 400: Error},
    summary="Make a dataset of the tasks of a filtered list",
)
def selection_dataset(request, run_id: int, name: str = ""):
    """The querystring is the run table's filter; each task with a rollout in the list gives one row."""
    run = run_for(request, run_id)
    if len(name) > 200:
        message = f"the name has {len(name):,} characters; at most 200"
        raise FieldsError(message, {"name": [message]})
    qs, form = filtered(request, run)
    try:
        dataset = selection.dataset_from_selection(
            run, qs, filters=form.querystring(sort=""), user=request.user, name=name or None
        )
    except ReviewError as exc:
        raise review_error(exc) from None
    return Status(201, dataset_out(dataset))
