"""The HTTP API for scripts and training loops (django-ninja), under ``/api/v1/``.

Auth: ``Authorization: Bearer <token>``, a per-user token made on the account page
(``rollouts.tokens``). No token, a malformed header or an unknown/revoked token: 401 with
``{"detail": "Unauthorized"}`` and nothing else (django-ninja checks auth before it reads any
parameter). A token sees what its user sees: access goes through the run pages' rule
(``rollouts.web.access.run_for``). The schema is at ``/api/v1/openapi.json`` (public: it holds no
data). No cookies are read, so no CSRF token is needed.

The API reuses the pages' code for every rule: a run is validated by the new-run form (``RunForm``:
target URLs, timeouts, overrides, size) and launched like the form launches it; rollout lists take
the run table's filter (``RolloutFilterForm``, also the review filters); files stream through
``rollouts.review.curated``; labels, notes and corrections go through ``rollouts.review.actions``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models.functions import Substr
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import File, Form, NinjaAPI, Query, Schema
from ninja.errors import HttpError
from ninja.files import UploadedFile
from ninja.parser import Parser
from ninja.responses import Status
from ninja.security import HttpBearer
from pydantic import Field

from rollouts import targets
from rollouts.api.openapi import complete
from rollouts.collection import archive, environments, runs
from rollouts.collection.datasets import DatasetError, read_jsonl
from rollouts.engine.contract import NotJSON, strict_loads
from rollouts.evaluation import run_summary
from rollouts.lossless import LosslessTextField
from rollouts.models import Dataset, Label, RefusedReply, Rollout, Run
from rollouts.review import actions, curated, selection, sft
from rollouts.review.actions import ReviewError
from rollouts.review.corrected_summary import reward_aggregates
from rollouts.review.filters import corrected_reward
from rollouts.review.query import export_filename, filtered_rollouts
from rollouts.tokens import user_for_token
from rollouts.web.access import run_for
from rollouts.web.refused import refused_data
from rollouts.web.uploads import too_large_uploads, upload_limit_message

MAX_PAGE = 1000
MAX_OFFSET = 10**12  # past any table; larger ones would overflow the database's bigint (a 500)
OFFSET = Query(0, ge=0, le=MAX_OFFSET, description="rows to skip (0 to 10^12)")


class TokenAuth(HttpBearer):
    """``Authorization: Bearer gw_…`` → the token's active user (also set as ``request.user``)."""

    def authenticate(self, request: HttpRequest, token: str):
        user = user_for_token(token)
        if user is not None:
            request.user = user
        return user


class StrictJSONParser(Parser):
    """Request bodies read by ``contract.strict_loads``, the reader of every other JSON gymweb takes
    in: NaN/Infinity, numbers past a float (``1e400``) and unpaired surrogate escapes
    (``"\\ud800"``, which no database or file can hold) are refused. ninja turns any parse error
    into a 400; the reason is kept on the request so that 400 names it (``_http_error``)."""

    def parse_body(self, request: HttpRequest):
        try:
            return strict_loads(request.body)
        except NotJSON as exc:
            request._gymweb_body_error = f"the request body is not valid JSON: {exc}"
            raise


# The published operationIds (``rollouts_review_api_list_runs``, …): ninja derives them from the
# view's module, so each module of this package keeps its published prefix and generated clients
# keep their method names.
OPERATION_ID_PREFIXES = {
    "rollouts.api.router": "rollouts_review_api",
    "rollouts.api.trainer": "rollouts_review_trainer_api",
    "rollouts.api.archive": "rollouts_review_api_archive",
}


class GymwebAPI(NinjaAPI):
    """``NinjaAPI`` whose OpenAPI document also declares what the routes' signatures cannot
    (``rollouts.api.openapi``: filter values, 401/403/404 answers, file content types), with the
    published operationIds (``OPERATION_ID_PREFIXES``)."""

    def get_openapi_schema(self, *args, **kwargs):
        return complete(super().get_openapi_schema(*args, **kwargs))

    def get_openapi_operation_id(self, operation) -> str:
        module = operation.view_func.__module__
        prefix = OPERATION_ID_PREFIXES.get(module, module.replace(".", "_"))
        return f"{prefix}_{operation.view_func.__name__}"


