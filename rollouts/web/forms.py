"""Forms of the run pages: the new-run form (``RunForm``, also what the API validates a run with)
and the helpers of its fields. The rollout-table filter is ``rollouts.review.query``."""

from __future__ import annotations

import json
import re
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Substr
from django.utils import timezone

from rollouts import targets, teams
from rollouts.collection import environments, run_settings, streamed_upload
from rollouts.collection.datasets import DatasetError
from rollouts.collection.environments import Resolved
from rollouts.collection.run_rows import RunTooLarge, check_size
from rollouts.collection.run_settings import LIMITS, SettingError
from rollouts.display import binary_size
from rollouts.engine.loop import InvalidBaseURL, validate_base_url
from rollouts.models import Dataset, DatasetRow, Team
from rollouts.nemo.config import NemoConfigError, load_texts
from rollouts.web.uploads import upload_limit_message


class MultipleFileInput(forms.ClearableFileInput):
    """A file input that lets the browser pick several files (Django's documented way)."""

    allow_multiple_selected = True


class NamedFileField(forms.FileField):
    """A ``FileField`` whose refusal of an empty file names the file, as every other refusal of an
    upload does (``"tasks.jsonl: the file is empty (0 bytes)"``)."""

    def to_python(self, data):
        try:
            return super().to_python(data)
        except forms.ValidationError as exc:
            if exc.code != "empty":
                raise
            name = str(getattr(data, "name", "") or "the file").rsplit("/", 1)[-1]
            raise forms.ValidationError(f"{name}: the file is empty (0 bytes)", code="empty") from None


class MultipleFileField(NamedFileField):
    """A file field whose cleaned value is the list of uploaded files (``[]`` when optional and
    none was sent); each file is validated like a ``FileField``'s."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput())
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        single = super().clean
        if isinstance(data, (list, tuple)):
            files = [single(item, initial) for item in data if item]
            if not files and self.required:
                raise forms.ValidationError(self.error_messages["required"], code="required")
            return files
        cleaned = single(data, initial)
        return [cleaned] if cleaned else []


def forget_value(form: forms.Form, name: str) -> None:
    """Do not render ``form``'s submitted value of field ``name`` back (it may hold a password)."""
    if form.data is not None and name in form.data:
        form.data = form.data.copy()
        form.data[name] = ""


def clean_target_url(form: forms.Form, name: str, what: str) -> str:
    """The cleaned value of a URL field that gymweb will send requests to (an agent or an env),
    for any form's ``clean_<name>``: ``loop.validate_base_url`` (absolute http(s), no credentials,
    query or fragment; trailing slash dropped) and the instance's target policy (``rollouts.targets``:
    ``GYMWEB_ALLOWED_TARGET_HOSTS``, ``GYMWEB_ALLOW_LOCAL_TARGETS``; IP spellings and the name's
    current addresses are judged; requests are judged again when they connect). A submitted
    value holding ``@`` is never rendered back, and error messages never echo credentials."""
    raw = form.cleaned_data.get(name, "")
    if "@" in raw:
        forget_value(form, name)
    try:
        url = validate_base_url(raw, what)
    except InvalidBaseURL as exc:
        refused = targets.refusal_of_misspelled(raw)
        if refused is not None:
            raise forms.ValidationError(
                target_refused_message(what, raw.strip(), refused), code="host_not_allowed"
            ) from None
        raise forms.ValidationError(str(exc), code="invalid_url") from None
    try:
        targets.check_url(url)
    except targets.TargetRefused as exc:
        raise forms.ValidationError(target_refused_message(what, url, exc), code="host_not_allowed") from None
    return url


def target_refused_message(what: str, url: str, exc: targets.TargetRefused) -> str:
    """The form error for a URL the target policy refuses: names the host, the rule and the
    setting to change, e.g. ``agent URL: host '127.0.0.1' is not allowed here (127.0.0.1 is a
    loopback address; …GYMWEB_ALLOW_LOCAL_TARGETS=1…).``"""
    host = urlsplit(url).hostname or exc.host
    return f"{what}: host {host!r} is not allowed here ({exc.reason})."


