"""Review pages and actions: labels, notes, corrected rewards and rubric answers on a rollout,
review mode (and the panel's queue mode, for a rollout opened from a review queue), the Labels page
and its rubric, datasets from a selection, the SFT export and the account page (API tokens).

Plain function views, thin: the rules live in ``rollouts.review`` (``actions``, ``progress``,
``selection``, ``curated``) and ``rollouts.tokens``. Every write is a POST with Django's CSRF
check. The rollout actions answer an HTMX request with the review panel alone
(``rollouts/review/panel.html``) and a plain form post with a redirect back to the page it came
from. Access goes through the run pages' own rule (``rollouts.web.access.run_for``): a user sees
their teams' runs only.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from rollouts import teams, tokens
from rollouts.collection import archive
from rollouts.durations import parse_duration
from rollouts.models import ApiToken, Note, Rollout, Run, Team
from rollouts.review import actions, curated, progress, queues, rubric, selection, sft
from rollouts.review.actions import ReviewError
from rollouts.review.corrected_summary import review_counts, reward_aggregates
from rollouts.review.query import export_filename, filter_problem, filtered_rollouts
from rollouts.web.access import datasets_for, label_for, labels_for, queues_for, run_for
from rollouts.web.forms import RunForm
from rollouts.web.htmx import vary_on_htmx, wants_partial
from rollouts.web.navigation import neighbours

REVIEW_PARAM = "review"


# -- helpers ---------------------------------------------------------------------------------------
def _rollout_for(request, run_id: int, rollout_id: int) -> Rollout:
    run = run_for(request, run_id)
    return get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run=run)


def _back(request, fallback: str) -> HttpResponseRedirect:
    """Back to the page the form was on (``next``, same site only), else ``fallback``."""
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = fallback
    return HttpResponseRedirect(target)


def _list_form(run: Run, params):
    """The filtered, sorted list of review mode and its filter form, read from ``params``."""
    return filtered_rollouts(run, params)


def _review_list_for(request, run: Run, form, create: bool = True):
    return progress.get_list(request.user, run, form, create=create)


def queue_of(request, params):
    """The review queue the page is reviewing (``queue=ID`` in ``params``), if the user may see
    it; None otherwise (a page opened from elsewhere)."""
    raw = str(params.get(queues.QUEUE_PARAM) or "")
    return queues_for(request.user).select_related("team").filter(pk=int(raw)).first() if raw.isdigit() else None


def _mark_if_reviewing(request, rollout: Rollout) -> None:
    """A label, note, correction or rubric answer made in review mode counts the rollout as
    reviewed there (in the list, or in the queue it was opened from)."""
    queue = queue_of(request, request.POST)
    if queue is not None:
        queues.mark_reviewed(queue, rollout, request.user)
    if request.POST.get(REVIEW_PARAM):
        _qs, form = _list_form(rollout.run, request.POST)
        progress.mark(_review_list_for(request, rollout.run, form), rollout)


def review_context(
    request, rollout: Rollout, nav: dict | None = None, params=None, back: str | None = None
) -> dict[str, Any]:
    """What the trajectory page needs for its review panel (``rollouts/review/panel.html``): the
    rollout's labels, notes and correction, and in review mode (``review=1`` in ``params``, default
    the querystring) the list's progress and the previous/next targets. ``nav`` is the page's own
    neighbours in the list (``navigation.neighbours``), if it has them. ``back``: the page the
    panel's forms return to (default: this request's page, or ``next`` of a POST)."""
    params = request.GET if params is None else params
    state = actions.review_state(rollout)
    if back is None:
        back = params.get("next") if request.method == "POST" else request.get_full_path()
    item_notes: dict[int, list] = {}  # the notes on items, shown on each item (no further query)
    for note in state.notes:
        if note.item_seq is not None:
            item_notes.setdefault(note.item_seq, []).append(note)
    context: dict[str, Any] = {
        "review": state,
        "item_notes": item_notes,
        "review_mode": False,
        "review_rollout": rollout,
        "review_back": back or "",
        "queue_mode": False,
    }
    context.update(rubric_context(request, rollout))
    queue = queue_of(request, params)
    if queue is not None:
        context.update(queue_context(queue, rollout))
        return context
    if params.get(REVIEW_PARAM):
        qs, form = _list_form(rollout.run, params)
        review_list = _review_list_for(request, rollout.run, form, create=False)
        reviewed, total = progress.progress(review_list, qs)
        if nav is None:
            nav = neighbours(rollout, params)
        list_qs = form.querystring()
        prev_url = ""
        if nav.get("prev_id"):
            prev_url = (
                reverse("rollout", args=[rollout.run_id, nav["prev_id"]])
                + "?"
                + "&".join(p for p in (list_qs, "review=1") if p)
            )
        context.update(
            review_mode=True,
            review_reviewed=reviewed,
            review_total=total,
            review_percent=100.0 * reviewed / total if total else 0.0,
            review_filter_params=list(form.params().items()),
            review_list_qs=list_qs,
            review_prev_url=prev_url,
            review_has_next=bool(nav.get("next_id")),
            review_run_url=reverse("run", args=[rollout.run_id]) + (f"?{list_qs}" if list_qs else ""),
        )
    return context


def rubric_context(request, rollout: Rollout) -> dict[str, Any]:
    """The review panel's rubric form (``rollouts/review/rubric_form.html``): the rubric in force
    with this user's answers filled in (``review_rubric``: fields with ``value``; None when the
    label set has no rubric) and every reviewer's answers (``review_rubric_answers``)."""
    definition = rubric.definition_of(rubric.current())
    if definition is None:
        return {"review_rubric": None, "review_rubric_answers": []}
    answers = rubric.answers_of([rollout.pk]).get(rollout.pk, [])
    mine: dict[str, Any] = next((a["values"] for a in answers if a["by"] == request.user.get_username()), {})
    fields = [
        {"field": f, "value": mine.get(f.name, ""), "input": rubric.FORM_PREFIX + f.name} for f in definition.fields
    ]
    return {"review_rubric": fields, "review_rubric_answers": answers}