api = GymwebAPI(
    title="gymweb API",
    version="1",
    description="Datasets, runs, NeMo Gym files and review for scripts and training loops. "
    "Send `Authorization: Bearer <token>` (make one on your account page).",
    auth=TokenAuth(),
    urls_namespace="api",
    parser=StrictJSONParser(),
    docs_url=None,  # the interactive docs page loads its script from a CDN; the schema is enough
)


# -- schemas -------------------------------------------------------------------------------------
class Error(Schema):
    detail: str
    errors: dict[str, list[str]] = Field(default_factory=dict, description="per field, when a form rejected the input")


class DatasetOut(Schema):
    id: int
    name: str
    num_rows: int
    sha256: str
    created: datetime
    source_run: int | None = Field(None, description="the run whose filtered list these tasks came from")
    source_filters: str = Field("", description="that list's filter querystring")


class ProgressOut(Schema):
    total: int
    done: int
    succeeded: int
    failed: int
    pending: int
    running: int
    not_run: int = Field(..., description="cancelled or interrupted keys that a retry runs again")
    failed_attempts: int
    percent: float


class TasksFrom(Schema):
    dataset: int | None
    dataset_name: str = ""
    source_run: int | None = None
    source_filters: str = ""


class RunOut(Schema):
    id: int
    name: str
    status: str = Field(..., description="queued, running, completed, cancelled or imported")
    final: bool
    created: datetime
    started: datetime | None
    finished: datetime | None
    agent_url: str
    env_url: str
    url_changes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="each resume that switched URLs: {at, agent_url: [old, new], env_url: [old, new]}",
    )
    agent_name: str
    num_tasks: int
    num_keys: int
    tasks_from: TasksFrom
    progress: ProgressOut
    url: str
    archived: datetime | None = Field(
        None, description="when the run was archived (its items are in files); null when they are here"
    )


class RewardStatsOut(Schema):
    n: int
    mean: float | None
    minimum: float | None
    maximum: float | None
    median: float | None
    std: float | None
    mean_with_failures: float | None = Field(None, description="failures (latest attempt failed) count as 0")
    n_with_failures: int


class AggregatesOut(Schema):
    reward: RewardStatsOut = Field(..., description="the env's rewards, over successes (NeMo Gym's convention)")
    reward_corrected: RewardStatsOut = Field(
        ..., description="the corrected reward where one is in force, the env's elsewhere"
    )
    corrections: int
    failure_kinds: dict[str, int]
    terminal_failures: int
    tokens: dict[str, int | None]
    usage_reported: int
    finished_attempts: int


class RunDetailOut(RunOut):
    aggregates: AggregatesOut


class RetryOut(Schema):
    retried: int
    run: RunOut


class LabelUse(Schema):
    name: str
    by: str | None
    at: datetime


class NoteOut(Schema):
    id: int
    text: str
    item: int | None = Field(None, description="the trajectory item (#N) it is on; null = the whole rollout")
    by: str | None
    at: datetime


class CorrectionOut(Schema):
    reward: float
    reason: str
    by: str | None
    at: datetime


class RolloutOut(Schema):
    id: int
    run: int
    task_index: int
    rollout_index: int
    attempt: int
    status: str
    reward: float | None = Field(None, description="the env's reward")
    corrected_reward: float | None = Field(None, description="the corrected reward in force, if any")
    failure_kind: str
    error: str = Field("", description="the first 500 characters")
    terminal: bool
    duration_ms: float | None
    num_agent_calls: int
    num_tool_calls: int
    total_tokens: int | None
    labels: list[str]
    notes: int
    url: str


class RolloutPage(Schema):
    count: int
    offset: int
    limit: int
    items: list[RolloutOut]


class ReplyErrorOut(Schema):
    path: list[str | int] = Field(..., description="JSON path into the body: object keys and list indices")
    message: str


class RefusedReplyOut(Schema):
    http_status: int
    content_type: str
    size: int = Field(..., description="the whole body's length in bytes")
    truncated: bool = Field(..., description="only the first GYMWEB_FAILED_REPLY_MAX_BYTES bytes are kept")
    errors: list[ReplyErrorOut] = Field(..., description="validation errors of an invalid Responses object")
    body: str = Field(
        ..., description="the kept body as UTF-8 text (undecodable bytes as U+FFFD); model output: escape it"
    )


