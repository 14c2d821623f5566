"""A dataset file stored (and materialised into a run) in bounded memory, in short transactions.

Every dataset upload goes through here: the new-run page's (``rollouts.web.views.upload_job``),
``POST /api/v1/datasets`` and the import page's dataset offer. The file (a path, or a seekable
binary file such as a Django upload) is read twice: ``scan`` validates every row and counts them,
refusing a file over the key limit at the first row past it, before anything is stored;
``store_dataset`` or ``store_and_create_run`` then reads it again and writes the dataset rows (and
the run's tasks and pending rollouts) ``BULK`` rows per transaction, so SQLite's write lock is never
held for long and no list of every row is ever held. Until its last batch is in, the new dataset
and run are being written (``rollouts.collection.writing``: shown nowhere, no worker takes the run,
each batch renews their lease); if anything fails, what was stored is deleted, and if the process
dies, the supervisor's sweep deletes it once the lease lapses.

A run over a dataset already stored (``create_run_from_dataset``: the new-run form's dataset choice,
``POST /api/v1/runs`` with a dataset id) is written the same way, its rows read ``BULK`` at a time.

The run's keys are NeMo Gym's (``rollouts.collection.datasets.materialize``): identical lines share
a task, rows carrying ``_ng_task_index`` keep it, each row adds ``num_repeats`` rollouts to its task.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Union

from django.db import transaction

from rollouts.collection import writing
from rollouts.collection.datasets import (
    DatasetError,
    iter_rows,
    strip_result_fields,
    too_many_rows,
)
from rollouts.collection.run_rows import BULK, RunRows, check_size, fill_run, new_run
from rollouts.collection.runs import _dumps, earlier_upload
from rollouts.models import Dataset, DatasetRow, Run
from rollouts.nemo.keys import TASK_INDEX_KEY_NAME
from rollouts.teams import team_for_new

Source = Union[Path, IO[bytes]]  # a file's path, or a seekable binary file (read from its start)


@contextmanager
def _reading(file: Source) -> Iterator[tuple[IO[bytes], int]]:
    """``(binary file at its start, its size in bytes, at least 1)``; a path is opened and closed,
    a file object is rewound and left open."""
    if isinstance(file, (str, Path)):
        with open(file, "rb") as fh:
            yield fh, max(os.fstat(fh.fileno()).st_size, 1)
        return
    file.seek(0, os.SEEK_END)
    size = max(file.tell(), 1)
    file.seek(0)
    yield file, size


@dataclass
class Scan:
    """What the first reading of a file found: its row count, SHA-256 (of the lines as read, as
    ``read_jsonl``'s), the result fields it strips and the task indices rows carry themselves."""

    num_rows: int = 0
    sha256: str = ""
    stripped_fields: set[str] = field(default_factory=set)
    explicit: dict[int, int] = field(default_factory=dict)  # a task index rows carry → its first row (1-based)


def scan(file: Source, source: str, max_rows: int, max_line_bytes: int, progress=None) -> Scan:
    """Read and validate every row of the JSONL ``file``, one at a time (``source`` names it in
    errors). Raises ``DatasetError`` (file and line) for the first bad line, for an empty file, or
    at row ``max_rows + 1``; nothing is stored."""
    found = Scan()
    digest = hashlib.sha256()
    with _reading(file) as (fh, size):
        for number, _text, row in iter_rows(fh, source, digest, max_line_bytes):
            found.num_rows += 1
            if found.num_rows > max_rows:
                raise too_many_rows(max_rows, number, source)
            found.stripped_fields.update(strip_result_fields(row))
            if TASK_INDEX_KEY_NAME in row:
                found.explicit.setdefault(row[TASK_INDEX_KEY_NAME], found.num_rows)
            if progress is not None and found.num_rows % BULK == 0:
                progress(0.5 * fh.tell() / size, f"Read {found.num_rows:,} rows…")
    if not found.num_rows:
        raise DatasetError("the file has no rows (it is empty or only blank lines)", None, source)
    found.sha256 = digest.hexdigest()
    return found


def _new_dataset(name: str, found: Scan, user, team_id: int) -> Dataset:
    return Dataset.objects.create(
        name=name[:200],
        source_name=name[:200],
        created_by=user,
        num_rows=found.num_rows,
        sha256=found.sha256,
        team_id=team_id,
        writing_until=writing.lease(),
    )


def store_dataset(
    file: Source,
    source: str,
    found: Scan,
    *,
    name: str,
    user=None,
    team=None,
    reuse: bool = True,
    max_line_bytes: int,
    progress=None,
) -> tuple[Dataset, bool]:
    """Store ``file`` (already ``scan``ned: ``found``) as a dataset named ``name`` in ``team``
    (default: the user's first), ``BULK`` rows per transaction. With ``reuse``, an earlier upload
    of the same file by the user (``runs.earlier_upload``) is handed back instead. Returns
    ``(dataset, reused)``. On any failure deletes what it stored and re-raises."""
    team_id = team_for_new(user, team)
    if reuse:
        same = earlier_upload(found.sha256, name, found.num_rows, user, team_id)
        if same is not None:
            return same, True
    dataset = _new_dataset(name, found, user, team_id)
    try:
        _write(file, source, found, None, dataset, found.num_rows, max_line_bytes, progress)
    except BaseException:
        Dataset.objects.filter(pk=dataset.pk).delete()
        raise
    return dataset, False


def store_and_create_run(
    file: Source,
    source: str,
    found: Scan,
    *,
    dataset_name: str,
    run_name: str,
    user=None,
    team=None,
    max_line_bytes: int,
    progress=None,
    **options: Any,
) -> tuple[Run, bool]:
    """Store ``file`` (already ``scan``ned: ``found``) as a new dataset, unless the user uploaded
    the same file before (``runs.earlier_upload``: that one is reused), and a queued run over it
    with ``options`` (``Run`` fields, as ``runs.create_run``). Returns ``(run, reused)``. Raises
    ``RunTooLarge`` before storing anything; on any other failure deletes what it stored and
    re-raises."""
    team_id = team.pk if team is not None else team_for_new(user)
    run = Run(name=run_name[:200], created_by=user, team_id=team_id, writing_until=writing.lease(), **options)
    limit = run.limit or found.num_rows
    check_size(found.num_rows, run.num_repeats, run.limit)
    reuse = earlier_upload(found.sha256, dataset_name, found.num_rows, user, team_id)
    made_dataset = reuse is None
    with transaction.atomic():
        dataset = reuse or _new_dataset(dataset_name, found, user, team_id)
        run.dataset = dataset
        run.num_keys = min(found.num_rows, limit) * run.num_repeats
        run.save()
    try:
        _write(file, source, found, run, dataset if made_dataset else None, limit, max_line_bytes, progress)
    except BaseException:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).delete()
            if made_dataset:
                Dataset.objects.filter(pk=dataset.pk).delete()
        raise
    return run, not made_dataset


