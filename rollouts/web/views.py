"""Run pages: the runs list, the new-run form, a run's page (live while it runs), cancel, retry, export.

Plain function views. Pages render whole for a normal request and as a named partial for an HTMX
request (except a history restore, which needs the whole page); such responses carry
``Vary: HX-Request``. Aggregates come from ``run_summary`` (SQL only). Access goes through
``access.run_for`` (every signed-in user sees every run, one team per instance).
"""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.paginator import Paginator
from django.db.models import Count
from django.db.models.functions import Substr
from django.http import Http404, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from rollouts import background, targets, teams
from rollouts.collection import archive, environments, runs
from rollouts.collection.export import iter_failures, iter_materialized, iter_successes
from rollouts.downloads import jsonl_download
from rollouts.evaluation import run_summary
from rollouts.evaluation.aggregate_metrics import aggregate_metrics_path
from rollouts.lossless import LosslessTextField
from rollouts.models import AgentCall, BackgroundTask, Rollout, Run, Worker
from rollouts.review import actions as review_actions
from rollouts.review.curated import ExportOptions
from rollouts.review.filters import corrected_reward
from rollouts.review.query import RolloutFilterForm, export_filename, filter_problem, filtered_rollouts
from rollouts.web.access import launch_from_form, run_for, runs_for
from rollouts.web.forms import DatasetRenameForm, RunForm, with_first_rows
from rollouts.web.htmx import vary_on_htmx, wants_partial
from rollouts.web.review_views import curated_export_response, run_review_context, say_plain_export
from rollouts.web.run_columns import attach_columns, column_heads, run_fields
from rollouts.web.uploads import too_large_uploads
from rollouts.workers import serving

RUNS_PER_PAGE = 25
ROLLOUTS_PER_PAGE = 50
EXPORT_KINDS = {
    "rollouts": "successes: the env's /verify replies plus indices and agent_ref (NeMo Gym's rollouts.jsonl)",
    "rollouts_failures": "one row per failed attempt (NeMo Gym's failures sidecar)",
    "rollouts_materialized_inputs": "the materialised input row of every rollout",
}


SEARCH_COUNT_CAP = 10_000


class CappedPaginator(Paginator):
    """A ``Paginator`` whose ``count`` stops at ``SEARCH_COUNT_CAP`` (``capped`` says it did): the
    count query reads the ordered list up to one row past the cap and no further."""

    cap = SEARCH_COUNT_CAP

    @property
    def count(self) -> int:
        if not hasattr(self, "_capped_count"):
            found = self.object_list[: self.cap + 1].count()
            self.capped = found > self.cap
            self._capped_count = min(found, self.cap)
        return self._capped_count

    capped = False


# -- runs list ---------------------------------------------------------------------------------------
@login_required
@require_safe
def runs_list(request):
    page = Paginator(
        runs_for(request.user).select_related("dataset").order_by("-created", "-id"), RUNS_PER_PAGE
    ).get_page(request.GET.get("page"))
    progress = run_summary.progress_for_runs(page.object_list)
    rows = [(run, progress[run.pk]) for run in page.object_list]
    context = {"page": page, "rows": rows, "any_active": any(not run.is_final for run, _ in rows)}
    template = "rollouts/partials/run_list_table.html" if wants_partial(request) else "rollouts/runs_list.html"
    return vary_on_htmx(render(request, template, context))