def queue_context(queue, rollout: Rollout) -> dict[str, Any]:
    """The review panel in a queue (``rollouts/review/queue_bar.html``): the queue's progress,
    this rollout's entry, the previous entry's page and the "reviewed · next" form."""
    entry = queues.entry_for(queue, rollout.pk)
    done = queues.progress(queue)
    before = queues.previous_entry(queue, entry)
    return {
        "queue_mode": True,
        "review_queue": queue,
        "queue_entry": entry,
        "queue_progress": done,
        "queue_prev_url": queues.rollout_url(queue.pk, before.rollout) if before else "",
    }


def _panel_response(request, rollout: Rollout, status: int = 200, error: str = ""):
    """The review panel alone (HTMX), rendered as the page would, in or out of review mode."""
    params = request.POST if request.method == "POST" else request.GET  # review mode follows the form
    context = review_context(request, rollout, params=params)
    context.update(run=rollout.run, rollout=rollout, review_error=error)
    return vary_on_htmx(render(request, "rollouts/review/panel.html", context, status=status))


def _after_action(request, rollout: Rollout, error: str = ""):
    if wants_partial(request):
        return _panel_response(request, rollout, status=400 if error else 200, error=error)
    if error:
        messages.error(request, error)
    return _back(request, rollout.get_absolute_url())


# -- rollout actions -------------------------------------------------------------------------------
@login_required
@require_POST
def rollout_label(request, run_id, rollout_id):
    """Toggle a label (``label_name``) on a rollout; ``on=1``/``on=0`` sets it instead. (Not
    ``label``: in review mode the form also carries the list's filter, which may have a ``label``.)"""
    rollout = _rollout_for(request, run_id, rollout_id)
    try:
        label = actions.find_label(request.POST.get("label_name"), team_id=rollout.run.team_id)
        on = request.POST.get("on")
        if on in ("0", "1"):
            actions.set_label(rollout, label, on == "1", request.user)
        else:
            actions.toggle_label(rollout, label, request.user)
    except ReviewError as exc:
        return _after_action(request, rollout, str(exc))
    _mark_if_reviewing(request, rollout)
    return _after_action(request, rollout)


