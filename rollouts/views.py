"""Run pages: list, new-run form, detail (live), cancel, retry, export. (Being built.)"""
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse


@login_required
def runs_list(request):
    return HttpResponse("runs")


@login_required
def run_new(request):
    return HttpResponse("new")


@login_required
def run_detail(request, run_id):
    return HttpResponse("run")


@login_required
def run_cancel(request, run_id):
    return HttpResponse("cancel")


@login_required
def run_retry(request, run_id):
    return HttpResponse("retry")


@login_required
def run_export(request, run_id, kind):
    return HttpResponse("export")
