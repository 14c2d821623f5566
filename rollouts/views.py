"""Dashboard views (placeholder until the dashboard lands)."""
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse


@login_required
def runs_list(request):
    return HttpResponse("runs")


@login_required
def run_detail(request, run_id):
    return HttpResponse("run")


@login_required
def rollout_detail(request, run_id, rollout_id):
    return HttpResponse("rollout")