@login_required
@require_POST
def rollout_note(request, run_id, rollout_id):
    """Add a note (``note``; ``item``: an item number, optional) to a rollout. The form's field is
    ``note``, not ``text``: the panel's forms carry the list's filters, and ``text`` is the run
    table's content-search filter. A post without ``note`` (older scripts) may still give ``text``."""
    rollout = _rollout_for(request, run_id, rollout_id)
    text = request.POST["note"] if "note" in request.POST else request.POST.get("text")
    try:
        actions.add_note(rollout, text, request.user, item=request.POST.get("item"))
    except ReviewError as exc:
        return _after_action(request, rollout, str(exc))
    _mark_if_reviewing(request, rollout)
    return _after_action(request, rollout)


@login_required
@require_POST
def rollout_rubric(request, run_id, rollout_id):
    """Save this user's rubric answers for a rollout (``rubric_<field>`` inputs), checked against
    the label set's rubric; a bad one is named and nothing is stored."""
    rollout = _rollout_for(request, run_id, rollout_id)
    try:
        rubric.save_answer(rollout, request.user, rubric.form_values(request.POST))
    except ReviewError as exc:
        return _after_action(request, rollout, str(exc))
    _mark_if_reviewing(request, rollout)
    return _after_action(request, rollout)


@login_required
@require_POST
def note_delete(request, run_id, rollout_id, note_id):
    rollout = _rollout_for(request, run_id, rollout_id)
    note = get_object_or_404(Note, pk=note_id, rollout=rollout)
    try:
        actions.delete_note(note, request.user)
    except ReviewError as exc:
        if not wants_partial(request):
            return _after_action(request, rollout, str(exc))
        return _panel_response(request, rollout, status=403, error=str(exc))
    return _after_action(request, rollout)


@login_required
@require_POST
def rollout_correction(request, run_id, rollout_id):
    """Record a corrected reward (``reward``, ``reason``), or withdraw it (``withdraw=1``)."""
    rollout = _rollout_for(request, run_id, rollout_id)
    try:
        if request.POST.get("withdraw"):
            actions.withdraw_correction(rollout, request.user, request.POST.get("reason"))
        else:
            actions.correct_reward(rollout, request.POST.get("reward"), request.POST.get("reason"), request.user)
    except ReviewError as exc:
        return _after_action(request, rollout, str(exc))
    _mark_if_reviewing(request, rollout)
    return _after_action(request, rollout)


# -- review mode -----------------------------------------------------------------------------------
def _review_url(run_id: int, rollout_id: int, list_qs: str) -> str:
    return reverse("rollout", args=[run_id, rollout_id]) + "?" + "&".join(p for p in (list_qs, "review=1") if p)


@login_required
@require_safe
def review_start(request, run_id):
    """Review mode for the list this querystring filters: the first rollout not reviewed yet, or,
    when every one is, the list's summary."""
    run = run_for(request, run_id)
    qs, form = _list_form(run, request.GET)
    review_list = _review_list_for(request, run, form, create=False)
    target = progress.first_unreviewed(review_list, qs)
    list_qs = form.querystring()
    if target is not None and not request.GET.get("summary"):
        return redirect(_review_url(run.pk, target, list_qs))
    reviewed, total = progress.progress(review_list, qs)
    first = qs.values_list("id", flat=True).first()
    context = {
        "run": run,
        "filter": form,
        "list_qs": list_qs,
        "reviewed": reviewed,
        "total": total,
        "first_url": _review_url(run.pk, first, list_qs) if first else "",
        "next_url": _review_url(run.pk, target, list_qs) if target else "",
        "run_url": reverse("run", args=[run.pk]) + (f"?{list_qs}" if list_qs else ""),
        "filter_params": list(form.params().items()),
    }
    return render(request, "rollouts/review/review_done.html", context)


