"""Storage: runs, their tasks, rollouts (one row per attempt of a (task, rollout) key), the agent
calls of each rollout and the ordered items of its trajectory.

Counters that pages show often (done, succeeded, failed, in flight) are computed with SQL
aggregates over indexed columns, never kept by hand, so they cannot drift.

Every string an agent, an env, a file or a user can supply is stored losslessly on SQLite and
PostgreSQL alike (``rollouts.lossless``): JSON values as JSON text (``JSONTextField``, never
``jsonb``, which rejects ``\u0000``, reorders keys and rewrites numbers), plain text in
``LosslessTextField``/``LosslessCharField`` (U+0000 encoded reversibly). The ``*_json`` text columns
hold JSON text written by ``lossless.dumps``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse

from rollouts.lossless import JSONTextField, LosslessCharField, LosslessTextField
from rollouts.search.text import fill_missing, item_search_text

DEFAULT_TEAM = "default"


class Team(models.Model):
    """A group of users that owns runs, datasets and API tokens (``rollouts.web.access``: a user
    sees their teams' runs only; a superuser sees all). An instance starts with one team,
    ``default``, that every user and row is in (migration 0022), so one team behaves as no teams."""

    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="teams")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


def default_team_pk() -> int:
    """The primary key of the ``default`` team (made if missing): the team of a run or dataset
    saved without one (``collect``, ``demo``, rows made directly)."""
    return Team.objects.get_or_create(name=DEFAULT_TEAM)[0].pk


class TeamOwned(models.Model):
    """A row that belongs to a team: saved without one, it goes to the ``default`` team."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if getattr(self, "team_id", None) is None:
            self.team_id = default_team_pk()
        super().save(*args, **kwargs)


class Dataset(TeamOwned):
    """An uploaded JSONL dataset, kept so later runs can reuse it. ``rows`` are the validated rows
    (stale result fields already stripped), in file order."""

    name = LosslessCharField(max_length=200)
    # The name it came with (the uploaded file's, the selection's), kept when it is renamed.
    source_name = LosslessCharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="datasets")
    num_rows = models.PositiveIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    # A dataset made from a selection of a run's rollouts (rollouts.review.selection): the run and
    # the filter querystring that chose its tasks, so a run launched from it records where its
    # tasks came from.
    source_run = models.ForeignKey(
        "Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="derived_datasets"
    )
    source_filters = models.CharField(max_length=2000, blank=True)
    # Being written (an upload in several transactions): its writer's lease, renewed with every
    # batch (``rollouts.collection.writing``). Set: not ready, shown nowhere, swept once it lapses.
    writing_until = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.num_rows} rows)"


class DatasetRow(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="rows")
    line = models.PositiveIntegerField(help_text="1-based line number in the uploaded file")
    # Raw JSON text, not a JSONField: PostgreSQL's jsonb would reorder keys, and files written
    # from here should read like the files that came in.
    data_json = models.TextField()

    class Meta:
        ordering = ["line"]
        constraints = [models.UniqueConstraint(fields=["dataset", "line"], name="dataset_row_line_unique")]


