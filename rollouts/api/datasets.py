"""The API's dataset routes (registered on ``rollouts.api.router.api``): list, upload, one dataset."""

from __future__ import annotations

from typing import Annotated

from django.conf import settings
from ninja import File, Form
from ninja.errors import HttpError
from ninja.files import UploadedFile
from ninja.responses import Status
from pydantic import BeforeValidator

from rollouts.api.errors import FieldsError
from rollouts.api.lookups import OFFSET, dataset_for, datasets_for, limit_query, page_limit
from rollouts.api.payloads import dataset_out
from rollouts.api.router import api
from rollouts.api.schemas import DatasetOut, Error
from rollouts.collection import streamed_upload
from rollouts.collection.datasets import DatasetError
from rollouts.teams import choosable_teams, not_yours
from rollouts.web.uploads import too_large_uploads, upload_limit_message


def _blank_is_none(value: object) -> object:
    """An empty form field (``team=``, what Swagger UI sends for a cleared box) means "not given"."""
    return None if isinstance(value, str) and not value.strip() else value


OptionalFormInt = Annotated[int | None, BeforeValidator(_blank_is_none)]


@api.get("/datasets", response=list[DatasetOut], summary="List datasets (newest first)")
def list_datasets(request, limit: int = limit_query(100), offset: int = OFFSET):
    limit = page_limit(limit)
    return [dataset_out(d) for d in datasets_for(request).order_by("-created", "-id")[offset : offset + limit]]


@api.post("/datasets", response={201: DatasetOut, 400: Error, 413: Error}, summary="Upload a JSONL dataset")
def create_dataset(
    request,
    file: UploadedFile | None = File(None, description="NeMo Gym JSONL: one task per line"),
    name: str = Form("", description="defaults to the file name"),
    team: OptionalFormInt = Form(
        None,
        description="the team the dataset goes to (its id), one of yours; empty or left out: your first",
        examples=[""],  # Swagger UI's box starts empty, not at team 0
    ),
):
    """Validated and stored like the new-run form's upload (``collection.streamed_upload``: bounded
    memory, short transactions): a bad line is reported with its file and line, and a file over
    ``GYMWEB_MAX_KEYS_PER_RUN`` rows is refused while read; nothing is stored then. Up to
    ``GYMWEB_MAX_UPLOAD_BYTES`` (the upload handler stops a larger file before it is stored: 413)."""
    limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
    if "file" in too_large_uploads(request) or (file is not None and file.size > limit):
        raise HttpError(413, upload_limit_message(limit))
    if file is None:
        raise FieldsError(
            "no file: send the dataset as the multipart field 'file'", {"file": ["this field is required"]}
        )
    source = (file.name or "dataset.jsonl").rsplit("/", 1)[-1]
    if len(name) > 200:  # the column's size: a cut name would be stored otherwise than sent
        message = f"the name has {len(name):,} characters; at most 200"
        raise FieldsError(message, {"name": [message]})
    chosen = None
    if team is not None:
        chosen = choosable_teams(request.user).filter(pk=team).first()
        if chosen is None:
            message = not_yours(request.user, team)
            raise FieldsError(message, {"team": [message]})
    line_limit = int(settings.GYMWEB_MAX_LINE_BYTES)
    try:
        found = streamed_upload.scan(file, source, int(settings.GYMWEB_MAX_KEYS_PER_RUN), line_limit)
        dataset, _ = streamed_upload.store_dataset(
            file,
            source,
            found,
            name=name or source,
            user=request.user,
            team=chosen,
            reuse=False,
            max_line_bytes=line_limit,
        )
    except DatasetError as exc:
        raise FieldsError(str(exc), {"file": [str(exc)]}) from None
    return Status(201, dataset_out(dataset))


@api.get("/datasets/{dataset_id}", response=DatasetOut, summary="One dataset")
def get_dataset(request, dataset_id: int):
    return dataset_out(dataset_for(request, dataset_id))