class RolloutDetailOut(RolloutOut):
    agent_url: str = Field("", description="the agent base URL this attempt ran against")
    env_url: str = Field("", description="the env base URL this attempt ran against")
    refused_reply: RefusedReplyOut | None = Field(
        None, description="the agent reply gymweb refused, ending this attempt"
    )
    label_uses: list[LabelUse]
    note_list: list[NoteOut]
    correction: CorrectionOut | None


class LabelIn(Schema):
    label: str


class NoteIn(Schema):
    text: str
    item: int | None = None


class CorrectionIn(Schema):
    reward: float = Field(..., strict=True, description="a finite number (true/false or a string are refused)")
    reason: str


class LabelOut(Schema):
    name: str
    description: str
    position: int


class NewLabelIn(Schema):
    name: str
    description: str = ""


# -- helpers -------------------------------------------------------------------------------------
def _absolute(request, path: str) -> str:
    return request.build_absolute_uri(path)


def _dataset_out(d: Dataset) -> dict[str, Any]:
    return {
        "id": d.pk,
        "name": d.name,
        "num_rows": d.num_rows,
        "sha256": d.sha256,
        "created": d.created,
        "source_run": d.source_run_id,
        "source_filters": d.source_filters,
    }


def run_out(request, run: Run, progress: run_summary.Progress | None = None) -> dict[str, Any]:
    p = progress or run_summary.run_progress(run)
    dataset = run.dataset
    return {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "final": run.is_final,
        "created": run.created,
        "started": run.started,
        "finished": run.finished,
        "agent_url": run.agent_url,
        "env_url": run.env_url,
        "url_changes": run.url_changes or [],
        "agent_name": run.agent_name,
        "num_tasks": run.num_tasks,
        "num_keys": run.num_keys,
        "tasks_from": {
            "dataset": run.dataset_id,
            "dataset_name": dataset.name if dataset else "",
            "source_run": dataset.source_run_id if dataset else None,
            "source_filters": dataset.source_filters if dataset else "",
        },
        "progress": {
            "total": p.total,
            "done": p.done,
            "succeeded": p.succeeded,
            "failed": p.failed,
            "pending": p.pending,
            "running": p.running,
            "not_run": p.not_run,
            "failed_attempts": p.failed_attempts,
            "percent": p.percent,
        },
        "url": _absolute(request, run.get_absolute_url()),
        "archived": run.archived,
    }


class FieldsError(HttpError):
    """An HTTP 400 whose body also names the fields at fault (``errors``: field name → messages)."""

    def __init__(self, message: str, errors: dict[str, list[str]], status: int = 400):
        super().__init__(status, message)
        self.errors = errors


def form_error(form) -> FieldsError:
    errors = {name: [str(e) for e in errs] for name, errs in form.errors.items()}
    first = next(iter(errors.items()), ("", ["invalid input"]))
    detail = f"{first[0]}: {first[1][0]}" if first[0] and first[0] != "__all__" else first[1][0]
    return FieldsError(detail, errors)


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    body = {"detail": getattr(request, "_gymweb_body_error", None) or exc.message}
    if isinstance(exc, FieldsError) and exc.errors:
        body["errors"] = exc.errors
    return api.create_response(request, body, status=exc.status_code)


def rollout_for(request, rollout_id: int) -> Rollout:
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id)
    run_for(request, rollout.run_id)  # the same access rule as the pages
    return rollout


def _rollout_out(request, r: Rollout, labels: list[str], notes: int, corrected: float | None) -> dict[str, Any]:
    return {
        "id": r.pk,
        "run": r.run_id,
        "task_index": r.task_index,
        "rollout_index": r.rollout_index,
        "attempt": r.attempt,
        "status": r.status,
        "reward": r.reward,
        "corrected_reward": corrected,
        "failure_kind": r.failure_kind,
        "error": r.error_head if hasattr(r, "error_head") else (r.error or "")[:500],
        "terminal": r.terminal,
        "duration_ms": r.duration_ms,
        "num_agent_calls": r.num_agent_calls,
        "num_tool_calls": r.num_tool_calls,
        "total_tokens": r.total_tokens if r.usage_reported else None,
        "labels": labels,
        "notes": notes,
        "url": _absolute(request, r.get_absolute_url()),
    }