class Run(TeamOwned):
    """One collection run: a dataset materialised into rollouts, driven against one agent and env."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        COMPLETED = "completed", "completed"
        CANCELLED = "cancelled", "cancelled"
        IMPORTED = "imported", "imported"

    FINAL = (Status.COMPLETED, Status.CANCELLED, Status.IMPORTED)

    name = LosslessCharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="runs")

    agent_url = models.CharField(max_length=2000, blank=True)
    env_url = models.CharField(max_length=2000, blank=True)
    agent_name = LosslessCharField(max_length=200, default="remote_agent")
    # A NeMo Gym environment found through its head server (rollouts.nemo): the head server's URL
    # and the resources server's config name; env_url is resolved from them again on every retry
    # (ports move across `gym env start`s). Blank: env_url was given directly.
    head_url = models.CharField(max_length=2000, blank=True)
    env_name = LosslessCharField(max_length=200, blank=True)
    concurrency = models.PositiveIntegerField(default=32)
    max_steps = models.PositiveIntegerField(
        null=True, blank=True, help_text="agent calls per rollout; empty or 0 = unbounded"
    )
    num_repeats = models.PositiveIntegerField(default=1)
    limit = models.PositiveIntegerField(null=True, blank=True)
    max_attempts = models.PositiveIntegerField(default=3)
    env_max_in_flight = models.PositiveIntegerField(
        default=0,
        help_text="most of this run's calls out to its env at a time, shared among worker processes "
        "(0: the server's GYMWEB_ENV_MAX_IN_FLIGHT per worker process)",
    )
    auto_retry = models.BooleanField(
        default=False, help_text="failed keys get new attempts (up to max_attempts) before the run completes"
    )
    remote_responses_timeout_s = models.FloatField(default=1800.0)
    run_timeout_s = models.FloatField(default=2100.0)
    overrides = JSONTextField(default=dict, blank=True, help_text="merged into responses_create_params")
    source_file = LosslessCharField(max_length=500, blank=True)
    num_tasks = models.PositiveIntegerField(default=0)
    num_keys = models.PositiveIntegerField(default=0, help_text="(task, rollout) keys = tasks × repeats")
    aggregate_metrics = JSONTextField(null=True, blank=True, help_text="the env's /aggregate_metrics reply")
    aggregate_metrics_error = LosslessTextField(blank=True)
    # Health check (rollouts.evaluation.health): NeMo Gym's quality_summary.json of the last check,
    # null until one ran; the per-rollout verdicts are RolloutHealth rows.
    health_summary = JSONTextField(null=True, blank=True)
    health_checked = models.DateTimeField(null=True, blank=True)
    # Reverify (rollouts.evaluation.reverify): the stored run whose rewards this run recomputed.
    reverified_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reverifications"
    )
    # Each resume that changed the agent or env URL (``collect --resume --allow-url-change``), in
    # order: ``{"at": ISO time, "agent_url": [old, new], "env_url": [old, new]}`` (a key only when
    # that URL changed).
    url_changes = JSONTextField(default=list, blank=True)
    # Archive (rollouts.collection.archive): when the run's items went to compressed files in
    # ``archive_path``; null = its items are in the database.
    archived = models.DateTimeField(null=True, blank=True)
    archive_path = models.CharField(max_length=1000, blank=True)
    # Being written (an upload or import in several transactions): its writer's lease, renewed with
    # every batch (``rollouts.collection.writing``). Set: not ready, shown nowhere, swept once it lapses.
    writing_until = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    def get_absolute_url(self) -> str:
        return reverse("run", args=[self.pk])

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL

    @property
    def is_archived(self) -> bool:
        """Whether the run's items are in archive files (``rollouts.collection.archive``), not here."""
        return self.archived is not None

    @property
    def repeats_label(self) -> str:
        """Rollouts per task for headers: ``"4"``; ``"up to 4 (18 rollouts)"`` when the tasks have
        different numbers of rollouts (an imported file can)."""
        if self.num_tasks and self.num_keys != self.num_tasks * self.num_repeats:
            return f"up to {self.num_repeats} ({self.num_keys:,} rollouts)"
        return str(self.num_repeats)


