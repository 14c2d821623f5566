"""Run-wide search (``?text=``) covers the env's verify reply and the task row, not only the
trajectory's items, and each hit in the run table shows a snippet with the match in ``<mark>``
(escaped). On NeMo Gym's real mini_swe_agent_2 recording."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout
from rollouts.review.query import filtered_rollouts
from rollouts.search.text import find_snippet


def _import(shared_data):
    with (shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").open("rb") as fh:
        return import_rollouts(fh, source="mini_swe_agent_2/example_rollouts.jsonl").run


def _with_judge_note(run, task_index: int, note: str) -> Rollout:
    rollout = Rollout.objects.get(run=run, task_index=task_index)
    verify = json.loads(rollout.verify_json)
    verify["judge_note"] = note
    rollout.verify_json = json.dumps(verify)
    rollout.save(update_fields=["verify_json"])
    return rollout


@pytest.mark.django_db
def test_a_word_only_the_verify_reply_holds_is_found_with_a_snippet(signed_in, shared_data):
    run = _import(shared_data)
    _with_judge_note(run, 2, 'The patch misses the <b>Quuxfrobnicate</b> "edge" case in the parser.')
    response = signed_in.get(reverse("run", args=[run.pk]) + "?text=quuxfrobnicate")
    html = response.content.decode()
    table = html[html.index('id="rollout-table"') :]
    assert table.count('class="rollout-link mono"') == 1
    assert ">2:0</a>" in table
    assert "&lt;b&gt;<mark>Quuxfrobnicate</mark>&lt;/b&gt; &quot;edge&quot; case" in table
    assert "<b>Quux" not in table


@pytest.mark.django_db
def test_the_real_verify_field_instance_id_and_the_real_patch_are_searchable(shared_data):
    run = _import(shared_data)
    rows = [json.loads(line) for line in (shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").open()]
    target = rows[0]
    qs, _ = filtered_rollouts(run, {"text": target["instance_id"].upper()})
    assert target["_ng_task_index"] in {r.task_index for r in qs}


@pytest.mark.django_db
def test_a_search_in_the_trajectory_still_shows_the_items_snippet(signed_in, shared_data):
    run = _import(shared_data)
    item = Rollout.objects.get(run=run, task_index=4).items.filter(kind="function_call").first()
    assert item is not None
    word = item.search_text.split()[0][:12] if item.search_text.split() else "bash"
    html = signed_in.get(reverse("run", args=[run.pk]), {"text": word}).content.decode()
    assert "<mark>" in html[html.index('id="rollout-table"') :]


def test_the_snippet_keeps_the_match_as_written_and_cuts_the_context():
    before, match, after = find_snippet({"a": "x" * 100 + " Needle in\nhay " + "y" * 100}, "needle", context=10)
    assert match == "Needle"
    assert before.startswith("…") and after.endswith("…") and "\n" not in after
    assert find_snippet({"a": "nothing"}, "needle") is None


@pytest.mark.django_db
def test_a_verify_reply_holding_a_lone_surrogate_or_nul_escape_is_searched_not_refused(signed_in, shared_data):
    # lossless JSON text keeps "\ud800" and "\u0000" escapes that PostgreSQL's jsonb refuses
    run = _import(shared_data)
    rollout = Rollout.objects.get(run=run, task_index=1)
    verify = json.loads(rollout.verify_json)
    verify["judge_note"] = "Zorblequant answer"
    text = json.dumps(verify, ensure_ascii=False)
    rollout.verify_json = text[:-1] + ', "odd": "x\\ud800y\\u0000z"}'
    rollout.save(update_fields=["verify_json"])
    response = signed_in.get(reverse("run", args=[run.pk]) + "?text=zorblequant")
    assert response.status_code == 200
    table = response.content.decode()
    table = table[table.index('id="rollout-table"') :]
    assert table.count('class="rollout-link mono"') == 1 and ">1:0</a>" in table