def rollout_detail(request, rollout: Rollout) -> dict[str, Any]:
    state = actions.review_state(rollout)
    corr = state.correction
    out = _rollout_out(
        request, rollout, [e["label"].name for e in state.on], len(state.notes), corr.reward if corr else None
    )
    out["agent_url"], out["env_url"] = rollout.agent_url, rollout.env_url
    out["refused_reply"] = refused_data(RefusedReply.objects.filter(rollout=rollout).first())
    out["label_uses"] = [{"name": e["label"].name, "by": e["use"]["by"], "at": e["use"]["created"]} for e in state.on]
    out["note_list"] = [
        {
            "id": n.pk,
            "text": n.text,
            "item": n.item_seq,
            "by": n.created_by.get_username() if n.created_by else None,
            "at": n.created,
        }
        for n in state.notes
    ]
    out["correction"] = (
        None
        if corr is None
        else {
            "reward": corr.reward,
            "reason": corr.reason,
            "by": corr.created_by.get_username() if corr.created_by else None,
            "at": corr.created,
        }
    )
    return out


def _filtered(request, run: Run):
    """The run's rollouts under the querystring's filter (the run table's); 400 on an invalid value."""
    qs, form = filtered_rollouts(run, request.GET)
    if form.errors:
        raise form_error(form)
    return qs, form


def _review_error(exc: ReviewError) -> HttpError:
    return FieldsError(str(exc), {exc.field: [str(exc)]}) if exc.field else HttpError(400, str(exc))


# -- datasets ------------------------------------------------------------------------------------
@api.get("/datasets", response=list[DatasetOut], summary="List datasets (newest first)")
def list_datasets(request, limit: int = 100, offset: int = OFFSET):
    limit = max(1, min(limit, MAX_PAGE))
    return [
        _dataset_out(d) for d in Dataset.objects.order_by("-created", "-id")[max(offset, 0) : max(offset, 0) + limit]
    ]


@api.post("/datasets", response={201: DatasetOut, 400: Error, 413: Error}, summary="Upload a JSONL dataset")
def create_dataset(
    request,
    file: UploadedFile | None = File(None, description="NeMo Gym JSONL: one task per line"),
    name: str = Form("", description="defaults to the file name"),
):
    """Validated like the new-run form's upload: a bad line is reported with its line number and
    nothing is stored. Up to ``GYMWEB_MAX_UPLOAD_BYTES`` (the upload handler stops a larger file
    before it is stored: 413)."""
    limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
    if "file" in too_large_uploads(request) or (file is not None and file.size > limit):
        raise HttpError(413, upload_limit_message(limit))
    if file is None:
        raise FieldsError(
            "no file: send the dataset as the multipart field 'file'", {"file": ["this field is required"]}
        )
    source = (file.name or "dataset.jsonl").rsplit("/", 1)[-1]
    try:
        parsed = read_jsonl(file, source=source)
    except DatasetError as exc:
        raise FieldsError(str(exc), {"file": [str(exc)]}) from None
    if len(name) > 200:  # the column's size: a cut name would be stored otherwise than sent
        message = f"the name has {len(name):,} characters; at most 200"
        raise FieldsError(message, {"name": [message]})
    dataset = runs.store_dataset(parsed, (name or source)[:200], user=request.user)
    return Status(201, _dataset_out(dataset))


@api.get("/datasets/{dataset_id}", response=DatasetOut, summary="One dataset")
def get_dataset(request, dataset_id: int):
    return _dataset_out(get_object_or_404(Dataset, pk=dataset_id))


# -- runs ----------------------------------------------------------------------------------------
@api.get("/runs", response=list[RunOut], summary="List runs (newest first)")
def list_runs(request, limit: int = 50, offset: int = OFFSET):
    limit = max(1, min(limit, MAX_PAGE))
    page = list(
        Run.objects.select_related("dataset").order_by("-created", "-id")[max(offset, 0) : max(offset, 0) + limit]
    )
    progress = run_summary.progress_for_runs(page)
    return [run_out(request, run, progress[run.pk]) for run in page]