def create_run_from_dataset(dataset: Dataset, *, name: str, user=None, team=None, progress=None, **options: Any) -> Run:
    """A queued run over the stored ``dataset`` with ``options`` (``Run`` fields, as
    ``runs.create_run``), written ``BULK`` dataset rows per transaction (its tasks and pending
    rollouts, numbered as ``materialize`` numbers them), the run being written (shown nowhere, not
    launchable) until its last batch is in. The dataset's rows are read in line order, ``BULK`` at a
    time, none kept. The run's team: ``team``, else the dataset's. Raises ``RunTooLarge`` (and
    ``ValueError`` for ``num_repeats`` below 1) before storing anything; ``DatasetError`` when the
    dataset's rows changed while read; on any failure deletes what it stored and re-raises."""
    team_id = team.pk if team is not None else dataset.team_id
    run, count = new_run(name, user, dataset, team_id, dataset.num_rows, options)

    def batches() -> Iterator[list[tuple[int, str, dict]]]:
        read, last = 0, 0
        while read < count:
            chunk = list(
                DatasetRow.objects.filter(dataset=dataset, line__gt=last)
                .order_by("line")
                .values_list("line", "data_json")[: min(BULK, count - read)]
            )
            if not chunk:
                break
            yield [(line, text, json.loads(text)) for line, text in chunk]
            read, last = read + len(chunk), chunk[-1][0]
        if read != count:
            raise DatasetError(
                f"dataset #{dataset.pk} has {read:,} rows, not {count:,}: it changed while the run was created",
                None,
                dataset.name,
            )

    fill_run(run, count, lambda: _carried_indices(dataset, count), batches(), progress)
    return run