@login_required
@require_POST
def review_next(request, run_id):
    """``j`` in review mode: count ``rollout`` (POST) as reviewed in the list (the POSTed filter)
    and go to the next rollout of the list; past the last one, to the list's summary."""
    run = run_for(request, run_id)
    qs, form = _list_form(run, request.POST)
    rollout = get_object_or_404(Rollout, pk=request.POST.get("rollout") or 0, run=run)
    review_list = _review_list_for(request, run, form)
    progress.mark(review_list, rollout)
    nav = neighbours(rollout, request.POST)
    list_qs = form.querystring()
    if nav.get("next_id"):
        return redirect(_review_url(run.pk, nav["next_id"], list_qs))
    if nav.get("position") is None:
        # It left the list while being reviewed (say a label on a list of unlabelled ones): go on
        # with the first rollout of the list not reviewed yet.
        return redirect(reverse("review_start", args=[run.pk]) + (f"?{list_qs}" if list_qs else ""))
    # The end of the list: anything skipped is still to do.
    return redirect(reverse("review_start", args=[run.pk]) + "?" + "&".join(p for p in (list_qs, "summary=1") if p))


@login_required
@require_POST
def review_reset(request, run_id):
    """Start the list's review over (forget which rollouts were reviewed in it)."""
    run = run_for(request, run_id)
    _qs, form = _list_form(run, request.POST)
    review_list = _review_list_for(request, run, form, create=False)
    n = progress.reset(review_list) if review_list else 0
    messages.info(request, f"Review progress reset ({n} rollout{'' if n == 1 else 's'} unmarked).")
    list_qs = form.querystring()
    return redirect(reverse("review_start", args=[run.pk]) + (f"?{list_qs}" if list_qs else ""))


# -- labels page -----------------------------------------------------------------------------------
@login_required
def labels_page(request):
    """The label set of each of the user's teams, with how many rollouts carry each label; add one
    (to the chosen team's set, the ``team`` field, when the user has several); move one up (keys
    1–9 go to the first nine)."""
    error = ""
    my_teams = list(teams.choosable_teams(request.user))
    if request.method == "POST":
        try:
            team_id = _label_team(request.POST.get("team"), my_teams, request.user)
            label = actions.create_label(
                request.POST.get("name"), request.POST.get("description", ""), request.user, team_id=team_id
            )
        except ReviewError as exc:
            error = str(exc)
        else:
            messages.success(request, f"Label “{label.name}” added.")
            return redirect("labels")
    return _labels_response(request, error=error, name=request.POST.get("name", "") if error else "")


def _labels_response(request, **extra):
    my_teams = list(teams.choosable_teams(request.user))
    labels = list(labels_for(request.user).annotate(n=Count("uses")).order_by("team_id", "position", "id"))
    sets = [{"team": t, "labels": [lab for lab in labels if lab.team_id == t.pk]} for t in my_teams]
    in_force = rubric.current()
    definition = rubric.definition_of(in_force)
    context = {
        "sets": sets,
        "teams": my_teams,
        "error": "",
        "name": "",
        "keyed": actions.KEYED_LABELS,
        "rubric": in_force,
        "rubric_fields": definition.fields if definition else [],
        "rubric_text": rubric.as_lines(definition) if definition else "",
        "rubric_error": "",
        "rubric_editable": rubric.may_edit(request.user),
        **extra,
    }
    bad = context["error"] or context["rubric_error"]
    return render(request, "rollouts/review/labels.html", context, status=400 if bad else 200)


@login_required
@require_POST
def label_rubric(request):
    """Put the label set's rubric in force from the Labels page's lines (``rubric``; empty with
    ``clear=1`` removes it). A bad line or field is named and the rubric in force stays; staff only
    (403 otherwise: the rubric is every team's)."""
    text = request.POST.get("rubric", "")
    if not rubric.may_edit(request.user):
        response = _labels_response(request, rubric_error=rubric.STAFF_ONLY, rubric_text=text)
        response.status_code = 403
        return response
    try:
        if request.POST.get("clear"):
            rubric.set_rubric(None, request.user)
            messages.success(request, "Rubric removed: the review panel shows none (earlier answers are kept).")
        else:
            rubric.set_rubric(rubric.parse_lines(text), request.user)
            messages.success(request, "Rubric saved: the review panel asks for it on every rollout.")
    except ReviewError as exc:
        return _labels_response(request, rubric_error=str(exc), rubric_text=text)
    return redirect("labels")


