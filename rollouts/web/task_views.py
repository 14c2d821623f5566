"""The background task page: what a long action (import, agent check, reverify, health check) is
doing, polled by HTMX while it is queued or running (the poll stops itself when it ends), with a
link to its result."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from rollouts import background
from rollouts.models import BackgroundTask
from rollouts.web.htmx import vary_on_htmx, wants_partial

# Where a task's "start again" link leads, by kind (reverify and health check: the run page).
_BACK = {
    BackgroundTask.Kind.IMPORT: "import",
    BackgroundTask.Kind.CHECK_AGENT: "check_agent",
    BackgroundTask.Kind.UPLOAD: "run_new",
}


@login_required
def task_page(request, task_id):
    """One of the user's background tasks (404 for anyone else's): status, progress, message and,
    once done, its result's link; an HTMX request gets the status part only."""
    task = background.current(get_object_or_404(BackgroundTask, pk=task_id, user=request.user))
    context = {"task": task, "back": _BACK.get(task.kind), "run_id": task.params.get("run_id")}
    template = "rollouts/partials/task_status.html" if wants_partial(request) else "rollouts/task.html"
    response = render(request, template, context)
    response["Cache-Control"] = "no-store"
    return vary_on_htmx(response)
