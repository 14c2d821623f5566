"""The API's routes to delete, archive and restore a run (``/api/v1/``; ``rollouts.collection.archive``
does the work). Mounted on the API by ``rollouts.api.router`` (``router``, and ``delete_run``); auth
and access as for every route there. A run being collected is refused with 409 (cancel it first),
never cancelled."""

from __future__ import annotations

from datetime import datetime

from ninja import Router, Schema
from ninja.errors import HttpError
from pydantic import Field

from rollouts.collection import archive
from rollouts.web.access import run_for

router = Router()


class Error(Schema):
    detail: str


class ArchiveOut(Schema):
    run: int
    archived: datetime | None = Field(None, description="when the run was archived; null once restored")
    archive_path: str = Field(
        "",
        description="the folder of its archive files: the server's full path for staff, else the folder's name "
        "under the server's archive folder (empty once restored)",
    )
    rollouts: int = Field(..., description="rollouts whose items were dropped or brought back")
    items: int = Field(..., description="trajectory items dropped or brought back")
    seconds: float
    longest_transaction_s: float = Field(..., description="the longest single write transaction")


class DeletedOut(Schema):
    deleted: int = Field(..., description="the id of the deleted run")
    rollouts: int
    items: int
    seconds: float
    longest_transaction_s: float


def _outcome(request, run, out: archive.Outcome) -> dict:
    return {
        "run": run.pk,
        "archived": run.archived,
        "archive_path": archive.shown_folder(run, request.user),
        "rollouts": out.rollouts,
        "items": out.items,
        "seconds": out.seconds,
        "longest_transaction_s": out.longest_transaction_s,
    }


# DELETE /runs/{id} shares its path with GET /runs/{id}, so ``rollouts.api.router`` registers it on
# its own router (one path, one view): ``api.delete(DELETE_PATH, **DELETE_ROUTE)(delete_run)``.
DELETE_PATH = "/runs/{run_id}"
DELETE_ROUTE = dict(response={200: DeletedOut, 404: Error, 409: Error}, summary="Delete a run and everything under it")


def delete_run(request, run_id: int):
    """Deletes the run, its tasks, rollouts, trajectories, labels, notes, corrections and archive
    files, in bounded transactions. 409 while the run is being collected: cancel it first."""
    run = run_for(request, run_id)
    try:
        out = archive.delete_run(run)
    except archive.RunBusy as exc:
        raise HttpError(409, str(exc)) from None
    return {
        "deleted": run_id,
        "rollouts": out.rollouts,
        "items": out.items,
        "seconds": out.seconds,
        "longest_transaction_s": out.longest_transaction_s,
    }


@router.post(
    "/runs/{run_id}/archive", response={200: ArchiveOut, 404: Error, 409: Error}, summary="Archive a finished run"
)
def archive_run(request, run_id: int):
    """Writes the run's NeMo Gym files (zstd) to the archive folder and drops its items from the
    database; aggregates, labels, notes and corrections stay. 409 while the run is being collected
    or when the folder cannot be written."""
    run = run_for(request, run_id)
    try:
        out = archive.archive_run(run)
    except archive.ArchiveError as exc:
        raise HttpError(409, str(exc)) from None
    return _outcome(request, run, out)


@router.post(
    "/runs/{run_id}/restore", response={200: ArchiveOut, 404: Error, 409: Error}, summary="Restore an archived run"
)
def restore_run(request, run_id: int):
    """Brings the archived run's items back from its files (checked first), then removes the files.
    409 if the run is not archived or its files do not match their manifest."""
    run = run_for(request, run_id)
    try:
        out = archive.restore_run(run)
    except archive.ArchiveError as exc:
        raise HttpError(409, str(exc)) from None
    return _outcome(request, run, out)
