"""Migration 0013: items stored before it are found by the run page's content search
after it (their ``search_text`` filled, the backend's index built), and items stored after it too;
undoing it drops the index."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from rollouts.models import Rollout, TrajectoryItem
from rollouts.search import index, queries

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # migrates back and forth

BEFORE = [("rollouts", "0012_review")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _index_objects() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE %s", [index.FTS_TABLE + "%"])
        else:
            cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexname = %s", [index.TRGM_INDEX])
        return cursor.fetchone()[0]


def test_items_stored_before_the_migration_are_found_after_it_and_new_ones_too():
    old = _migrate(BEFORE)
    try:
        assert _index_objects() == 0
        ORun, OTask, ORollout = (
            old.get_model("rollouts", "Run"),
            old.get_model("rollouts", "Task"),
            old.get_model("rollouts", "Rollout"),
        )
        OItem = old.get_model("rollouts", "TrajectoryItem")
        run = ORun.objects.create(name="old run")
        task = OTask.objects.create(run=run, task_index=0, row_json='{"responses_create_params": {"input": "hi"}}')
        before = ORollout.objects.create(run=run, task=task, task_index=0, rollout_index=0, status="succeeded")
        OItem.objects.create(
            rollout=before,
            seq=0,
            step=0,
            kind="function_call_output",
            origin="gym",
            payload={"type": "function_call_output", "output": 'Stored\x00Before "quoted"'},
        )
        other = ORollout.objects.create(run=run, task=task, task_index=0, rollout_index=1, status="succeeded")
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    assert _index_objects() >= 1
    rollouts = Rollout.objects.filter(run_id=run.pk)
    assert list(queries.filter_text(rollouts, 'before "QUOTED"').values_list("pk", flat=True)) == [before.pk]
    assert list(queries.filter_output(rollouts, "stored").values_list("pk", flat=True)) == [before.pk]
    TrajectoryItem.objects.bulk_create(
        [
            TrajectoryItem(
                rollout_id=other.pk,
                seq=0,
                step=0,
                kind="message",
                origin="agent",
                payload={"type": "message", "content": "Written After"},
            )
        ]
    )
    assert list(queries.filter_text(rollouts, "written after").values_list("pk", flat=True)) == [other.pk]
    assert list(queries.filter_text(rollouts, "stored").values_list("pk", flat=True)) == [before.pk]


def test_undoing_the_migration_drops_the_index_and_redoing_it_rebuilds_it():
    try:
        _migrate(BEFORE)
        assert _index_objects() == 0
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    assert _index_objects() >= 1


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite triggers")
def test_lost_triggers_are_put_back_and_the_index_refilled():
    """A later migration that rebuilds the items table on SQLite drops its triggers: the next
    ``migrate`` (post_migrate) puts them back and refills the index."""
    from django.core.management import call_command

    from .run_factories import key, make_run

    run = make_run(1)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER {index.FTS_TABLE}_ai")
    TrajectoryItem.objects.bulk_create(
        [
            TrajectoryItem(
                rollout=key(run, 0),
                seq=0,
                step=0,
                kind="message",
                origin="agent",
                payload={"type": "message", "content": "while unindexed"},
            )
        ]
    )
    rollouts = Rollout.objects.filter(run=run)
    assert not queries.filter_text(rollouts, "unindexed").exists()
    call_command("migrate", verbosity=0)
    assert queries.filter_text(rollouts, "unindexed").exists()
    assert index.ensure_index(connection) == "present"


@pytest.mark.parametrize("debug", [True, False], ids=["DEBUG on", "DEBUG off"])
def test_the_migration_applies_with_django_debug_cursor_on_and_off(debug):
    # DEBUG on logs every query through the debug cursor, which formats the SQL with its parameters:
    # a query written with the backend's own placeholders instead of %s fails there only.
    _migrate(BEFORE)
    connection.force_debug_cursor = debug
    try:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    finally:
        connection.force_debug_cursor = False
    assert _index_objects() >= 1
