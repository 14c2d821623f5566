"""Trajectory pages and import. (Being built.)"""
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse


@login_required
def rollout_detail(request, run_id, rollout_id):
    return HttpResponse("rollout")


@login_required
def rollout_raw(request, run_id, rollout_id):
    return HttpResponse("{}")


@login_required
def import_rollouts(request):
    return HttpResponse("import")