@api.post(
    "/runs/import", response={201: RunOut, 400: Error, 413: Error}, summary="Import NeMo Gym output files as a run"
)
def import_run(
    request,
    rollouts: UploadedFile | None = File(None, description="rollouts.jsonl (successes); optional with failures"),
    failures: UploadedFile | None = File(None, description="rollouts_failures.jsonl (the failures sidecar)"),
    materialized: UploadedFile | None = File(None, description="rollouts_materialized_inputs.jsonl (the task rows)"),
    name: str = Form("", description="defaults to the file names"),
):
    """The import page's three slots (``collection.importer``): a new run with status ``imported``,
    all or nothing; a bad line is reported with its file and line (``errors`` names the field).
    Every imported file downloads again byte for byte. Up to ``GYMWEB_MAX_UPLOAD_BYTES`` per file."""
    from rollouts.collection.importer import import_shards
    from rollouts.evaluation import health

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
    sources = {field: (u.name or f"{field}.jsonl").rsplit("/", 1)[-1] for field, u in uploads.items() if u is not None}
    pick = lambda field: [(uploads[field], sources[field])] if uploads[field] is not None else []  # noqa: E731
    try:
        summary = import_shards(
            pick("rollouts"), pick("failures"), pick("materialized"), name=name[:200], user=request.user
        )
    except DatasetError as exc:
        field = next((f for f, src in sources.items() if src == exc.source), "rollouts")
        raise FieldsError(str(exc), {field: [str(exc)]}) from None
    health.auto_check(summary.run)
    return Status(201, run_out(request, summary.run))


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


@api.post("/runs/{run_id}/retry", response={200: RetryOut, 400: Error}, summary="Retry failed and not-run rollouts")
def retry_run(request, run_id: int):
    """New attempts for failed keys (up to the run's max attempts; terminal failures never) and for
    cancelled or interrupted ones; ``retried`` says how many. 400 (nothing queued) when the target
    policy now refuses the run's agent or env URL: the message names the rule and the setting."""
    run = run_for(request, run_id)
    if run.status == Run.Status.IMPORTED:
        raise HttpError(400, "an imported run has no services to run against")
    if run.is_archived:
        raise HttpError(400, str(archive.RunArchived(run, "a retry")))
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
    qs, form = _filtered(request, run)
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
    qs, form = _filtered(request, run)
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
    qs, form = _filtered(request, run)
    try:
        dataset = selection.dataset_from_selection(
            run, qs, filters=form.querystring(sort=""), user=request.user, name=name or None
        )
    except ReviewError as exc:
        raise _review_error(exc) from None
    return Status(201, _dataset_out(dataset))


# -- rollouts ------------------------------------------------------------------------------------
@api.get(
    "/runs/{run_id}/rollouts",
    response={200: RolloutPage, 400: Error},
    summary="List a run's rollouts, filtered like the run page",
)
def list_rollouts(
    request,
    run_id: int,
    limit: int = 100,
    offset: int = OFFSET,
    status: str = "",
    kind: str = "",
    reward_min: float | None = None,
    reward_max: float | None = None,
    task: int | None = None,
    sort: str = "",
    label: str = "",
    not_label: str = "",
    notes: str = "",
    corrected: str = "",
    reward_source: str = "",
    text: str = "",
    tool: str = "",
    output: str = "",
    error: str = "",
):
    """Every filter of the run page's table (and any it gains): the querystring is read by the same
    form, so an invalid value is a 400 naming it. Ordered like the table (``sort``). Content search
    (``rollouts.search``): ``text`` in any item, ``tool`` called (exact name), ``output`` in a tool
    output, ``error`` in the failure message; case-insensitive substrings."""
    run = run_for(request, run_id)
    qs, _form = _filtered(request, run)
    limit, offset = max(1, min(limit, MAX_PAGE)), max(offset, 0)
    count = qs.order_by().count()
    ids = list(qs.values_list("id", flat=True)[offset : offset + limit])
    loaded = (
        Rollout.objects.filter(id__in=ids)
        .annotate(error_head=Substr("error", 1, 500, output_field=LosslessTextField()), corrected=corrected_reward())
        .defer("verify_json", "profile_json", "partial_response_json")
        .in_bulk()
    )
    page = [loaded[i] for i in ids if i in loaded]
    actions.attach_to_rows(page)
    items = [_rollout_out(request, r, r.review_label_names, r.review_note_count, r.corrected) for r in page]
    return {"count": count, "offset": offset, "limit": limit, "items": items}


