"""The API's routes for training loops (registered on ``rollouts.api.router.api``): batches in
(``POST /runs`` with the task rows inline), results out as they finish (``GET /runs/{id}/results``,
NDJSON) and one rollout whole (``GET /rollouts/{id}``). ``docs/trainer-api.md`` describes them;
``gymweb.client`` is their Python client.

Rows are the NeMo Gym rows of the run's files, made by the files' own writer
(``rollouts.collection.export``): a success as ``rollouts.jsonl`` has it, a failure as the failures
sidecar has it. The stream's order is the finishing order (``Rollout.result_seq``); its cursor is
the number of rows already read, so a client that reconnects with ``?after=<rows it has>`` gets
every row exactly once.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile as DjangoUploadedFile
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Query, Schema
from ninja.errors import HttpError
from ninja.responses import Status
from pydantic import ConfigDict, Field, ValidationError

from rollouts.api.errors import FieldsError, form_error
from rollouts.api.lookups import rollout_for
from rollouts.api.open_streams import SLOTS, HeldStream, client_gone
from rollouts.api.payloads import rollout_detail, run_out
from rollouts.api.result_wait import ResultWait
from rollouts.api.router import api
from rollouts.api.schemas import Error, RolloutDetailOut, RunOut, StreamRefusedOut
from rollouts.collection import archive, export, run_settings
from rollouts.collection.datasets import INLINE_SOURCE, DatasetError, too_long_reason, validate_row
from rollouts.engine.contract import NotJSON, strict_loads
from rollouts.evaluation.run_aggregate_metrics import NOT_ASKED
from rollouts.lossless import dumps
from rollouts.models import AgentCall, Rollout, Run
from rollouts.web.access import launch_from_form, run_for
from rollouts.web.forms import RunForm
from rollouts.web.uploads import upload_limit_message

NDJSON = "application/x-ndjson"
JSONL_TYPES = (
    "application/x-ndjson",
    "application/jsonl",
    "application/x-jsonlines",
    "application/jsonlines",
    "text/plain",
)
FINISHED = (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED)
CHUNK = 500


# -- batches in ----------------------------------------------------------------------------------
class RunSettings(Schema):
    """A run's settings (the new-run form's fields; limits and defaults: ``run_settings``). A field
    it does not know is refused (a misspelt setting would otherwise leave its default in force)."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    agent_url: str
    env_url: str
    agent_name: str = run_settings.DEFAULT_AGENT_NAME
    concurrency: int = run_settings.default("concurrency")
    max_steps: int | None = None
    num_repeats: int = run_settings.default("num_repeats")
    limit: int | None = None
    max_attempts: int = run_settings.default("max_attempts")
    remote_responses_timeout_s: float = run_settings.default("remote_responses_timeout_s")
    run_timeout_s: float | None = Field(
        None, description="default: 2100, or GYMWEB_MAX_RUN_TIMEOUT_S when that is lower"
    )
    env_max_in_flight: int = Field(
        run_settings.default("env_max_in_flight"),
        description="most of this run's env calls (seed, tool calls, verify) out at once, shared among worker "
        "processes; the rest wait and the oldest rollout's call goes next, so results come in the order rollouts "
        "started (for an env that is one process, as most NeMo Gym resources servers). "
        "0: the server's GYMWEB_ENV_MAX_IN_FLIGHT per worker process (0 there: no bound)",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="merged into every row's responses_create_params",
        examples=[{"temperature": 0.7}],  # Swagger UI's prefilled body: a real setting, not additionalProp1
    )
    env_aggregate_metrics: bool = Field(
        True,
        description="ask the env's /aggregate_metrics when the run completes (as `gym eval run` does); "
        "false: never (as NeMo Gym's run_examples; gymweb's client for training loops), "
        "the run's aggregates are then computed by gymweb",
    )


class RunIn(RunSettings):
    team: int | None = Field(
        None, description="the team the run (and inline rows) go to, one of yours; default: your first team"
    )
    dataset: int | None = Field(None, description="a stored dataset's id (POST /datasets); or send `rows`")
    rows: list[Any] | None = Field(
        None, description="the task rows inline (NeMo Gym dataset rows), instead of `dataset`"
    )


def _bad(detail: str, field: str, status: int = 400) -> HttpError:
    return FieldsError(detail, {field: [detail]}, status)