class Task(models.Model):
    """One task of a run: the materialised row without ``_ng_rollout_index`` (DESIGN.md, "Datasets")."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tasks")
    task_index = models.IntegerField()
    row_json = models.TextField(help_text="the materialised row as JSON text (key order kept)")

    class Meta:
        ordering = ["task_index"]
        constraints = [models.UniqueConstraint(fields=["run", "task_index"], name="task_index_unique")]


class Rollout(models.Model):
    """One attempt of a (task, rollout) key.

    ``status`` moves pending → running → succeeded | failed; ``cancelled`` and ``interrupted``
    (its worker died) are kill-shaped: kept for inspection, written to no file, not an attempt
    (DESIGN.md, "Failure rows"). A running row carries a lease (``lease_until``) that its worker
    renews; an expired lease means the worker is gone and the key may be claimed again.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"
        INTERRUPTED = "interrupted", "interrupted"

    ACTIVE = (Status.PENDING, Status.RUNNING)
    KILL_SHAPED = (Status.CANCELLED, Status.INTERRUPTED)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollouts")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="rollouts")
    task_index = models.IntegerField()
    rollout_index = models.IntegerField()
    attempt = models.PositiveIntegerField(default=1, help_text="1-based; kill-shaped rows do not count")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True, db_index=True)

    worker = models.CharField(max_length=100, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # The agent and env base URLs this attempt was driven against (blank: not run by gymweb, or
    # ended before it ran).
    agent_url = models.CharField(max_length=2000, blank=True)
    env_url = models.CharField(max_length=2000, blank=True)

    reward = models.FloatField(null=True, blank=True)
    failure_kind = LosslessCharField(max_length=40, blank=True)
    error = LosslessTextField(blank=True)
    # NeMo Gym 0.7.0's `error` text for the same failure, which the failures sidecar and the results
    # stream write (rollouts.engine.nemo_errors); blank: the same as `error` (and on attempts stored
    # before it was kept, and on imported rows, whose `error` is NeMo Gym's text as it came).
    nemo_error = LosslessTextField(blank=True)
    terminal = models.BooleanField(default=False)
    # The env's /verify reply as it came, JSON text (a success's rollouts.jsonl row before indices).
    verify_json = models.TextField(blank=True)
    # What NeMo Gym's profiler reads from a success's rollouts.jsonl row (profile.profile_numbers),
    # compact JSON text, so a run's profile never parses the responses; blank = not stored (the
    # profile then reads verify_json).
    profile_json = models.TextField(blank=True)
    # The merged response (rule 9) of a failed attempt, JSON text, for inspection; a success's is
    # inside verify_json.
    partial_response_json = models.TextField(blank=True)
    warnings = JSONTextField(default=list, blank=True)
    # What of this attempt could not be stored (one line per part, e.g. "trajectory item 3: ..."):
    # non-empty makes the attempt a `storage_failed` failure, never a success with holes.
    storage_error = LosslessTextField(blank=True)

    # Imported runs only (collection.importer): the row's position among the result rows of its
    # kind (rollouts.jsonl rows, failures-sidecar rows) and among the materialised inputs, so the
    # files download in the imported order; and the line as it came wherever the export would not
    # write it byte for byte (blank otherwise). One attempt per key carries the input line.
    source_ordinal = models.PositiveIntegerField(null=True, blank=True)
    source_text = LosslessTextField(blank=True)
    input_ordinal = models.PositiveIntegerField(null=True, blank=True)
    input_text = LosslessTextField(blank=True)

    usage_reported = models.BooleanField(default=False)
    input_tokens = models.BigIntegerField(null=True, blank=True)
    output_tokens = models.BigIntegerField(null=True, blank=True)
    total_tokens = models.BigIntegerField(null=True, blank=True)
    cached_tokens = models.BigIntegerField(null=True, blank=True)
    reasoning_tokens = models.BigIntegerField(null=True, blank=True)

    num_agent_calls = models.PositiveIntegerField(default=0)
    num_tool_calls = models.PositiveIntegerField(default=0)
    num_items = models.PositiveIntegerField(default=0)
    seed_ms = models.FloatField(null=True, blank=True)
    verify_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    # Finishing order within the run (1, 2, ...; gaps allowed): set when a worker writes the attempt's
    # result, under a lock on the run row, so a higher number always commits later. The results
    # stream reads it (rollouts.api.trainer). Empty on imported and older rows.
    result_seq = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["task_index", "rollout_index", "attempt", "id"]
        indexes = [
            # (run, status) lookups, and the claim's "first pending keys in order" as a range
            # read: on (run, status) alone it walked the run's finished rows first (benchmarks/README.md).
            models.Index(fields=["run", "status", "task_index", "rollout_index", "id"], name="rollout_run_status_key"),
            models.Index(fields=["run", "task_index", "rollout_index"], name="rollout_run_key"),
            # The run table's order and its superseded-attempt test, read from the index alone
            # (on SQLite a table scan walks the rows' large JSON texts).
            models.Index(
                fields=["run", "task_index", "rollout_index", "attempt", "status", "id"], name="rollout_run_order"
            ),
            models.Index(fields=["status", "lease_until"], name="rollout_status_lease"),
            models.Index(fields=["run", "failure_kind"], name="rollout_run_kind"),
            # The run page's reward statistics and histogram read only this index.
            models.Index(fields=["run", "status", "reward"], name="rollout_run_status_reward"),
            # The results stream: a run's finished attempts in finishing order.
            models.Index(fields=["run", "result_seq"], name="rollout_run_result_seq"),
            # Token and duration totals, read from the index alone: on SQLite these columns sit
            # behind the large verify_json text, whose overflow pages a table scan would walk.
            models.Index(
                fields=[
                    "run",
                    "status",
                    "usage_reported",
                    "input_tokens",
                    "output_tokens",
                    "total_tokens",
                    "cached_tokens",
                    "reasoning_tokens",
                    "duration_ms",
                ],
                name="rollout_run_usage",
            ),
        ]
        constraints = [
            # At most one live-or-succeeded attempt per key: a key can never run twice at once,
            # and never again once it succeeded.
            models.UniqueConstraint(
                fields=["run", "task_index", "rollout_index"],
                condition=Q(status__in=["pending", "running", "succeeded"]),
                name="rollout_one_live_attempt_per_key",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} task {self.task_index} rollout {self.rollout_index} attempt {self.attempt}"

    def get_absolute_url(self) -> str:
        return reverse("rollout", args=[self.run_id, self.pk])

    @property
    def key(self) -> str:
        return f"{self.task_index}:{self.rollout_index}"


class FieldValue(models.Model):
    """One task or verify field's value of one rollout (``rollouts.review.field_values``), read by
    the run table's sorts and filters on that field instead of the stored JSON text.

    ``number`` and ``text`` are what ``rollouts.review.columns.FieldNumber``/``FieldText`` give for
    the value (of the rollout's task row for a task field); a missing or null value has no row.
    Kept per (run, field) as ``FieldExtract`` says; ``rollout`` is a plain column (no database
    constraint): a deleted rollout's rows go with its run.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    field = models.CharField(max_length=500)
    rollout = models.ForeignKey(
        Rollout, on_delete=models.DO_NOTHING, db_constraint=False, related_name="field_values", db_index=False
    )
    number = models.FloatField(null=True)
    text = models.TextField(null=True)

    class Meta:
        indexes = [
            # The number filters, and a run's rows by field.
            models.Index(fields=["run", "field", "number"], name="fieldvalue_run_number"),
        ]
        constraints = [
            # The table's join: one rollout's value (with the number, read from the index).
            models.UniqueConstraint(fields=["rollout", "field"], name="fieldvalue_one_per_rollout"),
        ]


def forget_field_values(run_id: int) -> None:
    """Drop run ``run_id``'s kept field values (``FieldValue``, ``FieldExtract``): for a run whose
    stored replies change in place (archive, restore); the next sort or filter extracts again."""
    FieldExtract.objects.filter(run_id=run_id).delete()
    FieldValue.objects.filter(run_id=run_id).delete()


class FieldExtract(models.Model):
    """Which of a run's fields have their values in ``FieldValue``, and up to where: for a verify
    field, results up to ``upto_seq`` (``Rollout.result_seq``; every row without one when it was
    made); for a task field, rollouts up to id ``upto_id`` (a task row never changes)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    field = models.CharField(max_length=500)
    upto_seq = models.BigIntegerField(default=0)
    upto_id = models.BigIntegerField(default=0)
    made = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "field"], name="fieldextract_one_per_field")]


