"""An instance with one team behaves as before teams: every user joins the ``default`` team, every
run and dataset lands in it, and every signed-in user sees every run. The ``team`` command and
the admin manage teams."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.models import DEFAULT_TEAM, Team

from .run_factories import make_run


def test_users_and_runs_land_in_the_default_team_and_everyone_sees_everything(client, django_user_model, db):
    alice = django_user_model.objects.create_user(username="alice", password="x")
    bob = django_user_model.objects.create_user(username="bob", password="x")
    run = make_run(2, name="shared run", user=bob)
    default = Team.objects.get(name=DEFAULT_TEAM)
    assert set(default.members.all()) == {alice, bob}
    assert run.team == default
    client.force_login(alice)
    assert "shared run" in client.get(reverse("runs")).content.decode()
    assert client.get(reverse("run", args=[run.pk])).status_code == 200
    # one team: the new-run form asks nothing about teams
    assert 'name="team"' not in client.get(reverse("run_new")).content.decode()


def test_the_team_command_adds_lists_and_changes_members(db, django_user_model):
    carol = django_user_model.objects.create_user(username="carol", password="x")
    out = io.StringIO()
    call_command("team", "add", "vision", stdout=out)
    assert "vision" in out.getvalue()
    call_command("team", "member", "add", "vision", "carol", stdout=io.StringIO())
    assert Team.objects.get(name="vision").members.filter(pk=carol.pk).exists()
    listing = io.StringIO()
    call_command("team", "list", stdout=listing)
    assert "vision" in listing.getvalue() and "carol" in listing.getvalue()
    call_command("team", "member", "remove", "vision", "carol", stdout=io.StringIO())
    assert not Team.objects.get(name="vision").members.filter(pk=carol.pk).exists()
    with pytest.raises(CommandError, match="exists"):
        call_command("team", "add", "vision")
    with pytest.raises(CommandError, match="no team"):
        call_command("team", "member", "add", "nope", "carol")
    # with two teams, a new user joins none until an admin adds them
    dave = django_user_model.objects.create_user(username="dave", password="x")
    assert not dave.teams.exists()


def test_the_admin_lists_teams(admin_client, db):
    Team.objects.create(name="vision")
    page = admin_client.get("/admin/rollouts/team/")
    assert page.status_code == 200 and "vision" in page.content.decode()