def _carried_indices(dataset: Dataset, count: int) -> set[int]:
    """The task indices that the first ``count`` rows of ``dataset`` carry (``_ng_task_index``);
    only rows whose text names the key are read."""
    rows = DatasetRow.objects.filter(dataset=dataset, data_json__contains=f'"{TASK_INDEX_KEY_NAME}"')
    if count < dataset.num_rows:
        cutoff = DatasetRow.objects.filter(dataset=dataset).order_by("line").values_list("line", flat=True)[count - 1]
        rows = rows.filter(line__lte=cutoff)
    carried = set()
    for text in rows.order_by("line").values_list("data_json", flat=True).iterator(chunk_size=BULK):
        row = json.loads(text)
        if TASK_INDEX_KEY_NAME in row:
            carried.add(row[TASK_INDEX_KEY_NAME])
    return carried


def _write(
    file: Source, source, found: Scan, run: Run | None, dataset, limit: int, max_line_bytes: int, progress
) -> None:
    """The second reading: dataset rows (when ``dataset`` is given), tasks and rollouts (when
    ``run`` is), ``BULK`` rows per transaction, each renewing their writing lease; then both are
    marked ready. Raises ``writing.LeaseLost`` when the lease lapsed between two batches."""
    explicit = {index for index, first in found.explicit.items() if first <= limit}  # within the limit
    run_rows = RunRows(run, explicit) if run is not None else None
    read = 0

    def flush(batch: list[tuple[int, str, dict]], batch_all: list[tuple[int, str, dict]]) -> None:
        """``batch_all``: the rows read (stored in the dataset); ``batch``: those within the limit."""
        rows = (
            [DatasetRow(dataset=dataset, line=n, data_json=_dumps(r)) for n, _t, r in batch_all]
            if dataset is not None
            else []
        )
        prepared = run_rows.prepare(batch) if run_rows is not None else None
        with transaction.atomic():
            if rows:
                DatasetRow.objects.bulk_create(rows)
            if run_rows is not None and prepared is not None:
                run_rows.write(prepared)
            writing.renew(run, dataset)

    with _reading(file) as (fh, size):
        batch: list[tuple[int, str, dict]] = []
        batch_all: list[tuple[int, str, dict]] = []
        for number, text, row in iter_rows(fh, source, None, max_line_bytes):
            strip_result_fields(row)
            read += 1
            batch_all.append((number, text, row))
            if read <= limit:
                batch.append((number, text, row))
            if len(batch_all) >= BULK:
                flush(batch, batch_all)
                batch, batch_all = [], []
                if progress is not None:
                    progress(0.5 + 0.5 * fh.tell() / size, f"Stored {read:,} of {found.num_rows:,} rows…")
        if batch_all:
            flush(batch, batch_all)
    with transaction.atomic():
        if run is not None and run_rows is not None:
            run.num_tasks = len(run_rows.rollouts_of)
            Run.objects.filter(pk=run.pk).update(num_tasks=run.num_tasks)
        writing.done(run, dataset)  # the last batch is in: ready