class RefusedReply(models.Model):
    """The agent reply that ended an attempt because gymweb refused it (a redirect, an HTTP error,
    not JSON, an invalid Responses object), as it arrived: the first ``GYMWEB_FAILED_REPLY_MAX_BYTES``
    bytes of the body, its whole size (bytes), its HTTP status and content type, and for an
    invalid object the validation errors, each ``{"path": [key or index, ...], "message": str}``
    (a JSON path into the body). One per refused attempt; model output, so escape it when shown."""

    rollout = models.OneToOneField(Rollout, on_delete=models.CASCADE, related_name="refused_reply")
    http_status = models.PositiveSmallIntegerField()
    content_type = LosslessCharField(max_length=200, blank=True)
    body = models.BinaryField()
    size = models.BigIntegerField(help_text="the whole body's length in bytes")
    truncated = models.BooleanField(default=False)
    errors = JSONTextField(default=list, blank=True)

    def __str__(self) -> str:
        return f"refused reply of {self.rollout}"

    @property
    def text(self) -> str:
        """The kept body as text (UTF-8; undecodable bytes as U+FFFD)."""
        return bytes(self.body).decode("utf-8", "replace")


class AgentCall(models.Model):
    """One call to the agent service within a rollout (a step of the timeline). Times in ms."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="agent_calls")
    index = models.PositiveIntegerField(help_text="0-based")
    # Null when unknown: an imported row records no call times (only its last reply's created_at).
    started = models.DateTimeField(null=True, blank=True)
    latency_ms = models.FloatField()
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_id = LosslessCharField(max_length=300, blank=True)
    model = LosslessCharField(max_length=300, blank=True)
    usage = JSONTextField(null=True, blank=True)
    incomplete_details = JSONTextField(null=True, blank=True)
    num_asks = models.PositiveIntegerField(default=0)
    error = LosslessTextField(blank=True)

    class Meta:
        ordering = ["rollout", "index"]
        constraints = [models.UniqueConstraint(fields=["rollout", "index"], name="agent_call_index_unique")]


class TrajectoryItemManager(models.Manager):
    """Fills ``search_text`` (``rollouts.search.text.item_search_text``) of new items on every
    ``bulk_create``, so every writer (worker, ``collect``, imports, reverify) keeps the content
    search index complete without knowing about it."""

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        fill_missing(objs)
        return super().bulk_create(objs, *args, **kwargs)


class TrajectoryItem(models.Model):
    """One item of a rollout's merged trajectory, in order (``seq``).

    ``origin``: ``agent`` (an item of a reply) or ``gym`` (a function_call_output gymweb added after
    executing an ask). ``asked``: an unpaired function_call gymweb was asked to run (rule 4);
    ``paired``: the agent's own tool record. ``latency_ms``/``tool_status``: the env call behind a
    gym output; ``refused``: gymweb did not send it (rules 5, 6).
    """

    class Origin(models.TextChoices):
        AGENT = "agent", "agent"
        GYM = "gym", "gymweb"
        IMPORTED = "imported", "imported"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="items")
    seq = models.PositiveIntegerField()
    step = models.IntegerField(help_text="index of the agent call it came from or answered")
    kind = LosslessCharField(max_length=40)
    role = LosslessCharField(max_length=20, blank=True)
    call_id = LosslessCharField(max_length=300, blank=True)
    name = LosslessCharField(max_length=300, blank=True)
    origin = models.CharField(max_length=10, choices=Origin.choices)
    asked = models.BooleanField(default=False)
    paired = models.BooleanField(default=False)
    refused = models.BooleanField(default=False)
    latency_ms = models.FloatField(null=True, blank=True)
    tool_status = models.PositiveSmallIntegerField(null=True, blank=True)
    payload = JSONTextField(help_text="the item as it came, JSON text")
    # What the run page's content search reads (rollouts.search): the item's string values,
    # decoded and lowercased. Indexed by FTS5 (SQLite) or pg_trgm (PostgreSQL), outside the ORM.
    search_text = models.TextField(blank=True, default="", editable=False)

    objects = TrajectoryItemManager()

    class Meta:
        ordering = ["rollout", "seq"]
        constraints = [models.UniqueConstraint(fields=["rollout", "seq"], name="item_seq_unique")]
        # The content search's "tool called" filter, read from the index alone.
        indexes = [models.Index(fields=["kind", "name", "rollout"], name="item_kind_name")]

    def save(self, *args, **kwargs):
        if not self.search_text and self.payload is not None:
            self.search_text = item_search_text(self.payload)
        super().save(*args, **kwargs)


class RolloutHealth(models.Model):
    """The health verdict of one rollout (one attempt row: a key's success, else its latest failed
    attempt), as NeMo Gym's ``rollout_verdicts.jsonl`` writes it (``rollouts.evaluation.health``).

    ``verdict``: healthy / unhealthy / unobserved. ``findings``: NeMo Gym's finding objects
    (``check``, ``locator``, ``detail``); ``finding_steps``: per finding, the index of the agent call
    (step) it concerns, or null for the whole rollout. ``checks``: the ids of the checks that found
    something, as ``,id,id,`` so one indexed-free ``LIKE`` filters by check on every database.
    """

    class Verdict(models.TextChoices):
        HEALTHY = "healthy", "healthy"
        UNHEALTHY = "unhealthy", "unhealthy"
        UNOBSERVED = "unobserved", "unobserved"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="health_verdicts")
    rollout = models.OneToOneField(Rollout, on_delete=models.CASCADE, related_name="health")
    task_index = models.IntegerField()
    rollout_index = models.IntegerField()
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    checks = models.TextField(blank=True)
    findings = JSONTextField(default=list, blank=True)
    finding_steps = JSONTextField(default=list, blank=True)
    unobserved = JSONTextField(default=list, blank=True)

    class Meta:
        ordering = ["task_index", "rollout_index"]
        indexes = [models.Index(fields=["run", "verdict"], name="health_run_verdict")]

    def __str__(self) -> str:
        return f"{self.rollout} {self.verdict}"


class Worker(models.Model):
    """A live dispatcher (one per worker process, or the CLI). Its heartbeat tells the others how
    many share the runs, so each takes a fair share of a run's ``concurrency``."""

    name = models.CharField(max_length=120, unique=True)
    host = models.CharField(max_length=100)
    pid = models.PositiveIntegerField()
    started = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(db_index=True)
    inflight = models.PositiveIntegerField(default=0)
    capacity = models.PositiveIntegerField(default=0, help_text="most rollouts it keeps in flight")

    def __str__(self) -> str:
        return self.name