# -- new run -----------------------------------------------------------------------------------------
def upload_job(task, progress) -> background.Done:
    """The background task of a new run from an uploaded dataset, in bounded memory
    (``rollouts.collection.streamed_upload``): the new-run form's other fields checked again, the
    kept file read once to validate it (refused past the key limit while read, before anything is
    stored), then read again into the dataset, tasks and rollouts in short transactions, and the
    run launched. A refusal lists the form's errors."""
    from pathlib import Path

    from django.core.files import File
    from django.utils.datastructures import MultiValueDict

    from rollouts.collection import streamed_upload
    from rollouts.collection.datasets import DatasetError
    from rollouts.collection.run_rows import RunTooLarge

    kept = task.params["files"][0]
    path = Path(kept["path"])
    progress(None, f"Reading {kept['name']}…", force=True)
    with path.open("rb") as fh:
        form = RunForm(
            MultiValueDict(task.params["post"]),
            MultiValueDict({"dataset_file": [File(fh, kept["name"])]}),
            defer_dataset=True,
            user=task.user,
        )
        if not form.is_valid():
            raise background.TaskFailed(_form_errors(form))
    source, line_limit = form.dataset_name(), int(settings.GYMWEB_MAX_LINE_BYTES)
    try:
        found = streamed_upload.scan(path, source, int(settings.GYMWEB_MAX_KEYS_PER_RUN), line_limit, progress)
        run, reused = streamed_upload.store_and_create_run(
            path,
            source,
            found,
            dataset_name=source,
            run_name=form.cleaned_data["name"] or source,
            user=task.user,
            team=form.cleaned_data.get("team"),
            max_line_bytes=line_limit,
            progress=progress,
            **form.run_options(),
        )
    except DatasetError as exc:
        raise background.TaskFailed(f"{form.fields['dataset_file'].label}: {exc}") from None
    except RunTooLarge as exc:
        message = str(exc).replace("--limit/num_repeats", "the limit or num repeats")
        raise background.TaskFailed(f"{form.fields['num_repeats'].label}: {message}") from None
    runs.launch(run)
    note = f" The file was uploaded before: dataset #{run.dataset_id} reused." if reused else ""
    return background.Done(
        f"Run “{run.name}” started: {run.num_keys} rollouts.{note}", url=reverse("run", args=[run.pk])
    )


def _form_errors(form) -> str:
    return " ".join(
        f"{form.fields[field].label}: {e}" if field in form.fields else e
        for field, es in form.errors.items()
        for e in es
    )


@login_required
@require_http_methods(["GET", "POST"])
def run_new(request):
    """The new-run form; a valid POST stores the dataset and the run and launches it. Uploads pass
    ``uploads.SizeLimitUploadHandler`` (a file over the limit is an error on its field)."""
    head = None
    if request.method == "POST" and "fill" in request.POST:
        # "Fill from NeMo Gym": the fields the config / head server gives, each saying where from
        form = RunForm(request.POST, request.FILES, too_large_uploads=too_large_uploads(request), user=request.user)
        filled = form.fill_from_nemo()
        if filled is not None:
            resolved = form.nemo
            form = RunForm(initial={k: v for k, v in filled.items() if k != "csrfmiddlewaretoken"}, user=request.user)
            form.annotate_sources(resolved)
            if resolved.head_url:
                head = environments.head_listing(resolved.head_url, with_tools=False)
        else:
            error = form.fill_error
            form = RunForm(
                initial={k: v for k, v in request.POST.items() if k != "csrfmiddlewaretoken"}, user=request.user
            )
            form.fill_problem = error[1]
        return render(
            request,
            "rollouts/run_new.html",
            {"form": form, "head": head, "filled": filled is not None},
            status=200 if filled is not None else 400,
        )
    if request.method == "POST":
        # An upload is read, stored and launched by a background task (``upload_job``), unless
        # tasks run inline: the request then does it all, as the task would.
        defer = bool(request.FILES.get("dataset_file")) and not settings.GYMWEB_TASKS_INLINE
        form = RunForm(
            request.POST,
            request.FILES,
            too_large_uploads=too_large_uploads(request),
            defer_dataset=defer,
            user=request.user,
        )
        if form.is_valid() and defer:
            params = {"post": {k: v for k, v in request.POST.lists() if k != "csrfmiddlewaretoken"}}
            try:
                task, _ = background.start(
                    BackgroundTask.Kind.UPLOAD,
                    request.user,
                    params,
                    files=[("dataset_file", form.cleaned_data["dataset_file"])],
                )
            except background.TooManyTasks as exc:
                form.add_error(None, str(exc))
            else:
                return redirect("task", task.pk)
        elif form.is_valid():
            run, reused = launch_from_form(form, request.user)
            note = f" The file was uploaded before: dataset #{run.dataset_id} reused." if reused else ""
            messages.success(request, f"Run “{run.name}” started: {run.num_keys} rollouts.{note}")
            return redirect("run", run.pk)
    else:
        # ?dataset=ID preselects a stored dataset (the import page links here for a dataset file).
        initial = {"dataset": request.GET.get("dataset")} if request.GET.get("dataset", "").isdigit() else {}
        # the Environments page's "new run" links pre-fill the environment
        for name in ("agent_url", "env_url", "head_url", "env_name", "agent_name"):
            if request.GET.get(name):
                initial[name] = request.GET[name][:2000]
        form = RunForm(initial=initial or None, user=request.user)
        # what the head server of the Environments page's link (or GYMWEB_NEMO_GYM_HEAD_URL) runs now
        head_url = initial.get("head_url") or settings.GYMWEB_NEMO_GYM_HEAD_URL
        if head_url:
            head = environments.head_listing(head_url, with_tools=False)
    context = {
        "form": form,
        "head": head,
        "file_dropped": bool(form.is_bound and (request.FILES or form.too_large_uploads)),
        "rename_form": rename_form_for(request.user, form["dataset"].value()),
    }
    return render(request, "rollouts/run_new.html", context, status=400 if form.is_bound else 200)


