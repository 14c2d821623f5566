"""The dispatcher's raw insert passes some values through without Django's per-value conversion:
what it sends must be exactly what ``get_db_prep_save`` gives, for every field of
the models it writes, on the backend the suite runs on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection

from rollouts import bulk
from rollouts.models import AgentCall, Rollout, Run, Task, TrajectoryItem

pytestmark = pytest.mark.django_db

# Values of every type a field may hold in the dispatcher's objects, and some it should not
# (bool in an integer field, int in a float field, str in an integer field): those must convert.
VALUES = [
    None,
    0,
    7,
    -3,
    True,
    False,
    1.5,
    -0.0,
    3.0,
    2,
    "",
    "text",
    "a\x00b",
    "\udc80",
    datetime(2026, 12, 1, 4, 5, 6, 789000, tzinfo=UTC),
    {"k": [1, 2.0]},
    [1],
]


def _expected(field, value):
    return field.get_db_prep_save(value, connection)


@pytest.mark.parametrize("model", [AgentCall, TrajectoryItem])
def test_passed_through_values_are_what_django_would_send(model):
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    checked = 0
    for field in fields:
        plain = bulk.plain_types(field, connection)
        for value in VALUES:
            if type(value) not in plain:
                continue
            try:
                expected = _expected(field, value)
            except (TypeError, ValueError):
                pytest.fail(f"{model.__name__}.{field.name}: {value!r} is passed through but Django refuses it")
            assert expected == value and type(expected) is type(value), (model.__name__, field.name, value, expected)
            checked += 1
    if connection.vendor == "sqlite":
        assert checked > 10  # integer, float, boolean and foreign-key fields take the short way


def test_lossless_and_json_fields_always_convert():
    ours = [
        f
        for model in (AgentCall, TrajectoryItem)
        for f in model._meta.concrete_fields
        if type(f).__module__.startswith("rollouts")
    ]
    assert ours
    for field in ours:
        assert bulk.plain_types(field, connection) == frozenset(), field.name


def test_it_stores_what_it_was_given_and_ignores_conflicts():
    run = Run.objects.create(name="insert")
    task = Task.objects.create(run=run, task_index=0, row_json='{"responses_create_params": {"input": "x"}}')
    rollout = Rollout.objects.create(run=run, task=task, task_index=0, rollout_index=0)
    objs = [
        TrajectoryItem(
            rollout=rollout,
            seq=i,
            step=i - 1,
            kind="message",
            role="user",
            name="n\x00" * i,
            origin="input",
            asked=bool(i % 2),
            latency_ms=None if i % 2 else 1.25,
            tool_status=200 if i else None,
            payload={"i": i, "t": "\x00x", "f": -0.0},
        )
        for i in range(4)
    ]
    bulk.insert_ignoring_conflicts(TrajectoryItem, objs)
    bulk.insert_ignoring_conflicts(TrajectoryItem, objs)  # conflicts are ignored
    rows = list(TrajectoryItem.objects.filter(rollout=rollout).order_by("seq"))
    assert [r.seq for r in rows] == [0, 1, 2, 3]
    assert [r.name for r in rows] == ["n\x00" * i for i in range(4)]
    assert [r.asked for r in rows] == [False, True, False, True]
    assert [r.latency_ms for r in rows] == [1.25, None, 1.25, None]
    assert [r.tool_status for r in rows] == [None, 200, 200, 200]
    assert rows[3].payload == {"i": 3, "t": "\x00x", "f": -0.0}


@pytest.mark.parametrize(("model", "row_class"), [(AgentCall, "CallRow"), (TrajectoryItem, "ItemRow")])
def test_the_loops_row_classes_carry_every_column_of_their_model(model, row_class):
    from rollouts.workers import writer

    columns = {f.attname for f in model._meta.concrete_fields if not f.primary_key}
    assert set(getattr(writer, row_class).__slots__) == columns


def test_the_loops_rows_store_what_model_instances_would():
    from rollouts.engine.loop import ItemRecord, StepRecord
    from rollouts.workers.writer import Batch, _as_model, call_row, item_row, write_batch

    run = Run.objects.create(name="rows")
    task = Task.objects.create(run=run, task_index=0, row_json='{"responses_create_params": {"input": "x"}}')
    ours, theirs = (Rollout.objects.create(run=run, task=task, task_index=0, rollout_index=i) for i in range(2))
    step = StepRecord(
        index=0,
        started_at=1764648000.25,
        latency_ms=12.5,
        http_status=200,
        response_id="r\x00",
        model="m",
        usage={"input_tokens": 3},
        incomplete_details=None,
        num_asks=1,
        error=None,
    )
    recs = [
        ItemRecord(
            seq=0,
            step=0,
            item={"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            origin="agent",
            asked=True,
        ),
        ItemRecord(
            seq=1,
            step=0,
            item={"type": "function_call_output", "call_id": "c", "output": "ünï\x00"},
            origin="gym",
            latency_ms=0.5,
            tool_status=200,
        ),
    ]
    write_batch(Batch(calls=[call_row(ours.pk, step)], items=[item_row(ours.pk, r) for r in recs]), "w")
    AgentCall.objects.bulk_create([_as_model(AgentCall, call_row(theirs.pk, step))])
    TrajectoryItem.objects.bulk_create([_as_model(TrajectoryItem, item_row(theirs.pk, r)) for r in recs])

    def stored(model, rollout):
        names = [f.attname for f in model._meta.concrete_fields if f.attname not in ("id", "rollout_id")]
        return list(model.objects.filter(rollout=rollout).order_by("pk").values_list(*names))

    for model in (AgentCall, TrajectoryItem):
        assert stored(model, ours) == stored(model, theirs) != []


def test_pending_rollouts_from_a_template_store_what_bulk_create_would():
    stored = []
    for how in ("bulk_create", "template"):
        run = Run.objects.create(name=how, agent_name="a\x00")
        tasks = [Task.objects.create(run=run, task_index=i, row_json="{}") for i in range(3)]
        keys = [(t.pk, t.task_index, r) for t in tasks for r in range(2)]
        if how == "bulk_create":
            Rollout.objects.bulk_create(
                [Rollout(run=run, task_id=tid, task_index=ti, rollout_index=ri, attempt=1) for tid, ti, ri in keys]
            )
        else:
            template = Rollout(run=run, attempt=1)
            bulk.insert_from_template(Rollout, template, ["task_id", "task_index", "rollout_index"], keys)
        skip = ("id", "created", "run_id", "task_id")
        names = [f.attname for f in Rollout._meta.concrete_fields if f.attname not in skip]
        stored.append(list(Rollout.objects.filter(run=run).order_by("pk").values_list(*names)))
        assert [r.task.task_index for r in Rollout.objects.filter(run=run).order_by("pk")] == [0, 0, 1, 1, 2, 2]
        assert not Rollout.objects.filter(run=run, created__isnull=True).exists()
    assert len(stored[0]) == 6 and stored[0] == stored[1]
    with pytest.raises(IntegrityError):  # a key stored twice is refused, not ignored
        bulk.insert_from_template(
            Rollout, Rollout(run=run, attempt=1), ["task_id", "task_index", "rollout_index"], keys
        )