def _read_body(request: HttpRequest) -> tempfile.SpooledTemporaryFile:
    """The request body in a spooled file, refused (413) past ``GYMWEB_MAX_UPLOAD_BYTES``, the
    limit of a dataset file."""
    limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared.isdigit() and int(declared) > limit:
        raise _bad(upload_limit_message(limit), "rows", 413)
    spool = tempfile.SpooledTemporaryFile(max_size=int(settings.FILE_UPLOAD_MAX_MEMORY_SIZE))
    size = 0
    while True:
        chunk = request.read(1 << 20)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            spool.close()
            raise _bad(upload_limit_message(limit), "rows", 413)
        spool.write(chunk)
    spool.seek(0)
    return spool


def _settings_from(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The run settings in ``data`` (``where``: "body", JSON values taken strictly, so ``true`` or
    ``"4"`` is no number; or "querystring", text read as numbers), or a 400 naming the field."""
    try:
        parsed = RunIn.model_validate(data, strict=where == "body")
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        if first["type"] == "extra_forbidden":
            known = ", ".join(RunIn.model_fields)
            raise _bad(f"{field}: not a run setting ({where}); the settings are: {known}", field) from None
        raise _bad(f"{field}: {first['msg']} ({where})", field) from None
    return parsed.model_dump()


def _as_upload(spool, name: str, size: int) -> DjangoUploadedFile:
    return DjangoUploadedFile(file=spool, name=name, content_type="application/jsonl", size=size)


def _query_settings() -> list[tuple[str, dict[str, Any], str]]:
    """Each run setting as a querystring parameter (a JSONL body's settings): its name, its JSON
    schema as the JSON body's (``overrides``: JSON text) and its description."""
    out = []
    for name, prop in RunSettings.model_json_schema()["properties"].items():
        about = prop.get("description", "")
        if prop.get("type") == "object":
            schema: dict[str, Any] = {"type": "string", "description": "a JSON object, as text"}
        else:
            schema = {k: v for k, v in prop.items() if k in ("type", "anyOf", "default")}
        out.append((name, schema, about))
    return out


@api.post(
    "/runs",
    response={201: RunOut, 400: Error, 413: Error, 415: Error},
    summary="Launch a run: task rows inline or a stored dataset",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": RunIn.model_json_schema(ref_template="#/components/schemas/{model}")},
                NDJSON: {
                    "schema": {
                        "type": "string",
                        "description": "JSONL: one task row per line; the run settings go in the querystring",
                    }
                },
            },
        },
        "parameters": [
            {
                "name": name,
                "in": "query",
                "required": False,
                "schema": schema,
                "description": f"with a JSONL body: the run setting `{name}`" + (f" ({about})" if about else ""),
            }
            for name, schema, about in _query_settings()
        ],
    },
)
def create_run(request):
    """The tasks come either inline or as a stored dataset:

    - `application/json`: an object with the run settings and either `dataset` (an id) or `rows`
      (a JSON array of task rows);
    - `application/x-ndjson` (or `application/jsonl`): the body is the rows, one per line, and the
      run settings are in the querystring (`?agent_url=...&env_url=...&num_repeats=4`).

    Rows are validated as a dataset file is (same rules, same size limits,
    `GYMWEB_MAX_UPLOAD_BYTES` and `GYMWEB_MAX_LINE_BYTES`); the settings by the new-run form. Any
    error is a 400 naming the row (or line) and the field, and nothing is stored. Answers at once
    with the run, launched: an idle worker starts it within tens of milliseconds."""
    ctype = (request.content_type or "").lower()
    spool = _read_body(request)
    try:
        return _create_run(request, ctype, spool)
    finally:
        spool.close()