class MetricTotal(models.Model):
    """A fleet-wide running total that every worker adds to (rollouts.operations.prometheus): a
    counter, or one histogram bucket, sum or count, named by ``name`` and canonical ``labels``
    (``k=v,k=v``, sorted). ``/metrics`` on any web server reads them, so one scrape covers every
    worker on every machine."""

    name = models.CharField(max_length=100)
    labels = models.CharField(max_length=300, blank=True, default="")
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "labels"], name="metric_total_name_labels")]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} {self.value}"


# -- review: labels, notes, corrected rewards, review progress, API tokens (rollouts.review) ------
class Label(TeamOwned):
    """A label reviewers put on rollouts. One set per team (a rollout takes its run's team's
    labels); each team starts with ``good``, ``bad``, ``reward-hack``, ``verifier-wrong`` and
    ``env-bug`` (``rollouts.review.actions.ensure_default_labels``) and users add more.
    ``position`` orders them; the first nine answer keys 1–9 in review mode."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="labels")
    name = models.CharField(max_length=40)
    description = LosslessCharField(max_length=200, blank=True)
    position = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["position", "id"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="label_team_name")]

    def __str__(self) -> str:
        return self.name


class RolloutLabel(models.Model):
    """A label on a rollout (one attempt row), with who put it there and when."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="review_labels")
    label = models.ForeignKey(Label, on_delete=models.CASCADE, related_name="uses")
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["label__position", "label_id"]
        constraints = [models.UniqueConstraint(fields=["rollout", "label"], name="rollout_label_unique")]
        indexes = [models.Index(fields=["label", "rollout"], name="rollout_label_by_label")]


