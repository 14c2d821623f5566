"""A new run's tasks and pending rollouts, written ``BULK`` rows per short transaction under the
run's writing lease (``rollouts.collection.writing``), numbered as ``materialize`` numbers them.

Every run is made here: ``runs.create_run`` (the collect command, the demo, rows held in memory)
and ``streamed_upload`` (a file read twice, a stored dataset) hand their rows over in batches, so
a big run never holds SQLite's write lock for long and is shown nowhere until its last batch is in.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.db import transaction

from rollouts.bulk import insert_from_template
from rollouts.collection import writing
from rollouts.collection.datasets import ParsedDataset, merge_overrides
from rollouts.lossless import dumps
from rollouts.models import Dataset, Rollout, Run, Task
from rollouts.nemo.keys import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from rollouts.teams import team_for_new

BULK = 2000  # rows per transaction


def _materialized(row: dict[str, Any], task_index: int, agent_name: str, overrides: dict | None) -> dict[str, Any]:
    """A task's row as ``materialize`` makes it (same keys, same order)."""
    out = {k: v for k, v in row.items() if k not in (TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME)}
    out["responses_create_params"] = merge_overrides(row["responses_create_params"], overrides)
    out["agent_ref"] = row.get("agent_ref") or {"name": agent_name}
    if "agent_ref" in row:
        out = {**{k: v for k, v in out.items() if k != "agent_ref"}, "agent_ref": out["agent_ref"]}
    out[TASK_INDEX_KEY_NAME] = task_index
    return out


class RunTooLarge(ValueError):
    """A run would have more (task, rollout) keys than ``GYMWEB_MAX_KEYS_PER_RUN`` allows."""


def check_size(num_rows: int, num_repeats: int, limit: int | None) -> int:
    """The number of keys a run would have; raises ``RunTooLarge`` over ``GYMWEB_MAX_KEYS_PER_RUN``
    (a bound on the work and memory one run takes)."""
    keys = (min(num_rows, limit) if limit else num_rows) * num_repeats
    cap = settings.GYMWEB_MAX_KEYS_PER_RUN
    if keys > cap:
        raise RunTooLarge(
            f"this run would have {keys:,} rollouts "
            f"({min(num_rows, limit or num_rows):,} rows × {num_repeats} repeats); "
            f"the limit is {cap:,} per run (GYMWEB_MAX_KEYS_PER_RUN): use --limit/num_repeats or several runs"
        )
    return keys


def new_run(name: str, user, dataset: Dataset | None, team_id: int, num_rows: int, options: dict) -> tuple[Run, int]:
    """A new run being written over ``num_rows`` rows (saved, leased) and how many rows it takes.
    Raises ``RunTooLarge`` and ``ValueError`` (``num_repeats`` below 1) before saving it."""
    run = Run(
        name=name[:200], created_by=user, dataset=dataset, team_id=team_id, writing_until=writing.lease(), **options
    )
    if run.num_repeats < 1:
        raise ValueError("num_repeats must be at least 1")
    check_size(num_rows, run.num_repeats, run.limit)
    count = min(num_rows, run.limit) if run.limit else num_rows
    run.num_keys = count * run.num_repeats
    run.save()
    return run, count


def fill_run(run: Run, count: int, explicit, batches, progress) -> None:
    """Write ``batches`` (lists of ``(line, text, row)``, ``count`` rows in all) into ``run``'s
    tasks and pending rollouts, one transaction each renewing its lease, then mark it ready.
    ``explicit``: a callable giving the task indices its rows carry (called once the run is
    saved). On any failure deletes the run and re-raises."""
    try:
        run_rows = RunRows(run, explicit())
        read = 0
        for batch in batches:
            prepared = run_rows.prepare(batch)
            with transaction.atomic():
                run_rows.write(prepared)
                writing.renew(run)
            read += len(batch)
            if progress is not None:
                progress(read / count, f"Stored {read:,} of {count:,} rows…")
        with transaction.atomic():
            run.num_tasks = len(run_rows.rollouts_of)
            Run.objects.filter(pk=run.pk).update(num_tasks=run.num_tasks)
            writing.done(run)  # the last batch is in: ready
    except BaseException:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).delete()
        raise