def _label_team(value, my_teams: list[Team], user) -> int:
    """The team a new label goes to: the ``team`` field (one of ``my_teams``), or the only (first)
    of ``my_teams``. ``ReviewError`` for a team the user is not in, or none."""
    if value:
        for t in my_teams:
            if str(t.pk) == str(value).strip():
                return t.pk
        raise ReviewError(teams.not_yours(user, value), "team")
    if not my_teams:
        raise ReviewError(teams.NO_TEAM, "team")
    return my_teams[0].pk


@login_required
@require_POST
def label_up(request, label_id):
    actions.move_label_up(label_for(request, label_id))
    return redirect("labels")


# -- dataset from a selection ----------------------------------------------------------------------
@login_required
@require_POST
def selection_dataset(request, run_id):
    """The tasks of the POSTed filter's list become a new dataset; then the new-run form for it."""
    run = run_for(request, run_id)
    qs, form = _list_form(run, request.POST)
    if filter_problem(form):  # the list would be bigger than the one asked for
        messages.error(request, f"No dataset made: bad filter {filter_problem(form)}")
        return _back(request, run.get_absolute_url())
    try:
        dataset = selection.dataset_from_selection(run, qs, filters=form.querystring(sort=""), user=request.user)
    except ReviewError as exc:
        messages.error(request, str(exc))
        return _back(request, run.get_absolute_url())
    messages.success(
        request,
        f"Dataset #{dataset.pk} made from {dataset.num_rows} task{'' if dataset.num_rows == 1 else 's'} of this list: "
        "set the agent URL and start the run.",
    )
    return redirect("dataset_new_run", dataset.pk)


@login_required
@require_safe
def dataset_new_run(request, dataset_id):
    """The new-run form, filled in for a dataset (for one made from a selection: with its source
    run's env and knobs). It posts to the ordinary new-run view, which validates it."""
    dataset = get_object_or_404(datasets_for(request.user).select_related("source_run"), pk=dataset_id)
    form = RunForm(initial=selection.new_run_initial(dataset), user=request.user)
    return render(request, "rollouts/run_new.html", {"form": form, "file_dropped": False, "from_dataset": dataset})


# -- SFT export ------------------------------------------------------------------------------------
@login_required
@require_safe
def run_export_sft(request, run_id):
    """The selection's succeeded trajectories in the OpenAI chat format (``rollouts.review.sft``).
    Querystring: the rollout filter, ``reasoning=keep|think|drop``, ``reward_source``, ``metadata=1``."""
    run = run_for(request, run_id)
    refused = archive.download_refusal(run, "sft", False, True)
    if refused:  # an archived run: its responses are in the archive files
        return HttpResponse(refused + "\n", status=409, content_type="text/plain; charset=utf-8")
    reasoning = request.GET.get("reasoning") or "keep"
    if reasoning not in sft.REASONING_MODES:
        return HttpResponseBadRequest(
            f"reasoning={reasoning[:60]!r}: must be one of {', '.join(sft.REASONING_MODES)}; nothing was exported\n",
            content_type="text/plain; charset=utf-8",
        )
    qs, form = filtered_rollouts(run, request.GET)
    if filter_problem(form):
        return HttpResponseBadRequest(
            f"bad filter: {filter_problem(form)}; nothing was exported\n", content_type="text/plain; charset=utf-8"
        )
    options = curated.ExportOptions.from_params(request.GET)
    response = curated.sft_response(
        run,
        qs if form.active else None,
        options,
        export_filename(run.pk, "sft", form),
        reasoning=reasoning,
        metadata=request.GET.get("metadata") in curated.TRUE,
    )
    response["X-Gymweb-Reasoning"] = reasoning
    return response