class Note(models.Model):
    """A reviewer's note on a rollout, or on one item of its trajectory (``item_seq``: the item's
    ``TrajectoryItem.seq``, ``#N`` on the page; None = the whole rollout). Plain text."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="notes")
    item_seq = models.PositiveIntegerField(null=True, blank=True)
    text = LosslessTextField()
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created", "id"]
        indexes = [models.Index(fields=["rollout", "created"], name="note_rollout_created")]


class RewardCorrection(models.Model):
    """A reviewer's corrected reward for a succeeded rollout, with the reason. It never replaces
    ``Rollout.reward`` (the env's): rows are a history, the newest is in force, and one whose
    ``reward`` is None withdraws the correction."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="reward_corrections")
    reward = models.FloatField(null=True, blank=True)
    reason = LosslessTextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["rollout", "-id"], name="correction_rollout_latest")]


class ReviewList(models.Model):
    """One user's review of one filtered list of a run's rollouts: ``filters`` is the list's
    canonical filter querystring (no sort, no page). Its marks say which rollouts were reviewed."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="review_lists")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="review_lists")
    filters = models.CharField(max_length=2000, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "run", "filters"], name="review_list_unique")]


class ReviewMark(models.Model):
    """A rollout reviewed in a review list (moved past with ``j``, labelled, noted or corrected)."""

    review_list = models.ForeignKey(ReviewList, on_delete=models.CASCADE, related_name="marks")
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["review_list", "rollout"], name="review_mark_unique")]


class Rubric(models.Model):
    """The rubric of the instance's label set: named fields a reviewer fills in for a rollout, each
    a score range or a list of choices (``definition_json``: ``rollouts.review.rubric``'s
    ``RubricDefinition`` as JSON text). Rows are a history: the newest is in force; an answer keeps
    the row it was given against."""

    definition_json = JSONTextField()
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["id"]


class RubricAnswer(models.Model):
    """One reviewer's answers to the rubric for one rollout (``values_json``: field name → a number
    or a choice, validated against ``rubric``). Saving again replaces the reviewer's answer."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="rubric_answers")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    rubric = models.ForeignKey(Rubric, on_delete=models.CASCADE, related_name="answers")
    values_json = JSONTextField()
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["updated", "id"]
        constraints = [models.UniqueConstraint(fields=["rollout", "user"], name="rubric_answer_unique")]


