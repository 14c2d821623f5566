"""Migration 0006: rows stored before it read back unchanged after it: JSON columns move
from ``jsonb`` (PostgreSQL) / checked text (SQLite) to JSON text, and plain text that holds gymweb's
escape character U+FDD0 (or, on SQLite, a raw U+0000) is encoded so the new fields decode it back."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from rollouts.models import AgentCall, Rollout, Run, TrajectoryItem

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # migrates back and forth

BEFORE = [("rollouts", "0009_health_and_reverify")]
AFTER = [("rollouts", "0006_lossless_text")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_rows_stored_before_the_migration_read_back_the_same_after_it():
    old = _migrate(BEFORE)
    try:
        sqlite = connection.vendor == "sqlite"
        error = "agent said \ufdd0 then \ufdd00" + (" and a raw \x00 NUL" if sqlite else "")
        ORun, OTask, ORollout = (
            old.get_model("rollouts", "Run"),
            old.get_model("rollouts", "Task"),
            old.get_model("rollouts", "Rollout"),
        )
        OCall, OItem = old.get_model("rollouts", "AgentCall"), old.get_model("rollouts", "TrajectoryItem")
        run = ORun.objects.create(
            name="run \ufdd0", overrides={"temperature": 0.5, "model": "m"}, aggregate_metrics={"k": [1, 2]}
        )
        task = OTask.objects.create(run=run, task_index=0, row_json='{"responses_create_params": {"input": "hi"}}')
        rollout = ORollout.objects.create(
            run=run,
            task=task,
            task_index=0,
            rollout_index=0,
            status="failed",
            error=error,
            failure_kind="kind\ufdd0",
            warnings=["w \ufdd0"],
        )
        call = OCall.objects.create(
            rollout=rollout,
            index=0,
            started=datetime.now(UTC),
            latency_ms=1.0,
            usage={"input_tokens": 1, "b": {"z": 1}},
            incomplete_details={"reason": "max_output_tokens"},
            model="model \ufdd0",
        )
        OItem.objects.create(
            rollout=rollout,
            seq=0,
            step=0,
            kind="message",
            origin="agent",
            call_id="c\ufdd0",
            payload={"type": "message", "text": "\ufdd0 kept"},
        )
    finally:
        _migrate(AFTER)
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    run = Run.objects.get(pk=run.pk)
    assert (
        run.name == "run \ufdd0"
        and run.overrides == {"temperature": 0.5, "model": "m"}
        and run.aggregate_metrics == {"k": [1, 2]}
    )
    rollout = Rollout.objects.get(pk=rollout.pk)
    assert (rollout.error, rollout.failure_kind, rollout.warnings) == (error, "kind\ufdd0", ["w \ufdd0"])
    assert Rollout.objects.filter(failure_kind="kind\ufdd0").count() == 1  # lookups encode the same way
    call = AgentCall.objects.get(pk=call.pk)
    assert call.usage == {"input_tokens": 1, "b": {"z": 1}} and call.model == "model \ufdd0"
    item = TrajectoryItem.objects.get(rollout=rollout)
    assert item.payload == {"type": "message", "text": "\ufdd0 kept"} and item.call_id == "c\ufdd0"
    # New rows take U+0000 on every backend from now on.
    Rollout.objects.filter(pk=rollout.pk).update(error="\x00 now storable")
    assert Rollout.objects.get(pk=rollout.pk).error == "\x00 now storable"
