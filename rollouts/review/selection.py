"""Dataset from a selection: the tasks of a filtered list of a run's rollouts become a new dataset,
from which a new run can be launched (its ``dataset`` then says where its tasks came from:
``Dataset.source_run`` and ``Dataset.source_filters``).

Each task of the selection (a task with at least one rollout in the list) gives one row: the
materialised task row the source run sent (overrides included), keeping ``_ng_task_index`` so the
new run's results line up task by task with the source run's (compare page, pass@k), and without
the ``agent_ref`` the source run added (one equal to ``{"name": <its agent name>}``) so the new run
names its own agent.
"""

from __future__ import annotations

import hashlib
import json

from django.db import transaction
from django.db.models import QuerySet

from rollouts.collection import runs
from rollouts.collection.datasets import ParsedDataset
from rollouts.models import Dataset, Run, Task
from rollouts.review.actions import ReviewError


def selection_rows(run: Run, rollouts: QuerySet) -> list[dict]:
    """The task rows of the selection ``rollouts`` (a queryset of ``run``'s rollouts), by task index."""
    task_ids = rollouts.order_by().values("task_id")
    rows = []
    for text in (
        Task.objects.filter(run=run, id__in=task_ids)
        .order_by("task_index")
        .values_list("row_json", flat=True)
        .iterator(chunk_size=1000)
    ):
        row = json.loads(text)
        if row.get("agent_ref") == {"name": run.agent_name}:
            del row["agent_ref"]
        rows.append(row)
    return rows


def dataset_from_selection(
    run: Run, rollouts: QuerySet, *, filters: str = "", user=None, name: str | None = None
) -> Dataset:
    """Store the selection's tasks as a new ``Dataset`` (see the module doc) that records its source
    run and filter querystring ``filters``. Raises ``ReviewError`` when the selection has no task."""
    rows = selection_rows(run, rollouts)
    if not rows:
        raise ReviewError("no rollout matches this filter, so there are no tasks to make a dataset of", "filters")
    texts = [json.dumps(row, ensure_ascii=False) for row in rows]
    parsed = ParsedDataset(
        rows=rows,
        lines=list(range(1, len(rows) + 1)),
        texts=texts,
        sha256=hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest(),
    )
    label = name or f"{run.name} #{run.pk} · {len(rows)} task{'' if len(rows) == 1 else 's'}" + (
        f" · {filters}" if filters else ""
    )
    with transaction.atomic():
        dataset = runs.store_dataset(parsed, label[:200], user=user, team=run.team)  # the run's team
        dataset.source_run = run
        dataset.source_filters = filters[:2000]
        dataset.save(update_fields=["source_run", "source_filters"])
    return dataset


def new_run_initial(dataset: Dataset) -> dict:
    """Initial values of the new-run form for a dataset made from a selection: the dataset, and the
    source run's env and knobs (its agent URL too: change it to try another agent)."""
    initial = {"dataset": dataset.pk}
    source = dataset.source_run
    if source is not None:
        initial.update(
            agent_url=source.agent_url,
            env_url=source.env_url,
            agent_name=source.agent_name,
            concurrency=source.concurrency,
            max_steps=source.max_steps,
            num_repeats=source.num_repeats,
            max_attempts=source.max_attempts,
            remote_responses_timeout_s=source.remote_responses_timeout_s,
            run_timeout_s=source.run_timeout_s,
            env_max_in_flight=source.env_max_in_flight or None,
            overrides=json.dumps(source.overrides) if source.overrides else "",
        )
    return initial
