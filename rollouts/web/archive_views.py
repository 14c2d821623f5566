"""Pages to delete, archive and restore a run (``rollouts.collection.archive`` does the work), and
what the trajectory pages show for a rollout of an archived run."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from rollouts.collection import archive
from rollouts.models import Rollout
from rollouts.web.access import run_for


def archived_rollout_response(request, rollout: Rollout, page: bool = True) -> HttpResponse:
    """For a rollout of an archived run: the trajectory page's stand-in (``page``: its summary and
    a Restore button) or, for its parts (raw row, item, live tail), a 409 saying how to restore."""
    message = str(archive.RunArchived(rollout.run, "the trajectory"))
    if not page:
        return HttpResponse(message + "\n", status=409, content_type="text/plain; charset=utf-8")
    return render(
        request, "rollouts/rollout_archived.html", {"rollout": rollout, "run": rollout.run, "message": message}
    )


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def run_delete(request, run_id):
    """GET: what deleting the run removes, and a button to confirm. POST: delete it (refused, with
    the reason, while it is being collected), then go to the runs list."""
    run = run_for(request, run_id)
    if request.method == "POST":
        try:
            out = archive.delete_run(run)
        except archive.RunBusy as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(reverse("run", args=[run.pk]))
        messages.success(
            request, f"Deleted run #{run.pk} ({run.name}): {out.rollouts:,} rollouts, {out.items:,} trajectory items."
        )
        return HttpResponseRedirect(reverse("runs"))
    counts = {
        row["status"]: row["n"] for row in Rollout.objects.filter(run=run).values("status").annotate(n=Count("id"))
    }
    context = {
        "run": run,
        "rollouts": sum(counts.values()),
        "labelled": Rollout.objects.filter(run=run, review_labels__isnull=False).distinct().count(),
        "noted": Rollout.objects.filter(run=run, notes__isnull=False).distinct().count(),
        "busy": not run.is_final,
    }
    return render(request, "rollouts/run_delete.html", context)


@login_required
@require_POST
def run_archive(request, run_id):
    run = run_for(request, run_id)
    try:
        out = archive.archive_run(run)
    except archive.ArchiveError as exc:
        messages.error(request, str(exc))
    else:
        size = sum(f["bytes"] for f in out.files.values())
        messages.success(
            request,
            f"Archived: {out.items:,} trajectory items left the database; {size:,} bytes of files in "
            f"{archive.shown_folder(run, request.user)}.",
        )
    return HttpResponseRedirect(reverse("run", args=[run.pk]))


@login_required
@require_POST
def run_restore(request, run_id):
    run = run_for(request, run_id)
    try:
        out = archive.restore_run(run)
    except archive.ArchiveError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Restored: {out.rollouts:,} rollouts, {out.items:,} trajectory items are back.")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = reverse("run", args=[run.pk])
    return HttpResponseRedirect(back)