def _jsonl_request(request, spool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A JSONL body's settings (the querystring) and its rows as the form's upload."""
    twice = sorted(k for k, values in request.GET.lists() if len(values) > 1)
    if twice:
        raise _bad(f"the querystring names {twice[0]!r} more than once: send each setting once", twice[0])
    query: dict[str, Any] = dict(request.GET.items())
    if query.get("overrides"):  # JSON text in the querystring
        try:
            query["overrides"] = strict_loads(query["overrides"])
        except NotJSON as exc:
            raise _bad(f"overrides: not valid JSON ({exc})", "overrides") from None
    data = _settings_from(query, "querystring")
    spool.seek(0, 2)
    size = spool.tell()
    spool.seek(0)
    return data, {"dataset_file": _as_upload(spool, INLINE_SOURCE, size)}


def _json_request(request, ctype: str, spool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A JSON body's settings and its ``rows`` (if sent) as the form's upload."""
    if ctype not in ("", "application/json"):
        raise _bad(f"unsupported Content-Type {ctype!r}: send application/json or application/x-ndjson", "body", 415)
    if request.GET:  # ignored, they would leave the body's (or the default) values in force unsaid
        name = next(iter(request.GET))
        raise _bad(
            f"{name!r} is in the querystring: with a JSON body every setting goes in the body "
            "(the querystring carries them only for a JSONL body)",
            name,
        )
    raw = spool.read()
    try:
        body = strict_loads(raw, unique_keys=True)  # as a dataset file's rows: a key named twice is refused
    except NotJSON as exc:
        place = _refused_place(raw)
        if place is None:
            raise _bad(f"the request body is not valid JSON: {exc}", "body") from None
        raise _bad(f"{place[0]}: not valid JSON: {exc}", place[1]) from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object (the run settings with `rows` or `dataset`)", "body")
    data = _settings_from(body, "body")
    rows = data.pop("rows")
    if rows is None:
        return data, {}
    if data["dataset"] is not None:
        raise _bad("send either `rows` or `dataset`, not both", "rows")
    return data, {"dataset_file": _rows_upload(rows)}


def _create_run(request, ctype: str, spool) -> Status:
    jsonl = ctype in JSONL_TYPES
    data, files = _jsonl_request(request, spool) if jsonl else _json_request(request, ctype, spool)
    field = "body" if jsonl else "rows"
    data.pop("rows", None)
    # Not a form field: a run without the env's aggregates keeps the reason from the start.
    extra = {} if data.pop("env_aggregate_metrics") else {"aggregate_metrics_error": NOT_ASKED}
    if data["run_timeout_s"] is None:
        data["run_timeout_s"] = run_settings.default("run_timeout_s")
    data["overrides"] = json.dumps(data["overrides"]) if data["overrides"] else ""
    data = {k: ("" if v is None else v) for k, v in data.items()}
    form = RunForm(data=data, files=files, user=request.user)
    if not form.is_valid():
        err = form_error(form)
        if "dataset_file" in err.errors:  # the rows: say so under the name they were sent as
            first = err.message.startswith("dataset_file")
            err.errors[field] = err.errors.pop("dataset_file")
            if first:
                err.message = err.errors[field][0]
        raise err
    run, _reused = launch_from_form(form, request.user, **extra)
    return Status(201, run_out(request, run))


def _refused_place(raw: bytes) -> tuple[str, str] | None:
    """Where, in a body that plain ``json.loads`` reads, ``strict_loads`` found what it refused
    (NaN, ``1e400``, an unpaired surrogate escape): ``("rows[2] (row 3)", "rows")`` or a setting's
    ``(name, name)``; None when it cannot tell (a key named twice: ``json.loads`` keeps one)."""
    try:
        loose = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(loose, dict):
        return None
    for name, value in loose.items():
        parts = enumerate(value) if name == "rows" and isinstance(value, list) else [(None, value)]
        for i, part in parts:
            try:  # NaN and inf are written as NaN/Infinity, a surrogate as \udXXX: refused again
                strict_loads(json.dumps(part))
            except (NotJSON, ValueError, RecursionError):
                return (str(name)[:100], str(name)[:100]) if i is None else (f"rows[{i}] (row {i + 1})", "rows")
    return None


def _rows_upload(rows: list) -> DjangoUploadedFile:
    """Task rows sent inline, each validated as a dataset row, as the JSONL upload the new-run
    form reads (``INLINE_SOURCE``)."""
    if not rows:
        raise _bad("`rows` is empty: send at least one task row", "rows")
    for i, row in enumerate(rows):
        try:
            validate_row(row, i + 1, "")
        except DatasetError as exc:
            raise _bad(f"rows[{i}] (row {i + 1}): {exc.reason}", "rows") from None
    limit = int(settings.GYMWEB_MAX_LINE_BYTES)
    inline = tempfile.SpooledTemporaryFile(max_size=int(settings.FILE_UPLOAD_MAX_MEMORY_SIZE))
    for i, row in enumerate(rows):
        line = dumps(row).encode("utf-8", "surrogatepass")
        if len(line) > limit:  # as a file's line would be: named by its place in `rows`, not a line
            inline.close()
            raise _bad(f"rows[{i}] (row {i + 1}): {too_long_reason(limit, 'row')} once written as JSON", "rows")
        inline.write(line + b"\n")
    size = inline.tell()
    inline.seek(0)
    return _as_upload(inline, INLINE_SOURCE, size)


# -- results out ---------------------------------------------------------------------------------
class _Rows:
    """Reads a run's finished attempts in finishing order from a position, keeping its place
    between reads: rows without a finishing number (imported, older) first in id order, then by
    ``result_seq``. The position (``after``) is turned into a row key once; later reads go on from
    the last row's key."""

    FIELDS = (
        "id",
        "result_seq",
        "status",
        "task_index",
        "rollout_index",
        "verify_json",
        "error",
        "nemo_error",
        "terminal",
        "failure_kind",
        "task__row_json",
    )

    def __init__(self, run: Run, after: int):
        self.run = run
        self.stamp = export.stamps_rows(run)
        self.skip = after  # rows still to pass over before the key is known
        self.last_id: int | None = None  # in the unnumbered rows
        self.last_seq: int | None = None  # in the numbered rows
        self.numbered = False

    def _unnumbered(self):
        return Rollout.objects.filter(run=self.run, result_seq__isnull=True, status__in=FINISHED).order_by("id")

    def _numbered(self):
        return Rollout.objects.filter(run=self.run, result_seq__isnull=False).order_by("result_seq")

    def _place(self) -> bool:
        """Turn ``skip`` into a key; False while there are not that many rows yet."""
        if not self.numbered:
            ids = list(self._unnumbered().values_list("id", flat=True)[self.skip - 1 : self.skip])
            if ids:
                self.last_id, self.skip = ids[0], 0
                return True
            self.skip -= self._unnumbered().count()
            self.numbered = True
            if self.skip == 0:
                return True
        seqs = list(self._numbered().values_list("result_seq", flat=True)[self.skip - 1 : self.skip])
        if not seqs:
            self.skip += self._unnumbered().count()  # try again from the start next time
            self.numbered = False
            return False
        self.last_seq, self.skip = seqs[0], 0
        return True

    def caught_up(self, top_seq: int | None) -> bool:
        """True when every row is read already, given the run's highest ``result_seq`` now
        (None: no numbered row): the numbered rows are reached and the last one read is the top."""
        return self.numbered and not self.skip and top_seq == self.last_seq

    def read(self) -> Iterator[str]:
        """Every row stored now after the place reached, as JSON text (no newline)."""
        if self.skip and not self._place():
            return
        while True:
            if not self.numbered:
                qs = self._unnumbered()
                if self.last_id is not None:
                    qs = qs.filter(id__gt=self.last_id)
                page = list(qs.values_list(*self.FIELDS)[:CHUNK])
                if not page:
                    self.numbered = True
                    continue
            else:
                qs = self._numbered()
                if self.last_seq is not None:
                    qs = qs.filter(result_seq__gt=self.last_seq)
                page = list(qs.values_list(*self.FIELDS)[:CHUNK])
                if not page:
                    return
            for rid, seq, status, ti, ri, verify_json, error, nemo_error, terminal, kind, task_json in page:
                yield self._line(
                    status, ti, ri, verify_json, export.sidecar_error(error, nemo_error), terminal, kind, task_json
                )
                if seq is None:
                    self.last_id = rid
                else:
                    self.last_seq = seq

    def _line(self, status, ti, ri, verify_json, error, terminal, kind, task_json) -> str:
        task_row = json.loads(task_json)
        if status == Rollout.Status.SUCCEEDED:
            row = export.success_row(
                verify_json, ti, ri, export.agent_ref_of(task_row, self.run), self.stamp, export.agent_ordered(self.run)
            )
        else:
            row = export.failure_row(task_row, ri, error, terminal, self.stamp)
        return export.row_line(row)


def _look(run_id: int) -> tuple[str, int | None] | None:
    """The run's status and its highest ``result_seq`` now (None: no numbered row), in one query
    (None when the run is gone): what a waiting stream checks after every commit it notices."""
    run_t, rollout_t = Run._meta.db_table, Rollout._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT status, (SELECT result_seq FROM {rollout_t} WHERE run_id = %s AND result_seq IS NOT NULL "
            f"ORDER BY result_seq DESC LIMIT 1) FROM {run_t} WHERE id = %s",
            [run_id, run_id],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def _stays() -> bool:
    return False


def result_lines(run_id: int, after: int, wait: bool, gone: Callable[[], bool] = _stays) -> Iterator[bytes]:
    """NDJSON lines of the run's NeMo Gym rows from ``after``; with ``wait``, looks again each
    time the database may hold new rows (``rollouts.api.result_wait``) until the run is final and
    everything is sent, sending an empty line after ``GYMWEB_STREAM_KEEPALIVE_S`` of silence, for
    at most ``GYMWEB_STREAM_MAX_S`` (the client then reconnects with its cursor). Ends as soon as
    ``gone()`` says the client closed its connection (checked after every wait, at least once a
    second: ``rollouts.api.open_streams.client_gone``)."""
    keepalive_s = settings.GYMWEB_STREAM_KEEPALIVE_S
    started = last_out = time.monotonic()
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return
    rows = _Rows(run, after)
    with ResultWait() as changes:  # made before the first look: no write after it is missed
        while True:
            look = _look(run_id)
            if look is None:
                return
            status, top_seq = look
            final = status in Run.FINAL  # read before the rows: every result of a final run is already stored
            lines, sent = [], False
            # Another commit (a step's items, a claim) wakes the stream far more often than a
            # result is stored: the rows are read only when the top of the finishing order moved.
            for line in () if rows.caught_up(top_seq) else rows.read():
                lines.append(line)
                if len(lines) >= CHUNK:
                    yield ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
                    lines, sent = [], True
            if lines:
                yield ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
                sent = True
            now = time.monotonic()
            if sent:
                last_out = now
            elif final or not wait:
                return
            if now - started >= settings.GYMWEB_STREAM_MAX_S:
                return
            if now - last_out >= keepalive_s:
                yield b"\n"
                last_out = now
            changes.wait()
            if gone():
                return


_RESULTS_DOC = (
    "NDJSON, one NeMo Gym row per finished attempt, in finishing order: a success as `rollouts.jsonl` has it, "
    "a failure as the failures sidecar (`rollouts_failures.jsonl`) has it "
    "(`_ng_failure_class`, `error`, `reward: 0.0`). "
    "Cancelled and interrupted attempts are not rows (their keys run again or stay not run). "
    "`after`: how many rows you already have (the cursor; 0 = from the start); "
    "reconnecting with it gives every row exactly once. "
    "`wait=1` (default) keeps the connection open until the run is final (completed or cancelled) "
    "and every row is sent; "
    "`wait=0` answers at once with what is there. An empty line is a keep-alive. A stream also ends after "
    "`GYMWEB_STREAM_MAX_S`: when it ends before the run is final, reconnect with your count. "
    "Open streams that wait are limited per web process (`GYMWEB_MAX_RESULT_STREAMS`: 503) and per user "
    "(`GYMWEB_MAX_RESULT_STREAMS_PER_USER`: 429); both answers carry `Retry-After` (seconds) and say which "
    "limit and its value. `wait=0` reads are not counted."
)
_BUSY_HEADERS = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}


@api.get(
    "/runs/{run_id}/results",
    summary="The run's finished rollouts as NeMo Gym rows, streamed as they finish",
    description=_RESULTS_DOC,
    response={200: None, 400: Error, 409: Error, 429: StreamRefusedOut, 503: StreamRefusedOut},
    openapi_extra={
        "responses": {
            "200": {"description": "NDJSON rows", "content": {NDJSON: {"schema": {"type": "string"}}}},
            "429": {
                "description": "you hold `GYMWEB_MAX_RESULT_STREAMS_PER_USER` open streams in this web process "
                "already (`limit`: `per_user`); try again after `Retry-After` seconds",
                "headers": _BUSY_HEADERS,
            },
            "503": {
                "description": "this web process holds `GYMWEB_MAX_RESULT_STREAMS` open streams already "
                "(`limit`: `per_process`); try again after `Retry-After` seconds (or read with `wait=0`)",
                "headers": _BUSY_HEADERS,
            },
        }
    },
)
def run_results(
    request,
    run_id: int,
    after: int = Query(0, ge=0, le=10**9, description="rows already read (the cursor)"),
    wait: bool = Query(True, description="keep the stream open until the run is final"),
):
    run = run_for(request, run_id)
    if run.is_archived:  # its verify replies are in the archive files, not in the rows the stream reads
        raise HttpError(409, str(archive.RunArchived(run, "the results stream")))
    lines = result_lines(run.pk, after, wait, client_gone(request.META))
    # A stream that waits holds a thread until the run ends: counted (open_streams). wait=0 ends at once.
    body = HeldStream(lines, SLOTS.take(request.user.pk)) if wait else lines
    response = StreamingHttpResponse(body, content_type=f"{NDJSON}; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"  # nginx: pass rows on as they come
    return response


# -- one rollout whole ---------------------------------------------------------------------------
class StepOut(Schema):
    index: int = Field(..., description="0-based agent call")
    started: Any
    latency_ms: float
    http_status: int | None
    response_id: str
    model: str
    usage: dict[str, Any] | None
    incomplete_details: Any | None
    num_asks: int
    error: str


class ItemOut(Schema):
    seq: int
    step: int
    type: str
    origin: str = Field(
        ...,
        description="agent (an item of a reply) or gym (a function_call_output gymweb added after running a tool call)",
    )
    call_id: str
    name: str
    latency_ms: float | None = Field(None, description="a tool call's time in the env")
    tool_status: int | None
    item: Any = Field(..., description="the item as it came")


class RolloutWholeOut(RolloutDetailOut):
    response: dict[str, Any] | None = Field(
        None, description="the merged response as NeMo Gym writes it (a failure: what it had)"
    )
    verify: dict[str, Any] | None = Field(None, description="the env's /verify reply as it came (successes)")
    steps: list[StepOut]
    items: list[ItemOut]
    seed_ms: float | None
    verify_ms: float | None


def nemo_gym_row(rollout: Rollout) -> dict[str, Any] | None:
    """The rollout's NeMo Gym row (success or failure row, by the files' writer); None for an
    attempt that has not ended or was cancelled/interrupted."""
    if rollout.status not in FINISHED:
        return None
    task_row = json.loads(rollout.task.row_json)
    stamp = export.stamps_rows(rollout.run)
    if rollout.status == Rollout.Status.SUCCEEDED:
        return export.success_row(
            rollout.verify_json,
            rollout.task_index,
            rollout.rollout_index,
            export.agent_ref_of(task_row, rollout.run),
            stamp,
            export.agent_ordered(rollout.run),
        )
    error = export.sidecar_error(rollout.error, rollout.nemo_error)
    return export.failure_row(task_row, rollout.rollout_index, error, rollout.terminal, stamp)


@api.get(
    "/rollouts/{rollout_id}",
    response={200: RolloutWholeOut, 400: Error, 409: Error},
    summary="One rollout whole: trajectory, steps, verify reply, review",
    openapi_extra={
        "parameters": [
            {
                "name": "format",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": ["", "nemo_gym"]},
                "description": "`nemo_gym`: only its NeMo Gym row "
                "(a success as rollouts.jsonl has it, a failure as the sidecar has it)",
            }
        ]
    },
)
def get_rollout(request, rollout_id: int):
    """The rollout with its labels, notes and correction, the merged response, every agent call
    (latency, usage), every trajectory item and the verify reply. ``?format=nemo_gym``: its NeMo
    Gym row instead (409 while it has none: pending, running, cancelled or interrupted)."""
    rollout = rollout_for(request, rollout_id)
    if rollout.run.is_archived:
        raise HttpError(409, str(archive.RunArchived(rollout.run, "this rollout's trajectory")))
    fmt = request.GET.get("format", "")
    if fmt not in ("", "nemo_gym"):
        raise _bad("format must be nemo_gym or empty", "format")
    if fmt == "nemo_gym":
        row = nemo_gym_row(rollout)
        if row is None:
            raise HttpError(409, f"rollout {rollout.pk} is {rollout.status}: it has no NeMo Gym row")
        return HttpResponse(export.row_line(row).encode("utf-8", "surrogatepass"), content_type="application/json")
    out = rollout_detail(request, rollout)
    verify = json.loads(rollout.verify_json) if rollout.verify_json else None
    if verify is not None:
        response = verify.get("response")
    elif rollout.partial_response_json:
        response = json.loads(rollout.partial_response_json)
    else:
        response = None
    out["response"] = response
    out["verify"] = verify
    out["steps"] = [
        {
            "index": c.index,
            "started": c.started,
            "latency_ms": c.latency_ms,
            "http_status": c.http_status,
            "response_id": c.response_id,
            "model": c.model,
            "usage": c.usage,
            "incomplete_details": c.incomplete_details,
            "num_asks": c.num_asks,
            "error": c.error,
        }
        for c in AgentCall.objects.filter(rollout=rollout).order_by("index")
    ]
    out["items"] = [
        {
            "seq": i.seq,
            "step": i.step,
            "type": i.kind,
            "origin": i.origin,
            "call_id": i.call_id,
            "name": i.name,
            "latency_ms": i.latency_ms,
            "tool_status": i.tool_status,
            "item": i.payload,
        }
        for i in rollout.items.order_by("seq").defer("search_text")
    ]
    out["seed_ms"] = rollout.seed_ms
    out["verify_ms"] = rollout.verify_ms
    return out
