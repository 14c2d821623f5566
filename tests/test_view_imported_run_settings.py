"""An imported run's page shows what the import recorded (its files, the agent the rows name, tasks
× repeats, when and by whom) and says "not recorded in the files" for the settings a file does not
keep, instead of the new-run form's defaults (concurrency, max steps, timeouts...)."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.models import Run

pytestmark = pytest.mark.django_db


def _settings_card(html: str) -> str:
    start = html.index('<details class="card settings">')
    return html[start : html.index("</details>", start)]


def test_an_imported_run_shows_what_its_files_recorded_and_no_collection_defaults(signed_in, shared_data):
    run_b = shared_data / "eval_0.7.0" / "runB"
    call_command(
        "import_rollouts",
        str(run_b / "rollouts.jsonl"),
        "--failures",
        str(run_b / "rollouts_failures.jsonl"),
        "--no-health-check",
    )
    run = Run.objects.get()
    card = _settings_card(signed_in.get(reverse("run", args=[run.pk])).content.decode())
    assert 'id="imported-settings"' in card
    assert 'remote_agent <span class="muted small">(the rows\' agent_ref)</span>' in card
    assert f"{run.num_tasks} × {run.num_repeats}" in card and str(run_b / "rollouts.jsonl") in card
    assert "concurrency, max steps, limit, attempts, timeouts and overrides: not recorded in the files" in card
    for default_shown in ("<dt>concurrency</dt>", "<dt>max steps</dt>", "<dt>per-call timeout</dt>", "unbounded"):
        assert default_shown not in card


def test_an_agent_name_the_files_do_not_give_is_not_recorded(signed_in):
    row = {"responses_create_params": {"input": "x"}, "response": {"id": "r", "output": []}, "reward": 1.0}
    run = import_rollouts([json.dumps(row) + "\n"], source="plain.jsonl").run
    card = _settings_card(signed_in.get(reverse("run", args=[run.pk])).content.decode())
    agent = card[card.index("<dt>agent name</dt>") : card.index("<dt>tasks × repeats</dt>")]
    assert "not recorded in the files" in agent and run.agent_name not in agent


def test_a_collected_run_still_shows_its_settings(signed_in):
    from .run_factories import make_run

    run = make_run(2, concurrency=7)
    card = _settings_card(signed_in.get(reverse("run", args=[run.pk])).content.decode())
    assert "<dt>concurrency</dt><dd>7</dd>" in card and "not recorded" not in card
