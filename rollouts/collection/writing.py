"""Runs and datasets being written in several transactions (a streamed upload, an import): not ready
until their last batch is in, and never left half-stored by a writer that died.

Such a row is created with ``writing_until`` set (``lease()``); every batch its writer stores renews
that lease inside the batch's transaction (``renew``), and the last one clears it (``done``). While it
is set the run or dataset is shown nowhere: ``rollouts.teams``' visible lists (every page, API list,
picker, export and compare) and the dataset reuse of ``runs.earlier_upload`` leave it out, and no
worker launches it. A lease not renewed for ``GYMWEB_WRITE_LEASE_S`` means its writer is gone (killed,
out of memory, the machine lost power): ``sweep`` (the supervisor's scheduled job and each worker's
start) deletes the run or dataset with what its batches stored. A writer whose lease lapsed cannot
renew it again (``renew`` raises ``LeaseLost``), so it never writes into what a sweep is deleting.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Model
from django.utils import timezone

from rollouts.models import Dataset, DatasetRow, Run

log = logging.getLogger("gymweb.runs")


class LeaseLost(Exception):
    """The writer's lease lapsed (it stalled past ``GYMWEB_WRITE_LEASE_S``): what it stored is the
    sweep's to delete; the writer stops."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} was not written within GYMWEB_WRITE_LEASE_S "
            f"({float(settings.GYMWEB_WRITE_LEASE_S):g} s) of its last batch; nothing of it is kept"
        )


def lease() -> datetime:
    """A new lease's end: now plus ``GYMWEB_WRITE_LEASE_S``."""
    return timezone.now() + timedelta(seconds=float(settings.GYMWEB_WRITE_LEASE_S))


def renew(*objs: Model | None) -> None:
    """Renew the lease of each run or dataset in ``objs`` (``None`` skipped); call inside the batch's
    transaction. Raises ``LeaseLost`` when one's lease has already lapsed (or it is gone)."""
    _hold(objs, lease())


def done(*objs: Model | None) -> None:
    """The last batch of each of ``objs`` is in: ready, shown. Raises ``LeaseLost`` as ``renew``."""
    _hold(objs, None)


def _hold(objs: tuple[Model | None, ...], until: datetime | None) -> None:
    """Set ``writing_until`` of each of ``objs`` whose lease has not lapsed to ``until``; raises
    ``LeaseLost`` for the first whose lease lapsed (or that is gone)."""
    now = timezone.now()
    for obj in objs:
        if obj is None:
            continue
        kept = type(obj).objects.filter(pk=obj.pk, writing_until__gte=now).update(writing_until=until)
        if not kept:
            raise LeaseLost(f"{type(obj).__name__.lower()} #{obj.pk}")
        obj.writing_until = until  # type: ignore[attr-defined]


def sweep() -> tuple[int, int]:
    """Delete the runs and datasets whose writer's lease lapsed, with everything they stored, in
    short transactions (runs as ``archive.delete_run``; dataset rows ``GYMWEB_DELETE_BATCH`` at a
    time). Returns ``(runs, datasets)`` deleted."""
    from rollouts.collection.archive import delete_run

    now = timezone.now()
    runs = datasets = 0
    for run in Run.objects.filter(writing_until__lt=now):
        delete_run(run, unfinished=True)
        runs += 1
    size = max(1, int(settings.GYMWEB_DELETE_BATCH))
    for dataset_id in Dataset.objects.filter(writing_until__lt=now).values_list("id", flat=True):
        while True:
            ids = list(DatasetRow.objects.filter(dataset_id=dataset_id).values_list("id", flat=True)[:size])
            if not ids:
                break
            DatasetRow.objects.filter(id__in=ids).delete()
        datasets += Dataset.objects.filter(pk=dataset_id, writing_until__lt=now).delete()[1].get(Dataset._meta.label, 0)
    if runs or datasets:
        log.warning(
            "deleted %d run(s) and %d dataset(s) whose upload or import stopped part-way (its writer is gone)",
            runs,
            datasets,
        )
    return runs, datasets
