"""Curated exports: NeMo Gym's files filtered by labels and by the env's or the corrected reward,
with ``gymweb_review`` only when asked for (off by default: byte-identical to the plain export),
saying which reward they use; and the SFT download of a selection."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.collection import export
from rollouts.models import Rollout
from rollouts.review import actions

from .run_factories import ANSWER, finish, key, make_run

S = Rollout.Status


def rows(response) -> list[dict]:
    assert response.status_code == 200 and response.streaming
    return [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]


def url(run, kind, query=""):
    return reverse("run_export", args=[run.pk, kind]) + (f"?{query}" if query else "")


@pytest.fixture
def run(db, user):
    run = make_run(4)
    finish(key(run, 0), S.SUCCEEDED, 1.0, output=ANSWER)
    finish(key(run, 1), S.SUCCEEDED, 0.0, output=ANSWER)
    finish(key(run, 2), S.FAILED, kind="seed_failed", error="env down")
    finish(key(run, 3), S.SUCCEEDED, 1.0, output=ANSWER)
    actions.set_label(key(run, 0), actions.find_label("good", team_id=run.team_id), True, user)
    actions.set_label(key(run, 3), actions.find_label("reward-hack", team_id=run.team_id), True, user)
    actions.add_note(key(run, 3), "it printed the expected answer without calling the tool", user)
    actions.correct_reward(key(run, 3), 0.0, "reward hack", user)
    actions.add_note(key(run, 2), "the env was down", user)
    return run


def test_by_default_the_files_are_exactly_nemo_gym_s(signed_in, run):
    for kind, lines in (
        ("rollouts", list(export.iter_successes(run))),
        ("rollouts_failures", list(export.iter_failures(run))),
    ):
        assert lines, kind
        response = signed_in.get(url(run, kind))
        body = b"".join(response.streaming_content).decode()
        assert body == "".join(line + "\n" for line in lines)
        assert "gymweb_review" not in body and "_gymweb_reward_source" not in body


def test_an_export_filtered_by_label_holds_only_those_rollouts(signed_in, run):
    assert [r["_ng_task_index"] for r in rows(signed_in.get(url(run, "rollouts", "label=good")))] == [0]
    assert [r["_ng_task_index"] for r in rows(signed_in.get(url(run, "rollouts", "not_label=reward-hack")))] == [0, 1]
    assert [r["_ng_task_index"] for r in rows(signed_in.get(url(run, "rollouts_failures", "notes=yes")))] == [2]


def test_the_corrected_reward_export_says_which_reward_each_row_has(signed_in, run):
    response = signed_in.get(url(run, "rollouts", "reward_source=corrected"))
    assert response["X-Gymweb-Reward-Source"] == "corrected" and response["X-Gymweb-Review"] == "omitted"
    got = {r["_ng_task_index"]: (r["reward"], r["_gymweb_reward_source"]) for r in rows(response)}
    assert got == {0: (1.0, "env"), 1: (0.0, "env"), 3: (0.0, "corrected")}
    plain = signed_in.get(url(run, "rollouts"))
    assert plain["X-Gymweb-Reward-Source"] == "original"
    assert {r["_ng_task_index"]: r["reward"] for r in rows(plain)} == {0: 1.0, 1: 0.0, 3: 1.0}


def test_reward_bounds_read_the_chosen_reward(signed_in, run):
    assert [r["_ng_task_index"] for r in rows(signed_in.get(url(run, "rollouts", "reward_min=1")))] == [0, 3]
    assert [
        r["_ng_task_index"] for r in rows(signed_in.get(url(run, "rollouts", "reward_min=1&reward_source=corrected")))
    ] == [0]


def test_gymweb_review_lists_labels_notes_and_the_correction_when_asked(signed_in, run):
    response = signed_in.get(url(run, "rollouts", "review=1"))
    assert response["X-Gymweb-Review"] == "included"
    by_task = {r["_ng_task_index"]: r for r in rows(response)}
    assert by_task[3]["reward"] == 1.0  # the env's: the correction is listed, not applied
    review = by_task[3]["gymweb_review"]
    assert review["reward_source"] == "env" and review["env_reward"] == 1.0
    assert review["corrected_reward"]["reward"] == 0.0 and review["corrected_reward"]["reason"] == "reward hack"
    assert review["corrected_reward"]["by"] == "alice" and review["corrected_reward"]["at"]
    assert [lab["name"] for lab in review["labels"]] == ["reward-hack"] and review["labels"][0]["by"] == "alice"
    assert review["notes"][0]["text"].startswith("it printed") and review["notes"][0]["item"] is None
    assert by_task[1]["gymweb_review"] == {
        "reward_source": "env",
        "env_reward": 0.0,
        "corrected_reward": None,
        "labels": [],
        "notes": [],
        "rubric": [],
    }
    failure = rows(signed_in.get(url(run, "rollouts_failures", "review=1")))[0]
    assert failure["reward"] == 0.0 and failure["gymweb_review"]["notes"][0]["text"] == "the env was down"


def test_the_rest_of_a_row_is_unchanged_by_the_review_options(signed_in, run):
    plain = {r["_ng_task_index"]: r for r in rows(signed_in.get(url(run, "rollouts")))}
    reviewed = rows(signed_in.get(url(run, "rollouts", "review=1&reward_source=corrected")))
    assert plain and len(reviewed) == len(plain)
    for r in reviewed:
        before = plain[r["_ng_task_index"]]
        assert list(r) == list(before) + ["_gymweb_reward_source", "gymweb_review"]  # key order kept, ours last
        assert {k: v for k, v in r.items() if k in before and k != "reward"} == {
            k: v for k, v in before.items() if k != "reward"
        }


def test_a_withdrawn_correction_is_not_used(signed_in, user, run):
    actions.withdraw_correction(key(run, 3), user)
    got = {
        r["_ng_task_index"]: r["reward"] for r in rows(signed_in.get(url(run, "rollouts", "reward_source=corrected")))
    }
    assert got[3] == 1.0


def test_the_sft_download_holds_the_selection_s_successes(signed_in, run):
    response = signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?label=-&metadata=1&reward_source=corrected")
    assert response["X-Gymweb-Reasoning"] == "keep" and 'filename="run-' in response["Content-Disposition"]
    got = rows(response)
    assert [r["metadata"]["task_index"] for r in got] == [1]  # task 0 is labelled, 2 failed, 3 labelled
    assert got[0]["messages"][0] == {"role": "user", "content": "task 1"}
    all_rows = rows(signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?metadata=1&reward_source=corrected"))
    meta = {r["metadata"]["task_index"]: r["metadata"] for r in all_rows}
    assert meta[3]["reward"] == 0.0 and meta[3]["reward_source"] == "corrected" and meta[3]["labels"] == ["reward-hack"]
    assert set(all_rows[0]) == {"messages", "tools", "metadata"}


def test_the_sft_download_refuses_an_unknown_reasoning_mode_naming_it(signed_in, run):
    response = signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?reasoning=maybe")
    assert response.status_code == 400 and "reasoning='maybe'" in response.content.decode()


@pytest.mark.parametrize(
    "query, field", [("reward_min=abc", "reward_min"), ("label=%00", "label"), ("reward_source=both", "reward_source")]
)
def test_a_download_with_a_bad_filter_value_is_refused_naming_it_never_a_bigger_file(signed_in, run, query, field):
    # A hand-edited link: the page would show the error on the field; a file of the unfiltered list
    # (or a 500 for the NUL on PostgreSQL) would be wrong without a word.
    for u in (
        url(run, "rollouts", query),
        url(run, "rollouts_failures", query + "&review=1"),
        reverse("run_export_sft", args=[run.pk]) + "?" + query,
    ):
        response = signed_in.get(u)
        assert response.status_code == 400 and f"bad filter: {field}=" in response.content.decode()


def test_downloads_need_a_signed_in_user(client, run):
    for u in (url(run, "rollouts", "review=1"), reverse("run_export_sft", args=[run.pk])):
        response = client.get(u)
        assert response.status_code == 302 and reverse("login") in response["Location"]


def test_the_run_page_offers_the_curated_downloads_for_its_filter(signed_in, run):
    html = signed_in.get(reverse("run", args=[run.pk]) + "?label=good").content.decode()
    assert 'id="curated-export"' in html and '<input type="hidden" name="label" value="good">' in html
    assert reverse("run_export_sft", args=[run.pk]) in html


def test_download_names_say_the_review_filter(signed_in, run):
    response = signed_in.get(url(run, "rollouts", "label=good&review=1"))
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}_rollouts_label-good.jsonl"'
    response = signed_in.get(url(run, "rollouts", "label=-&notes=yes"))
    assert f"run-{run.pk}_rollouts_label-none_notes-yes.jsonl" in response["Content-Disposition"]
    response = signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?corrected=yes")
    assert f"run-{run.pk}_sft_corrected-yes.jsonl" in response["Content-Disposition"]