def clean_agent_url(form: forms.Form, name: str = "agent_url") -> str:
    """``clean_target_url`` for an agent's base URL, which must not end in ``/v1/responses``
    (``run_settings.check_agent_path``: gymweb appends it itself)."""
    url = clean_target_url(form, name, "agent URL")
    try:
        return run_settings.check_agent_path(url, name)
    except SettingError as exc:
        raise forms.ValidationError(exc.message, code=exc.code) from None


def number_field(field: str, form_field: type[forms.Field], **kwargs: Any) -> forms.Field:
    """A form field for numeric run setting ``field``: its range (``run_settings.LIMITS``) is the
    browser's ``min``/``max`` and is checked by ``run_settings.check_number`` in ``clean_<field>``."""
    limit = LIMITS[field]
    attrs = {"min": f"{limit.minimum:g}"}
    top = run_settings.maximum(field)
    if top is not None:
        attrs["max"] = f"{top:g}"
    if form_field is forms.FloatField:
        attrs["step"] = "any"
    return form_field(widget=forms.NumberInput(attrs=attrs), **kwargs)


PREVIEW_CHARS = 80
_FIRST_CONTENT = re.compile(r'"content"\s*:\s*"((?:[^"\\]|\\.)*)')  # the closing quote may be cut off


def _message_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def first_prompt(row_json: str | None, limit: int = PREVIEW_CHARS) -> str:
    """The first user message of a dataset row's ``responses_create_params.input``, on one line
    and cut to ``limit`` characters (``…``); ``""`` when it has none. ``row_json`` may be cut
    short (a row's first few thousand characters): then the first ``"content"`` string is used."""
    if not row_json:
        return ""
    text = ""
    try:
        row = json.loads(row_json)
    except ValueError:
        match = _FIRST_CONTENT.search(row_json)
        if match:
            try:
                text = json.loads(f'"{match.group(1)}"')
            except ValueError:  # cut inside an escape
                text = match.group(1).replace("\\n", " ")
    else:
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        items = params.get("input") if isinstance(params, dict) else None
        if isinstance(items, str):
            text = items
        elif isinstance(items, list):
            users = [i for i in items if isinstance(i, dict) and i.get("role", "user") == "user"]
            text = _message_text(users[0]) if users else ""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def with_first_rows(datasets):
    """``datasets`` (a queryset) annotated with ``first_row``: the first few thousand characters
    of each one's first row, for ``dataset_label``'s preview, in the same query."""
    first = DatasetRow.objects.filter(dataset=OuterRef("pk")).order_by("line").values("data_json")[:1]
    return datasets.annotate(first_row=Substr(Subquery(first), 1, 4000))


def dataset_origin(dataset: Dataset) -> str:
    """Where a stored dataset came from, in words: ``selection of run #3`` or ``file good.jsonl``."""
    if dataset.source_run_id:
        return f"selection of run #{dataset.source_run_id}"
    return f"file {dataset.source_name}" if dataset.source_name else ""


def dataset_label(dataset: Dataset) -> str:
    """How a stored dataset reads in a list: ``#12 good.jsonl · 5 rows · file good.jsonl ·
    2026-11-29 09:12 · “add 1 then add 2 …”`` (the preview when annotated by ``with_first_rows``)."""
    rows = dataset.num_rows
    created = timezone.localtime(dataset.created).strftime("%Y-%m-%d %H:%M") if dataset.created else ""
    preview = first_prompt(getattr(dataset, "first_row", None))
    parts = (
        f"#{dataset.pk} {dataset.name}",
        f"{rows:,} row{'' if rows == 1 else 's'}",
        dataset_origin(dataset),
        created,
        f"“{preview}”" if preview else "",
    )
    return " · ".join(p for p in parts if p)


class DatasetChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Dataset) -> str:
        return dataset_label(obj)


