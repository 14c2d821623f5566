"""Review queue pages: the queues list (and a new queue), a queue's page (progress, entries,
assignment), "next unreviewed", and "add to queue" from a run's filtered rollout list.

Plain function views, thin: the rules live in ``rollouts.review.queues``. A queue is looked up
through ``rollouts.web.access.queue_for`` (another team's queue: 404), a run through ``run_for``.
Every write is a POST with Django's CSRF check; HTMX requests get the changed part back, plain
form posts a redirect.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import transaction
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from rollouts import teams
from rollouts.review import queues
from rollouts.review.actions import ReviewError
from rollouts.review.query import filter_problem, filtered_rollouts
from rollouts.web.access import queue_for, queues_for, run_for
from rollouts.web.htmx import vary_on_htmx, wants_partial

PAGE_SIZE = 100
STATES = (("", "all"), ("todo", "not reviewed"), ("reviewed", "reviewed"), (queues.UNASSIGNED, "unassigned"))


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


@login_required
def queues_list(request):
    """The user's teams' review queues with their progress; POST makes one (``name``, ``team``)."""
    error = ""
    if request.method == "POST":
        try:
            queue = queues.create_queue(request.POST.get("name"), request.user, request.POST.get("team"))
        except ReviewError as exc:
            error = str(exc)
        else:
            messages.success(request, f"Queue “{queue.name}” made: add rollouts from any run's filtered list.")
            return redirect(queue.get_absolute_url())
    context = {
        "queues": queues.with_counts(queues_for(request.user).select_related("team", "created_by")),
        "teams": list(teams.choosable_teams(request.user)),
        "error": error,
        "name": request.POST.get("name", "") if error else "",
    }
    return render(request, "rollouts/review/queues.html", context, status=400 if error else 200)


def _queue_body_context(request, queue) -> dict:
    state = request.GET.get("state", "")
    if state not in dict(STATES):
        state = ""
    page = Paginator(queues.entries(queue, state), PAGE_SIZE).get_page(request.GET.get("page"))
    return {
        "queue": queue,
        "progress": queues.progress(queue),
        "page": page,
        "entries": [{"entry": e, "url": queues.rollout_url(queue.pk, e.rollout)} for e in page.object_list],
        "state": state,
        "states": STATES,
        "page_qs": f"state={state}" if state else "",
        "members": list(queues.members(queue)),
    }


@login_required
@require_safe
def queue_page(request, queue_id):
    """A queue: progress (reviewed/total, per assignee), its entries (``state``: todo, reviewed,
    unassigned), assignment and "next unreviewed". HTMX: the progress and entries alone."""
    queue = queue_for(request, queue_id)
    context = _queue_body_context(request, queue)
    if wants_partial(request):
        return vary_on_htmx(render(request, "rollouts/review/queue_body.html", context))
    return vary_on_htmx(render(request, "rollouts/review/queue.html", context))


@login_required
@require_POST
def queue_assign(request, queue_id):
    """Assign entries to a team member (``assignee``: a user name; empty: to nobody): the chosen
    ones (``entry``, repeated) or, with ``scope=unassigned``, every unreviewed unassigned one."""
    queue = queue_for(request, queue_id)
    error = ""
    try:
        username = request.POST.get("assignee") or ""
        assignee = queues.find_member(queue, username) if username else None
        scope = queues.UNASSIGNED if request.POST.get("scope") == queues.UNASSIGNED else request.POST.getlist("entry")
        n = queues.assign(queue, assignee, scope)
    except ReviewError as exc:
        error = str(exc)
    else:
        messages.success(request, f"{n:,} {'entry' if n == 1 else 'entries'} assigned to {username or 'nobody'}.")
    if wants_partial(request):
        context = _queue_body_context(request, queue)
        context["assign_error"] = error
        return vary_on_htmx(render(request, "rollouts/review/queue_body.html", context, status=400 if error else 200))
    if error:
        messages.error(request, error)
    return redirect(queue.get_absolute_url())


@login_required
@require_POST
def queue_next(request, queue_id):
    """ "Next unreviewed": count ``rollout`` (if posted: the one just reviewed) as reviewed, then
    open the user's next entry (theirs first, then an unassigned one, now theirs) in the review
    panel's queue mode; none left: back to the queue's page, saying so."""
    queue = queue_for(request, queue_id)
    done = request.POST.get("rollout") or ""
    if done.isdigit() and int(done) <= queues.ID_MAX:
        entry = queues.entry_for(queue, int(done))
        if entry is not None:
            queues.mark_reviewed(queue, entry.rollout, request.user)
    entry = queues.next_entry(queue, request.user)
    if entry is None:
        if queues.progress(queue).left:
            messages.info(request, "Nothing left to review for you in this queue: the rest is assigned to others.")
        else:
            messages.info(request, "Every entry of this queue is reviewed.")
        return redirect(queue.get_absolute_url())
    return redirect(queues.rollout_url(queue.pk, entry.rollout))


@login_required
def queue_add(request, run_id):
    """ "Add to queue" for a run's filtered rollout list (the querystring's filter, as on the run
    table): GET shows the form, POST adds the list to a queue of the run's team (``queue``) or to
    a new one (``new_queue``: its name)."""
    run = run_for(request, run_id)
    params = request.POST if request.method == "POST" else request.GET
    qs, form = filtered_rollouts(run, params)
    error = filter_problem(form)
    if request.method == "POST" and not error:
        try:
            with transaction.atomic():  # a refused add leaves no new, empty queue behind
                if (request.POST.get("new_queue") or "").strip():
                    queue = queues.create_queue(request.POST["new_queue"], request.user, run.team_id)
                else:
                    chosen = request.POST.get("queue") or ""
                    if not chosen.isdigit() or int(chosen) > queues.ID_MAX:
                        raise ReviewError("choose a queue, or name a new one", "queue")
                    queue = queue_for(request, int(chosen))
                added = queues.add_rollouts(queue, qs, request.user)
        except ReviewError as exc:
            error = str(exc)
        else:
            was = "was" if added.already == 1 else "were"
            already = f" ({added.already:,} {was} in it already)" if added.already else ""
            messages.success(request, f"{_plural(added.added, 'rollout')} added to “{queue.name}”{already}.")
            return redirect(queue.get_absolute_url())
    context = {
        "run": run,
        "filter": form,
        "count": qs.order_by().count(),
        "queues": queues.with_counts(queues_for(request.user).filter(team_id=run.team_id)),
        "error": error,
        "run_url": reverse("run", args=[run.pk]) + (f"?{form.querystring()}" if form.querystring() else ""),
        "max_add": queues.MAX_ADD,
    }
    return render(request, "rollouts/review/queue_add.html", context, status=400 if error else 200)
