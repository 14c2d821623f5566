"""Every SFT row gymweb writes is a valid chat-format training example: roles alternate, every tool
call is answered by its tool message right after it, ``reasoning=drop`` leaves none of the
``<think>`` spans the trajectory page folds as thinking; rows that cannot be made valid are left out
and counted by reason in the download's headers, on the run page and by ``export_sft``. Checked on
every trace in ../shared/data/nemo_gym and on the faults seen in real recordings (a SWE-bench row
with only the user's message, a reply of 53 reasoning blocks interleaved with 53 tool calls)."""

from __future__ import annotations

import json
from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.review.sft import REASONING_MODES, NotConvertible, conversation, left_out_text
from rollouts.thinking import split_thinking
from rollouts.tokens import create_token


def every_real_row(shared_data):
    """``(where, row)`` of every result row of every rollouts file under the shared data."""
    files = sorted(
        p
        for p in shared_data.rglob("*.jsonl")
        if "rollouts" in p.name and not any(w in p.name for w in ("failures", "materialized", "verdicts", "profiling"))
    )
    assert len(files) >= 10, files
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            row = json.loads(line) if line.strip() else None
            if isinstance(row, dict) and "reward" in row and "response" in row:
                yield f"{path.relative_to(shared_data)}:{n}", row


def assert_training_example(conv: dict, where: str) -> None:
    """A valid chat example: one system message at most and first, then user and assistant turns
    alternating, each assistant message's tool calls answered by the tool messages right after
    it (also at the end), at least one assistant turn, nothing empty."""
    messages = conv["messages"]
    assert any(m["role"] == "assistant" for m in messages), where
    open_calls: set = set()
    last_turn = ""
    for i, m in enumerate(messages):
        role = m["role"]
        assert role in ("system", "user", "assistant", "tool"), (where, i)
        assert role != "system" or i == 0, (where, i, "a system message after the start")
        if role == "tool":
            assert m["tool_call_id"] in open_calls, (where, i, "a tool message that answers no open call")
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, (where, i, f"calls {open_calls} unanswered before the next turn")
        if role in ("user", "assistant"):
            assert role != last_turn or (role == "assistant" and messages[i - 1]["role"] == "tool"), (
                where,
                i,
                f"two {role} turns in a row",
            )
            last_turn = role
        if role == "assistant":
            ids = [c["id"] for c in m.get("tool_calls") or []]
            assert len(ids) == len(set(ids)), (where, i)
            assert m.get("content") or ids or m.get("reasoning_content") or m.get("refusal"), (
                where,
                i,
                "an empty assistant turn",
            )
            open_calls = set(ids)
    assert not open_calls, (where, f"calls {open_calls} never answered")
    assert messages[-1]["role"] in ("assistant", "tool"), (where, "ends on a user turn")


def test_every_real_trace_is_a_valid_training_example_in_every_reasoning_mode(shared_data):
    converted = Counter()
    for where, row in every_real_row(shared_data):
        for mode in REASONING_MODES:
            assert_training_example(conversation(row, reasoning=mode), f"{where} ({mode})")
            converted[mode] += 1
    assert converted["drop"] >= 200 and len(set(converted.values())) == 1  # every row, every mode


def test_reasoning_drop_leaves_no_thinking_the_page_folds_and_keep_moves_it(shared_data):
    rows = [(w, r) for w, r in every_real_row(shared_data) if "mini_swe_agent_2" in w]
    assert len(rows) == 5
    for where, row in rows:
        texts = [
            p["text"]
            for it in row["response"]["output"]
            if it["type"] == "message" and it["role"] == "assistant"
            for p in it["content"]
        ]
        assert any(thinking for t in texts for thinking, _ in split_thinking(t)), where  # the page folds some
        dropped = conversation(row, reasoning="drop")
        assert dropped["messages"][2:], where
        for m in dropped["messages"][2:]:
            content = m.get("content") or ""
            assert "<think>" not in content and "</think>" not in content, where
            assert not any(thinking for thinking, _ in split_thinking(content)), where
            assert "reasoning_content" not in m
        kept = conversation(row, reasoning="keep")
        thought = "\n".join(m.get("reasoning_content", "") for m in kept["messages"])
        first = next(s for t in texts for thinking, s in split_thinking(t) if thinking)
        assert first.strip() in thought, where


def _swe_row(output):
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Fix the bug in astropy."}]},
        "response": {"output": output},
        "reward": 0.0,
        "instance_id": "astropy__astropy-12907",
    }


def test_a_swe_bench_row_with_only_the_users_message_is_left_out_as_no_assistant_turn():
    with pytest.raises(NotConvertible) as exc:
        conversation(_swe_row([]))
    assert exc.value.reason == "no assistant turn"


def _reasoning(n):
    return {
        "type": "reasoning",
        "id": f"rs_{n}",
        "summary": [{"type": "summary_text", "text": f"step {n}: look at file {n}"}],
    }


def _call(n):
    return {
        "type": "function_call",
        "call_id": f"call_{n}",
        "name": "bash",
        "arguments": json.dumps({"command": f"cat f{n}.py"}),
    }