@api.post(
    "/rollouts/{rollout_id}/labels", response={200: RolloutDetailOut, 400: Error}, summary="Put a label on a rollout"
)
def add_label(request, rollout_id: int, payload: LabelIn):
    rollout = rollout_for(request, rollout_id)
    try:
        actions.set_label(rollout, actions.find_label(payload.label), True, request.user)
    except ReviewError as exc:
        raise _review_error(exc) from None
    return rollout_detail(request, rollout)


@api.delete(
    "/rollouts/{rollout_id}/labels/{label}",
    response={200: RolloutDetailOut, 400: Error},
    summary="Take a label off a rollout",
)
def remove_label(request, rollout_id: int, label: str):
    rollout = rollout_for(request, rollout_id)
    try:
        actions.set_label(rollout, actions.find_label(label), False, request.user)
    except ReviewError as exc:
        raise _review_error(exc) from None
    return rollout_detail(request, rollout)


@api.post(
    "/rollouts/{rollout_id}/notes",
    response={201: NoteOut, 400: Error},
    summary="Add a note to a rollout or one of its items",
)
def add_note(request, rollout_id: int, payload: NoteIn):
    rollout = rollout_for(request, rollout_id)
    try:
        note = actions.add_note(rollout, payload.text, request.user, item=payload.item)
    except ReviewError as exc:
        raise _review_error(exc) from None
    return Status(
        201,
        {
            "id": note.pk,
            "text": note.text,
            "item": note.item_seq,
            "by": request.user.get_username(),
            "at": note.created,
        },
    )


@api.post(
    "/rollouts/{rollout_id}/correction",
    response={200: RolloutDetailOut, 400: Error},
    summary="Record a corrected reward",
)
def correct(request, rollout_id: int, payload: CorrectionIn):
    """Kept beside the env's reward, never replacing it; the reason is required."""
    rollout = rollout_for(request, rollout_id)
    try:
        actions.correct_reward(rollout, payload.reward, payload.reason, request.user)
    except ReviewError as exc:
        raise _review_error(exc) from None
    return rollout_detail(request, rollout)


@api.delete("/rollouts/{rollout_id}/correction", response=RolloutDetailOut, summary="Withdraw the corrected reward")
def withdraw(request, rollout_id: int, reason: str = ""):
    rollout = rollout_for(request, rollout_id)
    actions.withdraw_correction(rollout, request.user, reason)
    return rollout_detail(request, rollout)


# -- labels --------------------------------------------------------------------------------------
@api.get("/labels", response=list[LabelOut], summary="The instance's labels, in order (the first nine answer keys 1–9)")
def list_labels(request):
    return [
        {"name": lab.name, "description": lab.description, "position": lab.position}
        for lab in Label.objects.order_by("position", "id")
    ]


@api.post("/labels", response={201: LabelOut, 400: Error}, summary="Add a label")
def create_label(request, payload: NewLabelIn):
    try:
        lab = actions.create_label(payload.name, payload.description, request.user)
    except ReviewError as exc:
        raise _review_error(exc) from None
    return Status(201, {"name": lab.name, "description": lab.description, "position": lab.position})


# The training-loop routes (POST /runs, GET /runs/{id}/results, GET /rollouts/{id}) register on `api`.
# Delete, archive and restore (DELETE /runs/{id}, POST /runs/{id}/archive, /restore): their own module.
from rollouts.api import archive as archive_routes
from rollouts.api import trainer  # noqa: F401

api.delete(archive_routes.DELETE_PATH, **archive_routes.DELETE_ROUTE)(archive_routes.delete_run)
api.add_router("", archive_routes.router)