def rename_form_for(user, chosen) -> DatasetRenameForm | None:
    """The new-run page's rename form over the datasets ``user`` may rename (staff: all; others:
    their own), among their teams' datasets, ``chosen`` first selected; ``None`` when there is none."""
    visible = teams.visible_datasets(user).order_by("-created", "-id")
    datasets = visible if user.is_staff else visible.filter(created_by=user)
    if not datasets.exists():
        return None
    return DatasetRenameForm(queryset=with_first_rows(datasets), initial={"dataset": chosen})


# -- run page ----------------------------------------------------------------------------------------
def _table_context(request, run: Run, kinds: list[str], with_rows: bool = True) -> dict:
    """The rollouts section's context: the filter, and (``with_rows``) the page of rows the table
    shows; without rows, only what the section shows around the table."""
    qs, filt = filtered_rollouts(run, request.GET, kinds=kinds)
    fields = run_fields(run)  # the task and verify fields the column chooser offers
    base = reverse("run", args=[run.pk])
    around = {
        "run_fields": fields,
        "column_heads": column_heads(filt.columns, fields, filt, base),
        "filter": filt,
        "filter_description": filt.describe(),
        # What the "download these" links get: each file named after the run and the filter.
        "filtered_files": [(kind, export_filename(run.pk, kind, filt)) for kind in ("rollouts", "rollouts_failures")],
        "filter_qs": filt.querystring(),
    }
    if not with_rows:
        return around
    # Page over ids only (the sort reads a few columns), then load that page's 50 rows: a deep
    # page never drags every row's wide columns through the sort.
    # A content search counts its matches up to SEARCH_COUNT_CAP ("10,000+ rows"): a common text
    # matches most of a big run, and an exact count would probe every rollout.
    if filt.errors:  # the form's errors are the answer, as for a range that matches nothing
        paginator = Paginator(Rollout.objects.none().values_list("id", flat=True), ROLLOUTS_PER_PAGE)
    elif filt.searching:
        paginator = CappedPaginator(qs.values_list("id", flat=True), ROLLOUTS_PER_PAGE)
    else:  # a field sort's first pages read from its index (RolloutFilterForm.page_ids)
        paginator = Paginator(filt.page_ids(qs), ROLLOUTS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    ids = list(page.object_list)
    loaded = (
        Rollout.objects.filter(id__in=ids)
        .only(
            "id",
            "run_id",
            "task_index",
            "rollout_index",
            "attempt",
            "status",
            "reward",
            "failure_kind",
            "terminal",
            "duration_ms",
            "num_agent_calls",
            "num_tool_calls",
            "total_tokens",
            "usage_reported",
        )
        .annotate(
            error_head=Substr("error", 1, 160, output_field=LosslessTextField()),
            corrected=corrected_reward(),  # the corrected reward in force, shown beside the env's
        )
        .in_bulk()
    )
    review_actions.attach_to_rows(loaded.values())  # labels and note counts (rollouts.review)
    # the chosen columns' cells, and a content search's snippet per row
    attach_columns(run, list(loaded.values()), filt.columns, fields, filt.value("text") or "")
    _attach_live_calls(loaded.values())
    qs_text = filt.querystring()
    # A content search's rows open the rollout with its hits highlighted (the page's ``?q=``).
    link_qs = "&".join(p for p in (qs_text, urlencode({"q": filt.highlight}) if filt.highlight else "") if p)
    rollout_suffix = f"?{link_qs}" if link_qs else ""
    rows = [(loaded[i], reverse("rollout", args=[run.pk, i]) + rollout_suffix) for i in ids if i in loaded]
    here = base + "?" + "&".join(p for p in (qs_text, f"page={page.number}" if page.number > 1 else "") if p)
    return {
        **around,
        "page": page,
        "rows": rows,
        "table_url": here.rstrip("?"),
        "sort_links": _sort_links(filt, base),
        "page_qs": qs_text,
    }


def _attach_live_calls(rows) -> None:
    """A running row's ``num_agent_calls`` is written when it ends: until then count its stored
    agent calls (one grouped query over the page's running rows) so the table shows progress."""
    running = {r.pk: r for r in rows if r.status == Rollout.Status.RUNNING}
    if not running:
        return
    counts = dict(
        AgentCall.objects.filter(rollout_id__in=list(running))
        .values_list("rollout_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    for pk, row in running.items():
        row.num_agent_calls = counts.get(pk, 0)


def running_calls(run: Run) -> int:
    """Agent calls stored so far by the run's running attempts (part of the live signature, so the
    table refreshes while a long rollout grows)."""
    return AgentCall.objects.filter(rollout__run=run, rollout__status=Rollout.Status.RUNNING).count()


def _sort_links(filt: RolloutFilterForm, base: str) -> dict[str, dict]:
    """Per sortable column: the URL that sorts by it (toggling direction) and its current arrow."""
    current = filt.sort_key
    out = {}
    for column in ("task", "reward", "duration", "calls"):
        if current == column:
            target, arrow = f"-{column}", "↑"
        elif current == f"-{column}":
            target, arrow = column, "↓"
        else:
            target, arrow = column if column == "task" else f"-{column}", ""
        qs = filt.querystring(sort=target)
        out[column] = {"url": f"{base}?{qs}" if qs else base, "arrow": arrow}
    return out


def _live_workers() -> int:
    """Dispatchers whose heartbeat is recent (within ``GYMWEB_LEASE_S``): one indexed count."""
    since = timezone.now() - timedelta(seconds=float(settings.GYMWEB_LEASE_S))
    return Worker.objects.filter(last_seen__gte=since).count()


def _live_signature(run: Run, progress: run_summary.Progress, live_workers: int | None) -> str:
    """What the live part's poll sends back as ``seen``: rollout states by status, the agent calls of
    running rollouts, how many workers are live and the run's status (last). Equal signatures mean the live part shows the same things
    (except the last minute's rate), so an unchanged poll is answered with 204."""
    rollouts = run_summary.Summary(progress=progress, reward=run_summary.RewardStats()).signature
    calls = running_calls(run) if progress.running else 0
    workers = "" if live_workers is None else live_workers
    # the run's status stays last: run_live reads it back (rpartition) to tell when the run ended
    return f"{rollouts}.{calls}.{workers}.{run.status}"


_UNSET = object()


def retry_label(run: Run, p: run_summary.Progress) -> str | None:
    """The Retry button's label, named for what it would run, or None when it would run nothing
    (every failure terminal or out of attempts, nothing cancelled or interrupted, an imported or archived run,
    a run still going). Keys are counted only for a final run with failed or not-run keys, so the
    live poll of a running run pays nothing for it."""
    if not run.is_final or run.status == Run.Status.IMPORTED or run.is_archived or not (p.failed or p.not_run):
        return None
    keys = runs.retryable_keys(run)
    not_run = sum(1 for _task, _attempt, kill_shaped in keys.values() if kill_shaped)
    failed = len(keys) - not_run
    if failed and not_run:
        return f"Retry {failed:,} failed and run {not_run:,} not run"
    if failed:
        return f"Retry {failed:,} failed"
    if not_run:
        return f"Run the {not_run:,} not run"
    return None


def _live_context(run: Run, progress: run_summary.Progress | None = None, live_workers=_UNSET) -> dict:
    summary = run_summary.run_summary(run, progress=progress)
    p = summary.progress
    if live_workers is _UNSET:
        live_workers = None if run.is_final else _live_workers()
    return {
        "live_workers": live_workers,
        "lease_s": float(settings.GYMWEB_LEASE_S),
        # who serves the run and their share; an imported run has none
        "workers": serving.run_workers(run.pk, float(settings.GYMWEB_LEASE_S)),
        # Work waits and nobody is there to do it: say so, and how to start a worker.
        "no_worker": live_workers == 0 and bool(p.active),
        "run": run,
        "s": summary,
        "p": p,
        "signature": _live_signature(run, p, live_workers),
        "retry_label": retry_label(run, p),
        "export_files": [
            (kind, export_filename(run.pk, kind), description) for kind, description in EXPORT_KINDS.items()
        ],
        # gym eval compare looks for it beside the rollouts file, named after it
        "aggregate_file": aggregate_metrics_path(export_filename(run.pk, "rollouts")).name,
    }


def _shared_table_key(request, run: Run) -> str | None:
    """The cache key of a running run's rollout table (``#rollout-table``) for this query string,
    or None when the table is rendered fresh (a final run; ``GYMWEB_LIVE_CACHE_S`` is 0)."""
    if run.status != Run.Status.RUNNING or float(settings.GYMWEB_LIVE_CACHE_S) <= 0:
        return None
    created = run.created.timestamp() if run.created else 0
    return f"gymweb:table-live:v2:{run.pk}:{created}:{run.status}:{request.GET.urlencode()}"


def _shared_table(request, run: Run, kinds: list[str]) -> tuple[dict, str | None]:
    """The rollouts section's context and, while the run is running, its table's HTML shared by
    everyone watching (``#rollout-table`` holds no form and nothing of the user's) for
    ``GYMWEB_LIVE_CACHE_S``: (context, html or None). The table is what changes on every poll
    of a collecting run and what its automatic refresh fetches; one rendering per query string
    and few seconds serves the whole team. The key holds the run's status, so the table after
    the run ends is fresh."""
    key = _shared_table_key(request, run)
    if key is None:
        return _table_context(request, run, kinds), None
    html = cache.get(key)
    if isinstance(html, SafeString):
        # render_to_string's own SafeString (escaped when it was rendered); the cache pickles it
        # with its type, so nothing is marked safe here. Anything else in the key is ignored.
        return _table_context(request, run, kinds, with_rows=False), html
    context = {"run": run, **_table_context(request, run, kinds)}
    html = render_to_string("rollouts/partials/run_rollout_table.html", context, request)
    cache.set(key, html, float(settings.GYMWEB_LIVE_CACHE_S))
    return context, html


def _table_partial(request, run: Run) -> HttpResponse:
    """The rollouts section alone (a user's filter, sort or page change, which targets
    ``#rollouts``: rendered fresh), or the table alone for its automatic refresh
    (``#rollout-table`` refetches itself when the live part says ``rollouts-changed``; only
    ``#rollout-table`` of the answer is kept, hx-select): shared while the run is running
    (``_shared_table``)."""
    kinds = run_summary.failure_kinds(run)
    if request.headers.get("HX-Target") == "rollout-table":
        context, html = _shared_table(request, run, kinds)
        if html is None:
            html = render_to_string("rollouts/partials/run_rollout_table.html", {"run": run, **context}, request)
        return HttpResponse(html)
    context = {"run": run, **_table_context(request, run, kinds)}
    return render(request, "rollouts/partials/run_rollouts.html", context)


@login_required
@require_safe
def run_detail(request, run_id):
    run = run_for(request, run_id)
    if wants_partial(request):
        # The rollout table (filter, sort, page changes and live refreshes).
        return vary_on_htmx(_table_partial(request, run))
    live = _live_context(run)
    kinds = sorted(row["failure_kind"] for row in live["s"].failure_kinds if row["failure_kind"])
    table, table_html = _shared_table(request, run, kinds)
    context = {**live, **table, "table_html": table_html}
    context.update(run_review_context(request, run))  # the review card
    if run.status == Run.Status.IMPORTED:
        context["agent_name_recorded"] = _agent_name_in_files(run)
    return vary_on_htmx(render(request, "rollouts/run_detail.html", context))


def _agent_name_in_files(run: Run) -> bool:
    """Whether an imported run's files named its agent (a row's ``agent_ref.name``): else its
    ``agent_name`` is the default, not what the files recorded."""
    task = run.tasks.order_by("task_index").only("row_json").first()
    if task is None:
        return False
    try:
        ref = json.loads(task.row_json).get("agent_ref")
    except (ValueError, AttributeError):
        return False
    return isinstance(ref, dict) and ref.get("name") == run.agent_name


@login_required
@require_safe
@never_cache
def run_live(request, run_id):
    """The live part of a run's page (progress, aggregates, actions). Its markup polls itself
    while the run is not final; once final, the returned markup has no trigger and polling stops.
    ``seen`` is the state signature the client last rendered: when it changed, the response asks
    the page to refresh its rollout table too (``HX-Trigger: rollouts-changed``); when it did not
    (a running run that is stalled, or waits for a worker), the answer is 204 No Content, which
    htmx leaves unswapped while it keeps polling: three small indexed queries and no rendering.
    (Not 304: htmx swaps a 304's empty body in; 286 would stop the polling.)"""
    run = run_for(request, run_id)
    seen = request.GET.get("seen")
    known = {}
    if seen is not None and not run.is_final:
        known = {"progress": run_summary.run_progress(run), "live_workers": _live_workers()}
        if seen == _live_signature(run, known["progress"], known["live_workers"]):
            return HttpResponse(status=204)
    context = _live_context(run, **known)
    response = render(request, "rollouts/partials/run_live.html", context)
    if seen is not None and seen != context["signature"]:
        events = ["rollouts-changed"]
        if run.is_final and seen.rpartition(".")[2] not in Run.FINAL:
            # the run ended while the page watched: the charts and the evaluation (loaded once, or
            # polled every 10 s) reload now, so no count on the page stays at its last poll's value
            events.append("run-finished")
        response["HX-Trigger"] = ", ".join(events)
    return response


# -- actions -----------------------------------------------------------------------------------------
@login_required
@require_POST
def run_cancel(request, run_id):
    run = run_for(request, run_id)
    if runs.cancel(run):
        messages.success(request, "Run cancelled. Rollouts in flight stop within a few seconds; resume with “Retry”.")
    else:
        messages.info(request, f"The run was already {run.status}.")
    return HttpResponseRedirect(reverse("run", args=[run.pk]))


@login_required
@require_POST
def run_retry(request, run_id):
    run = run_for(request, run_id)
    if run.status == Run.Status.IMPORTED:
        messages.error(request, "An imported run has no services to run against.")
        return HttpResponseRedirect(reverse("run", args=[run.pk]))
    if run.is_archived:
        messages.error(request, str(archive.RunArchived(run, "a retry")))
        return HttpResponseRedirect(reverse("run", args=[run.pk]))
    if run.head_url and run.env_name:  # a NeMo Gym environment: its port may have moved since
        try:
            environments.refresh_env_url(run)
        except environments.HeadServerError as exc:
            messages.error(request, f"Not retried: {exc}.")
            return HttpResponseRedirect(reverse("run", args=[run.pk]))
    refused = targets.refused_services(run.agent_url, run.env_url)
    if refused:  # nothing is queued: the attempts would only fail with target_refused
        for text in refused:
            messages.error(request, f"Not retried. {text}")
        return HttpResponseRedirect(reverse("run", args=[run.pk]))
    n = runs.resume(run)
    if n:
        messages.success(request, f"Retrying {n} rollout{'s' if n != 1 else ''}.")
    else:
        messages.info(
            request, "Nothing to retry: no failed rollout has attempts left (terminal failures are never retried)."
        )
    return HttpResponseRedirect(reverse("run", args=[run.pk]))


# -- export ------------------------------------------------------------------------------------------
@login_required
@require_safe
def run_export(request, run_id, kind):
    if kind not in EXPORT_KINDS:
        raise Http404("unknown export")
    run = run_for(request, run_id)
    problem = filter_problem(RolloutFilterForm(request.GET))
    if problem:  # a hand-edited link: a file of another list than asked for would be silently wrong
        return HttpResponseBadRequest(
            f"bad filter: {problem}; nothing was exported\n", content_type="text/plain; charset=utf-8"
        )
    refused = archive.download_refusal(
        run, kind, RolloutFilterForm(request.GET).active, ExportOptions.from_params(request.GET).plain
    )
    if refused:  # an archived run: this file needs the responses archiving dropped
        return HttpResponse(refused + "\n", status=409, content_type="text/plain; charset=utf-8")
    curated = curated_export_response(request, run, kind)
    if curated is not None:
        return curated
    filt = RolloutFilterForm(request.GET)
    subset = filt.filter(Rollout.objects.filter(run=run)) if filt.active else None
    if kind == "rollouts":
        lines = iter_successes(run, subset)
    elif kind == "rollouts_failures":
        lines = iter_failures(run, subset)
    else:
        lines = iter_materialized(run)
    # Named after the run and the filter, so two downloads never overwrite each other; the
    # materialised inputs are every key's, whatever the filter.
    name = export_filename(run.pk, kind, filt if kind != "rollouts_materialized_inputs" else None)
    response = jsonl_download(lines, name)
    say_plain_export(response)  # X-Gymweb-Reward-Source: original, X-Gymweb-Review: omitted
    return response