class ReviewQueue(TeamOwned):
    """A team's queue of rollouts to review, from any of its runs (``rollouts.review.queues``)."""

    name = LosslessCharField(max_length=200)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="review_queues")
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("queue", args=[self.pk])


class QueueEntry(models.Model):
    """A rollout in a review queue: who it is assigned to (None: anyone), when it was added, and
    once reviewed, by whom and when."""

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="entries")
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="queue_entries")
    assigned_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    added_at = models.DateTimeField(auto_now_add=True)
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["queue", "rollout"], name="queue_entry_unique")]
        indexes = [models.Index(fields=["queue", "reviewed_at", "assigned_to"], name="queue_entry_todo")]


class ApiToken(models.Model):
    """A user's token for the HTTP API. Only its SHA-256 ``digest`` is stored; the token itself is
    shown once, when it is created. ``prefix`` (its first characters) tells tokens apart."""

    class Scope(models.TextChoices):
        READ = "read", "read-only"
        WRITE = "write", "read-write"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = LosslessCharField(max_length=100)
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    # read: the API's GET routes only (403 on every POST, PATCH, PUT and DELETE); write: all of them.
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.WRITE)
    expires = models.DateTimeField(null=True, blank=True, help_text="refused (401) from then on; empty: never")
    # A token of one team sees that team's runs only (while its user is in it); empty: all theirs.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens")

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class HeadServer(models.Model):
    """A NeMo Gym head server gymweb knows (``manage.py env start`` or ``env add`` registered it, or
    a run used it): its environments are read from it live (``rollouts.nemo.head_server``), never
    stored, since their ports move on every start."""

    url = models.CharField(max_length=2000, unique=True)
    added = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    config_files = LosslessTextField(blank=True, help_text="the config files it was started with, one a line")

    class Meta:
        ordering = ["url"]

    def __str__(self) -> str:
        return self.url


class BackgroundTask(models.Model):
    """Long work a page started (an upload, an import, an agent check, a reverify, a health check),
    run by a django-q2 worker (``rollouts.background``) while the page polls its progress.
    ``params``: what the work needs (files are under ``background.task_dir``); ``result``: what the
    page shows when it ends (``url``: where the result is). At most one queued or running task per
    user, kind and ``dedupe_key`` (the content hash of an import). ``alive_until``: running, the
    lease of the worker running it (taken with the claim, renewed while the worker lives); once it
    lapses the worker is gone and the task is failed (``background.reap``). Queued: when it is
    sent to the workers again if none took it (``background.resend``)."""

    class Kind(models.TextChoices):
        UPLOAD = "upload", "dataset upload"
        IMPORT = "import", "import"
        CHECK_AGENT = "check_agent", "agent check"
        REVERIFY = "reverify", "reverify"
        HEALTH_CHECK = "health_check", "health check"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    ACTIVE = (Status.QUEUED, Status.RUNNING)

    kind = models.CharField(max_length=32, choices=Kind.choices)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="background_tasks")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    progress = models.FloatField(null=True, blank=True, help_text="0 to 1, when known")
    message = LosslessTextField(blank=True)
    params = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    result_url = models.CharField(max_length=2000, blank=True)
    dedupe_key = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    alive_until = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "kind", "dedupe_key"],
                condition=models.Q(status__in=["queued", "running"]) & ~models.Q(dedupe_key=""),
                name="background_task_one_active_per_content",
            )
        ]

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} ({self.status})"
