"""Migration 0025: a dataset stored before it keeps the name it came with as its source name, so
renaming it later still shows (and finds) the file it came from."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # migrates back and forth

BEFORE = [("rollouts", "0023_background_tasks")]  # before teams: a dataset needs no team there
AFTER = [("rollouts", "0025_dataset_source_name")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_a_dataset_stored_before_it_gets_its_name_as_its_source_name():
    try:
        old = _migrate(BEFORE)
        stored = old.get_model("rollouts", "Dataset").objects.create(name="example.jsonl", num_rows=5)
        new = _migrate(AFTER)
        assert new.get_model("rollouts", "Dataset").objects.get(pk=stored.pk).source_name == "example.jsonl"
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