class RunRows:
    """The tasks and pending rollouts of ``run``, batch by batch, as ``materialize`` numbers them;
    ``explicit``: the task indices rows within the run's limit carry themselves."""

    def __init__(self, run: Run, explicit: set[int]):
        self.run = run
        self.explicit = explicit
        self.by_text: dict[bytes, int] = {}  # a line's SHA-1 → its task: identical lines share one
        self.task_ids: dict[int, int] = {}  # task index → Task id
        self.rollouts_of: dict[int, int] = {}  # task index → rollouts so far
        self.next_index = 0

    def _task_index(self, text: str, row: dict) -> int:
        if TASK_INDEX_KEY_NAME in row:
            return row[TASK_INDEX_KEY_NAME]
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).digest()
        if digest not in self.by_text:
            while self.next_index in self.explicit:
                self.next_index += 1
            self.by_text[digest] = self.next_index
            self.next_index += 1
        return self.by_text[digest]

    def prepare(self, batch: list[tuple[int, str, dict]]) -> tuple[list[Task], list[tuple[int, int]]]:
        """The new tasks and the (task, rollout) keys of ``batch``, numbered; no query, so call it
        outside the batch's transaction (the less work inside, the sooner other writers get in)."""
        run = self.run
        new_tasks: list[Task] = []
        keys: list[tuple[int, int]] = []
        for _number, text, row in batch:
            task_index = self._task_index(text, row)
            if task_index not in self.rollouts_of:
                self.rollouts_of[task_index] = 0
                materialized = _materialized(row, task_index, run.agent_name, run.overrides or None)
                new_tasks.append(Task(run=run, task_index=task_index, row_json=dumps(materialized)))
            for _ in range(run.num_repeats):
                keys.append((task_index, self.rollouts_of[task_index]))
                self.rollouts_of[task_index] += 1
        return new_tasks, keys

    def write(self, prepared: tuple[list[Task], list[tuple[int, int]]]) -> None:
        """Store ``prepare``'s tasks and pending rollouts (inside the caller's transaction)."""
        run = self.run
        new_tasks, keys = prepared
        made = Task.objects.bulk_create(new_tasks)
        if any(t.pk is None for t in made):  # backends that do not return ids from bulk_create
            wanted = [t.task_index for t in made]
            self.task_ids.update(Task.objects.filter(run=run, task_index__in=wanted).values_list("task_index", "id"))
        else:
            self.task_ids.update((t.task_index, t.pk) for t in made)
        insert_from_template(
            Rollout,
            Rollout(run=run, attempt=1),
            ["task_id", "task_index", "rollout_index"],
            [(self.task_ids[t], t, r) for t, r in keys],
        )


def create_run_from_rows(
    parsed: ParsedDataset,
    *,
    name: str,
    user=None,
    dataset: Dataset | None = None,
    team=None,
    progress=None,
    **options: Any,
) -> Run:
    """A queued run over ``parsed`` (rows held in memory: the collect command's file, the demo's,
    the API's and the form's small datasets) with ``options`` (``Run`` fields, as
    ``runs.create_run``), its tasks and pending rollouts written ``BULK`` rows per transaction as
    ``streamed_upload.create_run_from_dataset`` writes them (numbered as ``materialize`` numbers them), the run
    shown nowhere until its last batch is in. The run's team: ``team``, else ``dataset``'s, else the
    user's first. Raises ``RunTooLarge`` (and ``ValueError``) before storing anything; on any
    failure deletes what it stored and re-raises."""
    team_id = team.pk if team is not None else dataset.team_id if dataset is not None else team_for_new(user)
    run, count = new_run(name, user, dataset, team_id, len(parsed.rows), options)

    def carried() -> set[int]:
        return {row[TASK_INDEX_KEY_NAME] for row in parsed.rows[:count] if TASK_INDEX_KEY_NAME in row}

    batches = (
        list(zip(parsed.lines[start:end], parsed.texts[start:end], parsed.rows[start:end]))
        for start in range(0, count, BULK)
        for end in [min(start + BULK, count)]
    )
    fill_run(run, count, carried, batches, progress)
    return run
