"""The profiler's warnings in plain words, each once: a run whose rewards are all the same (so
every interval collapses) gets one note saying so on the command's stderr, never NeMo Gym's raw
"Standard error is 0 … --" text once per group."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from rollouts.evaluation.reward_profile import COLLAPSED_INTERVAL_NOTE, plain_notes
from rollouts.models import Rollout
from tests.run_factories import finish, key, make_run

pytestmark = pytest.mark.django_db


def test_the_collapsed_interval_warning_becomes_one_plain_note():
    raw = [
        "Standard error is 0 (all 4 values are identical) -- confidence interval collapses",
        "Standard error is 0 (all 2 values are identical) -- confidence interval collapses",
        "2 repeat(s) are missing rollouts",
        "2 repeat(s) are missing rollouts",
    ]
    assert plain_notes(raw) == [COLLAPSED_INTERVAL_NOTE, "2 repeat(s) are missing rollouts"]


def test_profiling_a_run_of_equal_rewards_prints_the_note_once(tmp_path):
    run = make_run(2, num_repeats=2)
    for task in range(2):
        for repeat in range(2):
            finish(key(run, task, repeat), Rollout.Status.SUCCEEDED, 1.0)
    err = io.StringIO()
    call_command("profile", str(run.pk), "--output-dir", str(tmp_path), stderr=err, stdout=io.StringIO())
    text = err.getvalue()
    assert "Standard error is 0" not in text and " -- " not in text
    assert text.count(COLLAPSED_INTERVAL_NOTE) == 1
