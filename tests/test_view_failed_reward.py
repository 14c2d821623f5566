"""A failed rollout has no reward: verify never gave one. Every page that shows a reward says
"— not verified" for it (the rollout header, the review panel, the run table, compare's sides), while
the downloads keep NeMo Gym's failure row exactly as it is (``reward: 0.0``)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.models import Rollout

from .run_factories import finish, key, make_run

S = Rollout.Status

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(db):
    run = make_run(3)
    finish(key(run, 0), S.SUCCEEDED, 1.0)
    finish(key(run, 1), S.FAILED, kind="agent_unreachable", error="connection refused", terminal=True)
    finish(key(run, 2), S.FAILED, kind="verify_failed", error="verify answered 500")
    return run


def _rollout_page(client, rollout) -> str:
    response = client.get(reverse("rollout", args=[rollout.run_id, rollout.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_a_failed_rollouts_header_says_not_verified_instead_of_reward_zero(signed_in, run):
    html = _rollout_page(signed_in, key(run, 1))
    header = html[html.index('id="traj-summary"') : html.index("</section>", html.index('id="traj-summary"'))]
    assert "— not verified" in header
    assert "reward <strong>0.0" not in header and ">0.0<" not in header
    assert "failed before the env&#x27;s verify gave one" in header


def test_a_failed_rollouts_review_panel_offers_no_correction_and_says_why(signed_in, run):
    html = _rollout_page(signed_in, key(run, 1))
    panel = html[html.index('<section id="review-panel"') :]
    panel = panel[: panel.index("</section>")]
    assert "— not verified" in panel and 'env <strong id="env-reward">0.0' not in panel
    assert "no reward to correct" in panel and "correct the reward…" not in panel


def test_a_failed_verify_is_told_apart_in_the_title(signed_in, run):
    html = _rollout_page(signed_in, key(run, 2))
    assert "the env&#x27;s verify did not give a usable reply" in html


def test_a_succeeded_rollout_still_shows_its_reward(signed_in, run):
    html = _rollout_page(signed_in, key(run, 0))
    assert "reward <strong>1.0</strong>" in html
    assert '<strong id="env-reward">1.0</strong>' in html and "not verified" not in html


def test_the_run_table_shows_not_verified_in_the_reward_column_of_failures(signed_in, run):
    html = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    table = html[html.index('class="rollout-table"') :]
    rows = table.split('<tr class="status-')[1:]
    by_status = {}
    for row in rows:
        by_status.setdefault(row.split('"', 1)[0], []).append(row)
    assert len(by_status["failed"]) == 2
    for row in by_status["failed"]:
        assert "— not verified" in row and "0.0000" not in row
    assert "1.0000" in by_status["succeeded"][0]


def test_compare_shows_not_verified_for_a_failed_side(signed_in, run):
    other = make_run(3, name="other")
    finish(key(other, 1), S.SUCCEEDED, 0.5)
    html = signed_in.get(reverse("compare"), {"a": run.pk, "b": other.pk, "task": 1}).content.decode()
    side_a = html[html.index('aria-label="run A"') : html.index('aria-label="run B"')]
    assert "— not verified" in side_a


def test_the_failures_download_keeps_nemo_gyms_reward_zero(signed_in, run):
    response = signed_in.get(reverse("run_export", args=[run.pk, "rollouts_failures"]))
    rows = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert len(rows) == 2 and all(r["reward"] == 0.0 for r in rows)
