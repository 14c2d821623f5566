"""Migration 0024 (teams): every user, run and dataset stored before it lands in the ``default`` team, so an
instance that had no teams behaves as before: each user sees every run; tokens stay read-write and
never expire."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from rollouts.models import ApiToken, Dataset, Label, Run, Team
from rollouts.teams import visible_runs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # migrates back and forth

BEFORE = [("rollouts", "0023_background_tasks")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_rows_and_users_stored_before_teams_are_all_in_the_default_team():
    old = _migrate(BEFORE)
    try:
        OUser = old.get_model(*settings.AUTH_USER_MODEL.split("."))
        alice = OUser.objects.create(username="alice", is_active=True)
        bob = OUser.objects.create(username="bob", is_active=True)
        dataset = old.get_model("rollouts", "Dataset").objects.create(name="tasks.jsonl", created_by=alice)
        run = old.get_model("rollouts", "Run").objects.create(name="old run", created_by=alice, dataset=dataset)
        old.get_model("rollouts", "ApiToken").objects.create(user=bob, name="t", prefix="gw_x", digest="d" * 64)
        old.get_model("rollouts", "Label").objects.create(name="old-label", position=9)
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    default = Team.objects.get(name="default")
    assert set(default.members.values_list("username", flat=True)) == {"alice", "bob"}
    assert Run.objects.get(pk=run.pk).team == default
    assert Dataset.objects.get(pk=dataset.pk).team == default
    assert Label.objects.get(name="old-label").team == default  # migration 0027: labels too
    token = ApiToken.objects.get(user__username="bob")
    assert token.scope == "write" and token.expires is None
    bob_now = get_user_model().objects.get(username="bob")
    assert list(visible_runs(bob_now).values_list("pk", flat=True)) == [run.pk]