class DatasetRenameForm(forms.Form):
    """Rename a stored dataset: which one and its new name (the name it came with is kept). Its
    fields carry ``form="dataset-rename"`` and the prefix ``rename``, so they can sit inside the
    new-run form's dataset section while belonging to their own (empty) form element."""

    FORM_ID = "dataset-rename"
    dataset = DatasetChoiceField(
        queryset=Dataset.objects.none(),
        label="Rename",
        empty_label=None,
        widget=forms.Select(attrs={"form": FORM_ID}),
    )
    name = forms.CharField(
        max_length=200,
        label="to",
        strip=True,
        widget=forms.TextInput(attrs={"form": FORM_ID, "size": 32, "placeholder": "a name you will recognise"}),
    )

    def __init__(self, *args, queryset=None, **kwargs):
        kwargs.setdefault("prefix", "rename")
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = queryset if queryset is not None else with_first_rows(all_datasets())

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if not name:
            raise forms.ValidationError("Give the dataset a name.")
        return name


def all_datasets():
    """Every stored dataset, newest first (not those still being written)."""
    return Dataset.objects.filter(writing_until__isnull=True).order_by("-created", "-id")


class RunForm(forms.Form):
    """Launch a run: a dataset (a new JSONL upload or an earlier one), the two services and the
    knobs of ``Run``. Validation reads and checks every row of an upload (``streamed_upload.scan``:
    one row at a time, none kept), so an invalid form stores nothing; ``access.launch_from_form``
    reads it again to store it."""

    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the dataset's name.")
    dataset_file = NamedFileField(
        required=False,
        label="Upload a JSONL dataset",
        help_text="One task per line, each with responses_create_params. Rows of an earlier rollouts file work too.",
        widget=forms.ClearableFileInput(
            attrs={"accept": ".jsonl,.json,.ndjson,application/jsonl,application/x-ndjson"}
        ),
    )
    dataset = DatasetChoiceField(
        queryset=with_first_rows(all_datasets()),
        required=False,
        label="…or reuse an earlier dataset",
        empty_label="(none)",
    )
    nemo_config = forms.CharField(
        required=False,
        label="NeMo Gym config (YAML)",
        help_text="Paste a NeMo Gym config (e.g. counter_remote.yaml): the agent's agent_base_url, its environment, "
        "concurrency, max_steps and timeouts fill the fields below.",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
    )
    nemo_config_file = NamedFileField(
        required=False,
        label="…or upload it",
        widget=forms.ClearableFileInput(attrs={"accept": ".yaml,.yml,application/yaml,text/yaml"}),
    )
    head_url = forms.CharField(
        required=False,
        max_length=2000,
        label="NeMo Gym head server",
        help_text="Where `gym env start` runs (NeMo Gym's default http://127.0.0.1:11000): the environment is found "
        "there by name, at its current port, when the run starts and on every retry.",
        widget=forms.TextInput(attrs={"placeholder": "http://127.0.0.1:11000", "size": 48, "autocomplete": "off"}),
    )
    env_name = forms.CharField(
        required=False,
        max_length=200,
        label="Environment name",
        help_text="The resources server's name in the head server's config (default: the agent's resources_server).",
    )
    agent_url = forms.CharField(
        required=False,
        label="Agent base URL",
        max_length=2000,
        help_text="Your service: gymweb POSTs to {agent_url}/v1/responses.",
        widget=forms.TextInput(attrs={"placeholder": "http://127.0.0.1:9102", "size": 48, "autocomplete": "off"}),
    )
    env_url = forms.CharField(
        required=False,
        label="Environment base URL",
        max_length=2000,
        help_text="A NeMo Gym resources server: /seed_session, one route per tool, /verify.",
        widget=forms.TextInput(attrs={"placeholder": "http://127.0.0.1:9101", "size": 48, "autocomplete": "off"}),
    )
    agent_name = forms.CharField(
        max_length=run_settings.NAME_MAX_CHARS,
        initial=run_settings.DEFAULT_AGENT_NAME,
        help_text="agent_ref.name in the output rows; with a NeMo Gym config or head server, the agent to use.",
    )
    concurrency = number_field(
        "concurrency",
        forms.IntegerField,
        initial=run_settings.default("concurrency"),
        help_text="Rollouts in flight at once.",
    )
    max_steps = number_field(
        "max_steps", forms.IntegerField, required=False, help_text="Agent calls per rollout; empty or 0 = unbounded."
    )
    num_repeats = number_field(
        "num_repeats", forms.IntegerField, initial=run_settings.default("num_repeats"), help_text="Rollouts per task."
    )
    limit = number_field("limit", forms.IntegerField, required=False, help_text="Only the first N rows of the dataset.")
    remote_responses_timeout_s = number_field(
        "remote_responses_timeout_s",
        forms.FloatField,
        label="Per-call timeout (s)",
        initial=run_settings.default("remote_responses_timeout_s"),
        help_text="remote_responses_timeout_s: one agent call.",
    )
    run_timeout_s = number_field(
        "run_timeout_s",
        forms.FloatField,
        label="Whole-rollout timeout (s)",
        help_text="run_timeout_s: one rollout, all calls included.",
    )
    max_attempts = number_field(
        "max_attempts",
        forms.IntegerField,
        initial=run_settings.default("max_attempts"),
        help_text="Attempts per rollout in all, retries included.",
    )
    env_max_in_flight = number_field(
        "env_max_in_flight",
        forms.IntegerField,
        required=False,
        label="Env calls in flight",
        help_text="Most of this run's calls out to the env at once; the oldest rollout's call goes next. "
        "For an env that is one process (most NeMo Gym resources servers): results come in the order rollouts "
        "started. Empty or 0: the server's setting.",
    )
    overrides = forms.CharField(
        required=False,
        label="Overrides (JSON object)",
        help_text='Merged into every row\'s responses_create_params, e.g. {"temperature": 0.2, "model": "my-model"}.',
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono"}),
    )

    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        required=False,
        label="Team",
        empty_label=None,
        help_text="Who sees the run (and an uploaded dataset): members of this team.",
    )

    def __init__(
        self,
        *args: Any,
        too_large_uploads: set | None = None,
        defer_dataset: bool = False,
        user=None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.too_large_uploads = too_large_uploads or set()
        self.defer_dataset = defer_dataset  # an upload is read later, by a background task
        # ``user``: the datasets offered are their teams' (rollouts.teams); the team field is shown
        # only to a user who may choose among several teams (the default is their first).
        self.user = user
        if user is not None:
            self.fields["dataset"].queryset = with_first_rows(teams.visible_datasets(user).order_by("-created", "-id"))
            choosable = teams.choosable_teams(user)
            self.fields["team"].queryset = choosable
            first = teams.teams_of(user)
            self.fields["team"].initial = first[0].pk if first else choosable.values_list("pk", flat=True).first()
        # Offered on the page only to a user with several teams to choose from; still checked for
        # everyone, so a ``team`` the user may not use (the API's) is refused, not ignored.
        self.offer_team = user is not None and self.fields["team"].queryset.count() >= 2
        if user is None:
            del self.fields["team"]
        # The services an instance offers by default (``make demo`` sets its example env and agent).
        self.fields["agent_url"].initial = settings.GYMWEB_DEFAULT_AGENT_URL or None
        self.fields["env_url"].initial = settings.GYMWEB_DEFAULT_ENV_URL or None
        self.max_run_timeout_s = run_settings.max_run_timeout_s()
        self.fields["run_timeout_s"].initial = run_settings.default("run_timeout_s")
        self.fields["run_timeout_s"].help_text += f" At most {self.max_run_timeout_s:g} s."
        self.fields["run_timeout_s"].widget.attrs["max"] = f"{self.max_run_timeout_s:g}"
        self.max_upload_bytes = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
        self.fields["dataset_file"].help_text += f" Up to {binary_size(self.max_upload_bytes)}."
        self.fields["head_url"].initial = settings.GYMWEB_NEMO_GYM_HEAD_URL or None
        if not self.is_bound and not self.initial.get("dataset"):
            # The dataset uploaded last is the likeliest next run (the demo's, after `make demo`):
            # "Start run" works straight away.
            self.fields["dataset"].initial = (
                self.fields["dataset"].queryset.values_list("pk", flat=True).first()  # type: ignore[attr-defined]
            )
        # An upload read and validated (``streamed_upload.scan``: its rows counted, none kept)
        self.found: streamed_upload.Scan | None = None
        self.nemo: Resolved | None = None  # what a NeMo Gym config / head server gave

    # -- NeMo Gym --------------------------------------------------------------------------------
    NEMO_FIELDS = {
        "agent_url": "agent_url",
        "env_url": "env_url",
        "concurrency": "concurrency",
        "max_steps": "max_steps",
        "remote_responses_timeout_s": "remote_responses_timeout_s",
        "run_timeout_s": "run_timeout_s",
    }

    def nemo_config_text(self) -> tuple[str, str]:
        """``(source name, YAML)`` of the uploaded or pasted config; ``("", "")`` when none."""
        upload = self.files.get("nemo_config_file") if self.files else None
        if upload is not None:
            if upload.size > 1024 * 1024:
                raise NemoConfigError(f"{upload.name}: a NeMo Gym config over 1 MB is not accepted")
            return PurePath(upload.name).name, upload.read().decode("utf-8", errors="replace")
        text = (self.data.get("nemo_config") or "").strip() if self.data else ""
        return ("the pasted config", text) if text else ("", "")

    def resolve_nemo(self) -> tuple[Resolved | None, tuple[str, str] | None]:
        """The agent, env and knobs of the NeMo Gym config and/or head server in the form's raw
        data: ``(resolved, None)``, ``(None, (field, error))``, or ``(None, None)`` when neither is given."""
        try:
            source, text = self.nemo_config_text()
        except NemoConfigError as exc:
            return None, ("nemo_config_file", str(exc))
        head_url = (self.data.get("head_url") or "").strip() if self.data else ""
        if not text and not head_url:
            return None, None
        agent_name = (self.data.get("agent_name") or "").strip() or None
        env_name = (self.data.get("env_name") or "").strip() or None
        try:
            config = load_texts([(source, text)]) if text else None
            if agent_name == self.fields["agent_name"].initial:
                names = {a.name for a in (config.agents() if config else [])}
                if agent_name not in names:
                    agent_name = None  # the form's default name: take the config's single agent
            resolved = environments.resolve(config, head_url=head_url or None, agent_name=agent_name, env_name=env_name)
        except NemoConfigError as exc:
            return None, ("nemo_config" if text else "head_url", str(exc))
        except environments.HeadServerError as exc:
            return None, ("head_url", str(exc))
        return resolved, None

    def fill_from_nemo(self) -> dict[str, Any] | None:
        """The form's data with the fields the NeMo Gym config / head server gives filled in (use
        ``annotate_sources`` on the new form to say where from). None when nothing could be read;
        ``fill_error`` then says why."""
        self.fill_error: tuple[str, str] | None = None
        resolved, error = self.resolve_nemo()
        if resolved is None:
            self.fill_error = error or (
                "nemo_config",
                "Paste or upload a NeMo Gym config, or enter a head server, first.",
            )
            return None
        data = self.data.copy()
        values = {
            "agent_url": resolved.agent_url,
            "env_url": resolved.env_url,
            "agent_name": resolved.agent_name,
            "env_name": resolved.env_name,
            "head_url": resolved.head_url or "",
            **resolved.options,
        }
        for name, value in values.items():
            if value is not None:
                data[name] = str(value)
        self.nemo = resolved
        return data

    def annotate_sources(self, resolved: Resolved) -> None:
        """Add "from FILE: key.path" to the help text of each field the config filled."""
        for name, key in (
            ("agent_url", "agent_url"),
            ("env_url", "env_url"),
            ("env_name", "env"),
            ("concurrency", "concurrency"),
            ("max_steps", "max_steps"),
            ("remote_responses_timeout_s", "remote_responses_timeout_s"),
            ("run_timeout_s", "run_timeout_s"),
        ):
            if key in resolved.sources:
                self.fields[name].help_text = f"From {resolved.sources[key]}. " + str(self.fields[name].help_text)

    # -- services --------------------------------------------------------------------------------
    def clean_agent_url(self) -> str:
        if not self.cleaned_data.get("agent_url"):
            return ""
        url = clean_agent_url(self)
        problem = environments.miswiring_problem(url, (self.data.get("head_url") or "").strip() or None)
        if problem:
            raise forms.ValidationError(problem, code="nemo_gym_agent_server")
        return url

    def clean_env_url(self) -> str:
        if not self.cleaned_data.get("env_url"):
            return ""
        return clean_target_url(self, "env_url", "environment URL")

    def clean_head_url(self) -> str:
        if not self.cleaned_data.get("head_url"):
            return ""
        return clean_target_url(self, "head_url", "head server URL")

    # -- knobs -----------------------------------------------------------------------------------
    def clean_setting(self, name: str, check: Any) -> Any:
        """``check(value)`` of field ``name``'s cleaned value (a ``run_settings`` check); its
        ``SettingError`` as this field's error."""
        try:
            return check(self.cleaned_data.get(name))
        except SettingError as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None

    def clean_number(self, name: str) -> Any:
        return self.clean_setting(name, lambda value: run_settings.check_number(name, value))

    def clean_concurrency(self) -> int:
        return self.clean_number("concurrency")

    def clean_max_steps(self) -> int | None:
        return self.clean_number("max_steps")

    def clean_num_repeats(self) -> int:
        return self.clean_number("num_repeats")

    def clean_limit(self) -> int | None:
        return self.clean_number("limit")

    def clean_max_attempts(self) -> int:
        return self.clean_number("max_attempts")

    def clean_env_max_in_flight(self) -> int:
        return self.clean_setting(
            "env_max_in_flight", lambda value: run_settings.check_number("env_max_in_flight", value or 0)
        )

    def clean_remote_responses_timeout_s(self) -> float:
        return self.clean_number("remote_responses_timeout_s")

    def clean_run_timeout_s(self) -> float:
        return self.clean_number("run_timeout_s")

    def clean_agent_name(self) -> str:
        return self.clean_setting("agent_name", run_settings.check_agent_name)

    def clean_overrides(self) -> dict[str, Any]:
        return self.clean_setting("overrides", run_settings.check_overrides)

    # -- dataset ---------------------------------------------------------------------------------
    def clean_dataset_file(self):
        upload = self.cleaned_data.get("dataset_file")
        if "dataset_file" in self.too_large_uploads or (upload is not None and upload.size > self.max_upload_bytes):
            raise forms.ValidationError(upload_limit_message(self.max_upload_bytes), code="too_large")
        if upload is None or self.defer_dataset:
            return upload
        try:
            # every row validated one at a time, none kept; refused while read past the key limit
            self.found = streamed_upload.scan(
                upload, upload.name, int(settings.GYMWEB_MAX_KEYS_PER_RUN), int(settings.GYMWEB_MAX_LINE_BYTES)
            )
        except DatasetError as exc:
            raise forms.ValidationError(str(exc), code="bad_dataset") from None
        return upload

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.user is not None and self.has_error("team", "invalid_choice"):
            # Django's "Select a valid choice" names nothing: say which teams the user may choose.
            self.errors["team"] = self.error_class([teams.not_yours(self.user, self.data.get("team"))])
        if self.has_error("team") and not self.offer_team:  # the page shows no team field to mark
            self.add_error(None, self.errors["team"][0])
        if self.user is not None and not self.has_error("team"):
            try:
                teams.team_for_new(self.user, data.get("team"))
            except teams.NoTeam as exc:  # the run would land in a team its user cannot see
                self.add_error("team" if self.offer_team else None, str(exc))
        if self.has_error("dataset", "invalid_choice"):
            shown = str(self.data.get("dataset"))[:40]
            self.errors["dataset"] = self.error_class(
                [f"dataset {shown}: not a dataset you can use (GET /api/v1/datasets and the new-run page list yours)"]
            )
        self._clean_services(data)
        upload, dataset = data.get("dataset_file"), data.get("dataset")
        if "dataset_file" in self.errors or "dataset" in self.errors:
            return data
        if upload and dataset:
            self.add_error("dataset", "Choose either an upload or an earlier dataset, not both.")
        elif not upload and not dataset:
            self.add_error("dataset_file", "Upload a JSONL dataset or choose an earlier one.")
        elif data.get("num_repeats"):
            rows = self.found.num_rows if upload and self.found else (dataset.num_rows if dataset else 0)
            try:
                check_size(rows, data["num_repeats"], data.get("limit"))
            except RunTooLarge as exc:
                self.add_error("num_repeats", str(exc).replace("--limit/num_repeats", "the limit or num repeats"))
        return data

    def _clean_services(self, data: dict[str, Any]) -> None:
        """The agent and env: as typed, or from the NeMo Gym config / head server when left empty;
        a head server's env is kept by name (resolved again on retry)."""
        if "agent_url" in self.errors or "env_url" in self.errors:
            return
        if not data.get("agent_url") or not data.get("env_url"):
            resolved, error = self.resolve_nemo()
            if error is not None:
                self.add_error(*error)
            if resolved is None:
                if error is None:
                    for name in ("agent_url", "env_url"):
                        if not data.get(name):
                            self.add_error(
                                name,
                                "This field is required: enter a URL, "
                                "or give a NeMo Gym config or head server to find it.",
                            )
                return
            self.nemo = resolved
            for name in ("agent_url", "env_url"):
                if not data.get(name):
                    self._fill_service(data, name, resolved)
        elif data.get("head_url") and not self.nemo:
            resolved, _ = self.resolve_nemo()
            if resolved is not None and resolved.env_url == data.get("env_url"):
                self.nemo = resolved

    def _fill_service(self, data: dict[str, Any], name: str, resolved: Resolved) -> None:
        """``data[name]`` (``agent_url`` or ``env_url``, left empty) from the NeMo Gym config / head
        server, checked as a typed one is; an error on the field when it cannot be."""
        value = getattr(resolved, name)
        if not value:
            self.add_error(name, f"The NeMo Gym config gives no {name.replace('_', ' ')}: enter it.")
            return
        what = name.replace("_", " ")
        try:
            url = run_settings.check_url(name, value, what)
            if name == "agent_url":
                problem = environments.miswiring_problem(url, resolved.head_url)
                if problem:
                    self.add_error(name, problem)
                    return
            targets.check_url(url)
        except SettingError as exc:
            self.add_error(name, exc.message)
            return
        except targets.TargetRefused as exc:
            self.add_error(name, target_refused_message(what, value, exc))
            return
        data[name] = url

    def dataset_name(self) -> str:
        upload = self.cleaned_data.get("dataset_file")
        if upload:
            return PurePath(upload.name).name
        return self.cleaned_data["dataset"].name

    def run_options(self) -> dict[str, Any]:
        """``Run`` fields for ``runs.create_run``."""
        d = self.cleaned_data
        by_head = self.nemo is not None and self.nemo.head_url and self.nemo.env_url == d["env_url"]
        return {
            "agent_url": d["agent_url"],
            "env_url": d["env_url"],
            "head_url": self.nemo.head_url if by_head else "",
            "env_name": self.nemo.env_name if by_head else "",
            "agent_name": d["agent_name"],
            "concurrency": d["concurrency"],
            "max_steps": d["max_steps"] or None,
            "num_repeats": d["num_repeats"],
            "limit": d["limit"],
            "max_attempts": d["max_attempts"],
            "auto_retry": bool(settings.GYMWEB_AUTO_RETRY),
            "remote_responses_timeout_s": d["remote_responses_timeout_s"],
            "run_timeout_s": d["run_timeout_s"],
            "env_max_in_flight": d.get("env_max_in_flight") or 0,
            "overrides": d["overrides"],
            "source_file": self.dataset_name()[:500],
        }