def test_53_reasoning_blocks_interleaved_with_53_answered_calls_become_53_turns_each_answered():
    output = []
    for n in range(53):
        output += [
            _reasoning(n),
            _call(n),
            {"type": "function_call_output", "call_id": f"call_{n}", "output": f"contents {n}"},
        ]
    output.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed."}]})
    for mode in REASONING_MODES:
        conv = conversation(_swe_row(output), reasoning=mode)
        assert_training_example(conv, mode)
        assert [m["role"] for m in conv["messages"]] == ["user"] + ["assistant", "tool"] * 53 + ["assistant"]


def test_53_calls_never_answered_are_dropped_and_a_row_left_with_nothing_is_left_out():
    output = [x for n in range(53) for x in (_reasoning(n), _call(n))]
    with pytest.raises(NotConvertible) as exc:
        conversation(_swe_row(output), reasoning="drop")
    assert exc.value.reason == "no assistant turn"
    kept = conversation(_swe_row(output), reasoning="keep")  # the reasoning alone is a turn
    assert_training_example(kept, "keep")
    assert [m["role"] for m in kept["messages"]] == ["user", "assistant"] and "tool_calls" not in kept["messages"][1]


def test_a_tool_output_after_another_turn_is_left_out_as_a_tool_output_without_its_call():
    output = [
        _call(1),
        {"type": "message", "role": "user", "content": "hurry"},
        {"type": "function_call_output", "call_id": "call_1", "output": "x"},
        {"type": "message", "role": "assistant", "content": "done"},
    ]
    with pytest.raises(NotConvertible) as exc:
        conversation(_swe_row(output))
    assert exc.value.reason == "a tool output without its call"


def test_left_out_text_counts_each_reason():
    assert (
        left_out_text(Counter({"no assistant turn": 3, "a tool output without its call": 1}))
        == "3 rollouts left out: no assistant turn; 1 rollout left out: a tool output without its call"
    )
    assert left_out_text(Counter()) == ""


# -- the download, the page and the command ------------------------------------------------------
@pytest.fixture
def mixed_file(shared_data, tmp_path):
    """The five real mini_swe_agent_2 rows plus three SWE-bench rows with only the user's message."""
    lines = (shared_data / "mini_swe_agent_2" / "example_rollouts.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    for n in range(3):
        empty = dict(rows[0], response=dict(rows[0]["response"], output=[]), _ng_task_index=10 + n, _ng_rollout_index=0)
        rows.append(empty)
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.django_db
def test_the_download_writes_only_valid_rows_and_its_headers_count_the_rest(signed_in, user, mixed_file):
    with mixed_file.open("rb") as fh:
        run = import_rollouts(fh, source="rollouts.jsonl").run
    response = signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?reasoning=drop")
    assert response.status_code == 200
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert len(lines) == 5
    for n, line in enumerate(lines):
        assert_training_example(json.loads(line), f"line {n}")
    assert response["X-Gymweb-Rows"] == "5" and response["X-Gymweb-Left-Out"] == "3"
    assert response["X-Gymweb-Left-Out-Reasons"] == "3 rollouts left out: no assistant turn"
    api = signed_in.get(
        f"/api/v1/runs/{run.pk}/sft.jsonl?reasoning=drop", HTTP_AUTHORIZATION=f"Bearer {create_token(user, 'tests')[1]}"
    )
    assert api.status_code == 200 and api["X-Gymweb-Left-Out"] == "3"
    assert len(b"".join(api.streaming_content).decode().splitlines()) == 5


@pytest.mark.django_db
def test_the_run_page_says_how_many_rollouts_the_sft_export_leaves_out_and_why(signed_in, mixed_file):
    with mixed_file.open("rb") as fh:
        run = import_rollouts(fh, source="rollouts.jsonl").run
    page = signed_in.get(reverse("run", args=[run.pk])).content.decode()
    check_url = reverse("run_export_sft_check", args=[run.pk])
    assert f'hx-get="{check_url}"' in page and 'hx-include="#curated-sft"' in page
    fragment = signed_in.get(check_url + "?reasoning=drop", headers={"HX-Request": "true"}).content.decode()
    assert "5 rows to write" in fragment and "3 rollouts left out: no assistant turn" in fragment


def test_export_sft_says_how_many_rows_it_left_out_and_why(mixed_file, tmp_path):
    out, err = StringIO(), StringIO()
    call_command(
        "export_sft",
        "--input",
        str(mixed_file),
        "--output",
        str(tmp_path / "sft.jsonl"),
        "--reasoning",
        "drop",
        stdout=out,
        stderr=err,
    )
    assert "wrote 5 conversation(s)" in out.getvalue() and "3 rollouts left out: no assistant turn" in out.getvalue()
    assert err.getvalue().count("the conversation has no assistant turn") == 3
    for n, line in enumerate((tmp_path / "sft.jsonl").read_text().splitlines()):
        assert_training_example(json.loads(line), f"line {n}")