@login_required
@require_safe
def run_export_sft_check(request, run_id):
    """What the SFT download of this selection would hold (the run page's export panel loads it):
    rows written and rows left out by reason ("3 rollouts left out: no assistant turn").
    Querystring as ``run_export_sft``."""
    run = run_for(request, run_id)
    refused = archive.download_refusal(run, "sft", False, True)
    if refused:  # the run page's panel shows why instead of the count
        return HttpResponse(format_html('<p class="muted" id="sft-check">{}</p>', refused))
    reasoning = request.GET.get("reasoning") or "keep"
    if reasoning not in sft.REASONING_MODES:
        reasoning = "keep"
    qs, form = filtered_rollouts(run, request.GET)
    if filter_problem(form):
        return HttpResponseBadRequest(f"bad filter: {filter_problem(form)}", content_type="text/plain; charset=utf-8")
    rows, left_out = curated.sft_check(
        run, qs if form.active else None, curated.ExportOptions.from_params(request.GET), reasoning=reasoning
    )
    return render(
        request,
        "rollouts/review/sft_check.html",
        {"rows": rows, "left_out": sft.left_out_text(left_out), "left_out_n": sum(left_out.values())},
    )


def curated_export_response(request, run: Run, kind: str):
    """The run page's download of file ``kind`` when curated options are asked for (``review=1``,
    ``reward_source=corrected``); None for a plain download (``rollouts.web.views.run_export``
    serves that, unchanged)."""
    options = curated.ExportOptions.from_params(request.GET)
    if options.plain or kind not in ("rollouts", "rollouts_failures"):
        return None  # the materialised inputs have no reward and no review
    qs, form = filtered_rollouts(run, request.GET)
    return curated.streaming_response(
        curated.lines(run, kind, qs if form.active else None, options), export_filename(run.pk, kind, form), options
    )


def say_plain_export(response):
    """Mark a plain download as using the env's reward and carrying no review (the headers every
    curated download sets too)."""
    response["X-Gymweb-Reward-Source"] = curated.ORIGINAL
    response["X-Gymweb-Review"] = "omitted"
    return response


# -- the run page's review card --------------------------------------------------------------------
def run_review_context(request, run: Run) -> dict[str, Any]:
    """The run page's review card: labels and notes counts, rewards both ways, the review lists of
    this user, and where the run's tasks came from."""
    return {"review_counts": review_counts(run), "review_rewards": reward_aggregates(run)}


# -- account page: API tokens ----------------------------------------------------------------------
@login_required
def account(request):
    """The user's page: their API tokens (name, prefix, scope, expiry, created, last used), a form to make one
    (shown once, in the answer to the POST that made it) and revoke buttons."""
    new_token = None
    if request.method == "POST":
        scope = request.POST.get("scope") or "write"
        try:
            expires_in = request.POST.get("expires_in") or ""
            expires = timezone.now() + parse_duration(expires_in, positive=True) if expires_in else None
            if scope not in tokens.SCOPES:
                raise ValueError(f"scope {scope[:20]!r}: read or write")
            team_id = request.POST.get("team") or ""
            team = request.user.teams.filter(pk=int(team_id)).first() if team_id.isdecimal() else None
            if team_id and team is None:
                raise ValueError(teams.not_yours(request.user, team_id))
        except ValueError as exc:
            messages.error(request, f"No token made: {exc}")
        else:
            # Rendered into this answer only: the token is kept nowhere in plain text (not in the session).
            _row, new_token = tokens.create_token(request.user, request.POST.get("name", ""), scope, expires, team)
    context = {
        "tokens": ApiToken.objects.filter(user=request.user).select_related("team"),
        "new_token": new_token,
        "teams": list(request.user.teams.order_by("id")),
    }
    response = render(request, "rollouts/review/account.html", context)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_delete(request, token_id):
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)  # another user's: 404
    token.delete()
    messages.success(request, f"Token “{token.name}” revoked.")
    return redirect("account")
