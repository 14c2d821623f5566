"""The API's request and response bodies (django-ninja ``Schema``s); their class names are the
OpenAPI document's component names."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import Field

from rollouts.review.queues import ID_MAX


class Error(Schema):
    detail: str
    errors: dict[str, list[str]] = Field(default_factory=dict, description="per field, when a form rejected the input")


class StreamRefusedOut(Error):
    """A results stream refused by a limit on open streams (``rollouts.api.open_streams``)."""

    limit: str = Field(..., description="`per_process` (503) or `per_user` (429)")
    setting: str = Field(..., description="the setting of that limit")
    value: int = Field(..., description="the limit: how many open streams it allows")
    retry_after_s: int = Field(..., description="as the Retry-After header")


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


class RunSettingsOut(Schema):
    """The settings the run was launched with, under the names ``POST /runs`` takes, so they can be
    sent again as they are (``name``, ``agent_url``, ``env_url`` and ``agent_name`` are beside them)."""

    concurrency: int
    max_steps: int | None = Field(None, description="agent calls per rollout; null: unbounded")
    num_repeats: int
    limit: int | None
    max_attempts: int
    remote_responses_timeout_s: float
    run_timeout_s: float
    env_max_in_flight: int = Field(..., description="0: the server's GYMWEB_ENV_MAX_IN_FLIGHT per worker process")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="merged into every row's responses_create_params"
    )
    env_aggregate_metrics: bool = Field(..., description="false: the env is never asked for /aggregate_metrics")


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
    settings: RunSettingsOut
    team: int | None = Field(None, description="the run's team (`POST /runs` takes it as `team`)")
    auto_retry: bool = Field(False, description="failed keys get new attempts before the run completes")
    head_url: str = Field("", description="the head server the env was found through (empty: env_url was given)")
    env_name: str = Field("", description="the resources server's config name on that head server")


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
    team: int = Field(..., description="the team whose set it is in (a run's rollouts take its team's labels)")


class NewLabelIn(Schema):
    name: str
    description: str = ""
    team: int | None = Field(None, description="the team whose set it joins, one of yours; default: your first")


class TaskOut(Schema):
    id: int
    kind: str = Field(..., description="import (the background tasks the API starts)")
    status: str = Field(..., description="queued, running, done or failed")
    progress: float | None = Field(None, description="0 to 1, when known")
    message: str = Field("", description="what it is doing, what it made, or why it failed")
    created: datetime
    started: datetime | None = None
    finished: datetime | None = None
    url: str = Field(..., description="this task's status: GET it until status is done or failed")
    run: int | None = Field(None, description="done: the run it made (GET /runs/{id})")
    errors: dict[str, list[str]] = Field(
        default_factory=dict, description="failed: the form field the refusal is about"
    )


# -- review queues and the rubric (rollouts.api.queues) -------------------------------------------
class QueueOut(Schema):
    id: int
    name: str
    team: str
    created: datetime
    created_by: str | None
    reviewed: int = Field(description="entries reviewed")
    total: int = Field(description="entries in the queue")
    url: str = Field(description="the queue's page")


class NewQueueIn(Schema):
    name: str
    team: int | None = Field(None, description="one of the token user's teams (its id); default: their first")


class QueueAddIn(Schema):
    rollouts: list[Annotated[int, Field(ge=1, le=ID_MAX)]] = Field(
        default_factory=list, description="rollout ids (of runs of the queue's team), added in this order"
    )
    run: int | None = Field(
        None, ge=1, le=ID_MAX, description="a run of the queue's team: add its rollouts under `filter`"
    )
    filter: str = Field(
        "", description="the run table's filter as a querystring (`reward_min=1&label=-`); with `run` only"
    )


class QueueAddedOut(Schema):
    added: int = Field(description="rollouts added")
    already: int = Field(description="rollouts that were in the queue already")


class AssigneeProgress(Schema):
    user: str | None = Field(description="the assignee's user name; null: the unassigned entries")
    reviewed: int
    total: int


class QueueProgressOut(Schema):
    reviewed: int
    total: int
    assignees: list[AssigneeProgress]


class QueueNextIn(Schema):
    done: int | None = Field(None, ge=1, le=ID_MAX, description="a rollout id of the queue to count as reviewed first")


class QueueNextOut(Schema):
    entry: int | None = Field(description="the queue entry handed out; null: nothing left for this user")
    rollout: int | None
    run: int | None
    url: str | None = Field(description="the rollout's page in the review panel's queue mode")
    left: int = Field(description="entries not reviewed yet (every assignee)")


class RubricFieldOut(Schema):
    name: str
    description: str = ""
    required: bool = True
    min: float | None = None
    max: float | None = None
    choices: list[str] | None = None


class RubricOut(Schema):
    fields: list[RubricFieldOut] = Field(description="empty: the label set has no rubric")


class RubricIn(Schema):
    fields: list[dict] = Field(
        description="each `{name, description?, required?, min, max}` (a score range) or "
        "`{name, description?, required?, choices}`; an empty list removes the rubric"
    )


class RubricAnswerIn(Schema):
    values: dict[str, Any] = Field(description="field name → a number in its range or one of its choices")


class RubricAnswerOut(Schema):
    by: str
    at: datetime
    values: dict[str, int | float | str]
