"""``manage.py export_sft``: a NeMo Gym file or a stored run's filtered successes to the SFT format."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from rollouts.models import Rollout
from rollouts.review import actions
from rollouts.review.sft import conversation

from .run_factories import ANSWER, finish, key, make_run


def run_command(*args):
    out, err = StringIO(), StringIO()
    call_command("export_sft", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_converts_a_nemo_gym_file(shared_data, tmp_path):
    source = shared_data / "tau2" / "example_rollouts.jsonl"
    out, _err = run_command("--input", str(source), "--output", str(tmp_path / "sft.jsonl"), "--reasoning", "drop")
    got = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    want = [conversation(json.loads(line), reasoning="drop") for line in source.read_text().splitlines()]
    assert got == want and "wrote 5 conversation(s)" in out


def test_rows_it_cannot_convert_are_named_and_left_out(tmp_path):
    good = {
        "responses_create_params": {"input": "hi"},
        "response": {"output": [{"type": "message", "role": "assistant", "content": "yo"}]},
    }
    bad = {"responses_create_params": {"input": "hi"}, "response": {"output": [{"type": "web_search_call"}]}}
    source = tmp_path / "r.jsonl"
    source.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    out, err = run_command("--input", str(source), "--output", str(tmp_path / "o.jsonl"))
    assert "wrote 1 conversation(s)" in out and "skipped 1" in out
    assert f"skipped {source}, line 2: item 1 (web_search_call): no chat representation" in err


def test_a_bad_line_is_an_error_naming_it(tmp_path):
    source = tmp_path / "r.jsonl"
    source.write_text("{nope\n")
    with pytest.raises(CommandError, match="line 1"):
        run_command("--input", str(source), "--output", str(tmp_path / "o.jsonl"))
    assert list(tmp_path.iterdir()) == [source]  # nothing half-written


@pytest.mark.django_db
def test_it_exports_a_stored_run_s_filtered_successes(tmp_path, user):
    run = make_run(3)
    for t in range(3):
        finish(key(run, t), Rollout.Status.SUCCEEDED, 1.0, output=ANSWER)
    actions.set_label(key(run, 1), actions.find_label("good", team_id=run.team_id), True, user)
    actions.correct_reward(key(run, 1), 0.5, "half right", user)
    out, _ = run_command(
        "--run",
        str(run.pk),
        "--filter",
        "label=good",
        "--metadata",
        "--reward-source",
        "corrected",
        "--output",
        str(tmp_path / "o.jsonl"),
    )
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["metadata"]["task_index"] for r in rows] == [1] and rows[0]["metadata"]["reward"] == 0.5
    with pytest.raises(CommandError, match="status"):
        run_command("--run", str(run.pk), "--filter", "status=bogus", "--output", str(tmp_path / "o.jsonl"))
    with pytest.raises(CommandError, match="no run #999"):
        run_command("--run", "999", "--output", str(tmp_path / "o.jsonl"))


def test_an_existing_output_is_refused_without_overwrite(tmp_path):
    source = tmp_path / "r.jsonl"
    source.write_text(
        json.dumps(
            {
                "responses_create_params": {"input": "hi"},
                "response": {"output": [{"type": "message", "role": "assistant", "content": "yo"}]},
            }
        )
        + "\n"
    )
    (tmp_path / "o.jsonl").write_text("keep me")
    with pytest.raises(CommandError, match="already exists.*--overwrite"):
        run_command("--input", str(source), "--output", str(tmp_path / "o.jsonl"))
    assert (tmp_path / "o.jsonl").read_text() == "keep me"
    out, _ = run_command("--input", str(source), "--output", str(tmp_path / "o.jsonl"), "--overwrite")
    assert (
        "wrote 1 conversation(s)" in out
        and json.loads((tmp_path / "o.jsonl").read_text())["messages"][-1]["content"] == "yo"
    )


def test_the_input_file_is_never_the_output_even_with_overwrite(tmp_path):
    # It was: the rows were read while their SFT conversion replaced the file, and the input was gone.
    source = tmp_path / "rollouts.jsonl"
    text = json.dumps({"responses_create_params": {"input": "hi"}, "response": {"output": []}}) + "\n"
    source.write_text(text)
    for more in ([], ["--overwrite"]):
        with pytest.raises(CommandError, match="--output is the --input file"):
            run_command("--input", str(source), "--output", str(tmp_path / "." / "rollouts.jsonl"), *more)
    assert source.read_text() == text


@pytest.mark.django_db
def test_an_unknown_filter_name_is_refused_not_ignored(tmp_path):
    run = make_run(1)
    with pytest.raises(CommandError, match="unknown filter 'lable'"):
        run_command("--run", str(run.pk), "--filter", "lable=good", "--output", str(tmp_path / "o.jsonl"))
    assert not (tmp_path / "o.jsonl").exists()
