"""The verdict panel at the top of the trajectory page: what the env added to its verify reply
(never the echoed task row), scalars inline, judge texts rendered through the one sanitiser, trees
for lists and objects, tables for rubrics and judges, links from fields to the items they name.
On NeMo Gym's real recordings and on verify replies shaped like NeMo Gym's judge and rubric envs."""

from __future__ import annotations

import json
import re

import pytest

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout
from rollouts.web.verdict import judgement_rows, verdict_view
from tests.test_view_rollout_detail import TASK_ROW, call, make_rollout, make_run, make_task, msg, out, page


def _import(shared_data, name):
    with (shared_data / name / "example_rollouts.jsonl").open("rb") as fh:
        return import_rollouts(fh, source="example_rollouts.jsonl").run


def _panel(html: str) -> str:
    """The verdict panel's markup; fails when the page has none."""
    start = html.index('id="traj-verdict"')
    return html[start : html.index("</section>", start)]


def _text(markup: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", markup))


def _verify(**fields):
    return {
        "responses_create_params": TASK_ROW["responses_create_params"],
        "response": {"output": []},
        "reward": 0.0,
        **fields,
    }


# -- placement ----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_panel_comes_before_the_trajectory_and_right_after_the_reward(signed_in, shared_data):
    run = _import(shared_data, "mini_swe_agent_2")
    rollout = run.rollouts.order_by("task_index").first()
    html = page(signed_in, rollout)
    assert html.index('id="traj-summary"') < html.index('id="traj-verdict"') < html.index('id="timeline"')
    assert html.index('id="traj-verdict"') < html.index('id="verify"')  # the full panel stays at the bottom


# -- what is shown and what is not ----------------------------------------------------------------
@pytest.mark.django_db
def test_swe_bench_resolved_and_the_patch_are_on_the_panel_with_the_patch_as_a_diff(signed_in, shared_data):
    run = _import(shared_data, "mini_swe_agent_2")
    rollouts = list(run.rollouts.order_by("task_index"))
    assert rollouts
    for rollout in rollouts:
        data = json.loads(rollout.verify_json)
        report = data["metadata"]["eval_report"]
        instance = next(iter(report))
        panel = _panel(page(signed_in, rollout))
        resolved = "true" if report[instance]["resolved"] else "false"
        assert f'<dt>metadata.eval_report.{instance}.resolved</dt><dd class="v-{resolved}">{resolved}</dd>' in panel
        if data["metadata"]["model_patch"]:
            assert '<span class="verdict-name">metadata.model_patch</span>' in panel
            assert '<pre class="diff">' in panel
        else:  # an empty patch explains a 0: shown, not hidden
            assert "<dt>metadata.model_patch</dt><dd>&quot;&quot;</dd>" in panel
        assert "responses_create_params" not in panel and "agent_ref" not in panel and "_ng_task_index" not in panel


@pytest.mark.django_db
def test_the_tau2_judgement_inside_result_is_opened_and_its_null_values_are_counted(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rollout = run.rollouts.order_by("task_index").first()
    data = json.loads(rollout.verify_json)
    panel = _panel(page(signed_in, rollout))
    assert '<dt>result.reward_info.db_check.db_match</dt><dd class="v-true">true</dd>' in panel
    assert f"<dt>result.termination_reason</dt><dd>{data['result']['termination_reason']}</dd>" in panel
    assert "<dt>result.reward_info.nl_assertions</dt>" not in panel  # null inside an opened object
    assert re.search(r"\d+ null values inside these fields not shown", panel)
    # the 12-message copy of the conversation is a tree that starts folded
    assert re.search(r'<details class="verdict-tree"><summary><span class="verdict-name">result.messages</span>', panel)


@pytest.mark.django_db
def test_the_multi_step_verifier_fields_are_scalars_beside_the_reward(signed_in, shared_data):
    run = _import(shared_data, "example_multi_step")
    rollouts = list(run.rollouts.order_by("task_index"))
    assert rollouts
    for rollout in rollouts:
        data = json.loads(rollout.verify_json)
        panel = _panel(page(signed_in, rollout))
        for key in ("accuracy", "set_overlap", "original_term_minefield_hit", "order_instruction_following_failure"):
            assert f"<dt>{key}</dt>" in panel
        assert f"<dt>parsed_synonym_values</dt><dd>{json.dumps(data['parsed_synonym_values'])}</dd>" in panel
        assert '<div class="verdict-block' not in panel  # nothing but scalars: no block


@pytest.mark.django_db
def test_a_reply_that_only_echoes_the_request_has_no_panel(signed_in, shared_data):
    run = _import(shared_data, "workplace_assistant")
    rollout = run.rollouts.order_by("task_index").first()
    html = page(signed_in, rollout)
    assert '<div id="traj-verdict"></div>' in html and 'class="card traj-verdict"' not in html


@pytest.mark.django_db
def test_fields_of_a_collected_run_that_echo_the_task_row_are_left_out(signed_in):
    run = make_run()
    task = make_task(run, row={**TASK_ROW, "instance_id": "django__django-1", "expected_count": 3})
    verify = _verify(
        instance_id="django__django-1", expected_count=3, resolved=False, failure="tests did not run: timeout"
    )
    rollout = make_rollout(run, task, reward=0.0, verify=verify)
    panel = _panel(page(signed_in, rollout))
    assert '<dt>resolved</dt><dd class="v-false">false</dd>' in panel
    assert "<dt>failure</dt><dd>tests did not run: timeout</dd>" in panel
    assert "instance_id" not in panel and "expected_count" not in panel
    assert "Imported row" not in panel


@pytest.mark.django_db
def test_a_field_that_differs_from_the_task_rows_value_is_the_envs_and_is_shown(signed_in):
    run = make_run()
    task = make_task(run, row={**TASK_ROW, "expected_count": 3})
    rollout = make_rollout(run, task, reward=0.0, verify=_verify(expected_count=4))
    assert "<dt>expected_count</dt><dd>4</dd>" in _panel(page(signed_in, rollout))


# -- judges and rubrics ---------------------------------------------------------------------------
RUBRIC = [  # NeMo Gym's inverse_if RubricEvaluation
    {
        "criterion_id": "c1",
        "criteria": "Answers in French",
        "judge_prompt": "…",
        "judge_response": "PASS",
        "verdict": "PASS",
        "explanation": "The reply is **in French** throughout.",
        "score": 1.0,
    },
    {
        "criterion_id": "c2",
        "criteria": "Under 50 words",
        "judge_prompt": "…",
        "judge_response": "FAIL",
        "verdict": "FAIL",
        "explanation": "It has 73 words.",
        "score": 0.0,
    },
]


@pytest.mark.django_db
def test_a_rubric_is_a_table_of_criteria_verdicts_scores_and_rendered_reasons(signed_in):
    run = make_run()
    rollout = make_rollout(
        run, make_task(run), reward=0.5, verify=_verify(rubric_evaluations=RUBRIC, num_passed=1, num_total=2)
    )
    panel = _panel(page(signed_in, rollout))
    assert "<dt>num_passed</dt><dd>1</dd>" in panel
    table = panel[panel.index('<table class="verdict-table">') :]
    assert "<th>item</th><th>verdict</th><th>score</th><th>reason</th>" in table
    assert '<td>Answers in French</td><td class="verdict-v">PASS</td><td class="num">1.0</td>' in table
    assert "<strong>in French</strong>" in table  # the reason through Markdown
    assert '<td class="verdict-v">FAIL</td><td class="num">0.0</td>' in table and "It has 73 words." in table
    assert "2 judgements" in panel


@pytest.mark.django_db
def test_a_judge_evaluation_shows_the_verdict_label_and_the_judges_own_text(signed_in):
    judge = {  # NeMo Gym's equivalence_llm_judge JudgeEvaluation: the judge's call and reply
        "responses_create_params": {"input": [{"role": "user", "content": "Are these equal?"}]},
        "response": {
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Both say *42*. [[A=B]]"}],
                }
            ]
        },
        "verdict_label": "[[A=B]]",
    }
    run = make_run()
    rollout = make_rollout(run, make_task(run), verify=_verify(expected_answer="42", judge_evaluations=[judge]))
    panel = _panel(page(signed_in, rollout))
    assert '<td class="verdict-v">[[A=B]]</td>' in panel and "Both say <em>42</em>. [[A=B]]" in panel


@pytest.mark.django_db
def test_a_top_level_verdict_and_judge_output_are_one_judge_table(signed_in):
    run = make_run()  # NeMo Gym's simpleqa: verdict and judge_output at the top of the reply
    verify = _verify(
        extracted_answer="Paris", verdict="CORRECT", judge_output="## Grade\nThe answer matches.", is_correct=1.0
    )
    rollout = make_rollout(run, make_task(run), reward=1.0, verify=verify)
    panel = _panel(page(signed_in, rollout))
    assert '<span class="verdict-name">judge</span>' in panel
    assert '<td class="verdict-v">CORRECT</td>' in panel and "<h2>Grade</h2>" in panel
    assert "<dt>verdict</dt>" not in panel and "<dt>extracted_answer</dt><dd>Paris</dd>" in panel


def test_objects_without_a_reason_or_a_verdict_are_not_judgements():
    assert judgement_rows([{"score": 1.0}, {"score": 0.0}]) is None
    assert judgement_rows({"reason": "no verdict here"}) is None
    assert judgement_rows([{"score": 1, "reason": "ok"}, {"other": 2}]) is None
    assert judgement_rows([]) is None
    rows = judgement_rows([{"name": "a", "passed": True, "reason": "fine"}])
    assert rows and rows[0]["name"] == "a" and rows[0]["verdict"] == "true" and rows[0]["reason"] == "fine"


# -- safety --------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_env_text_on_the_panel_is_escaped_or_sanitised(signed_in):
    evil = "<img src=x onerror=alert(1)><script>alert(2)</script>"
    run = make_run()
    verify = _verify(
        **{
            f"note{evil}": evil,
            "explanation_long": f"line one\n{evil}\n[x](javascript:alert(3))",
            "rubric": [{"criteria": evil, "score": 0, "reason": evil}],
        }
    )
    rollout = make_rollout(run, make_task(run), reward=0.0, verify=verify)
    panel = _panel(page(signed_in, rollout))
    assert (
        "<script" not in panel
        and "<img" not in panel
        and "onerror=alert" not in panel.replace("&lt;img src=x onerror=alert", "")
    )
    assert "javascript:" not in panel.replace("(javascript:alert(3))", "")
    assert "&lt;script&gt;" in panel


# -- links to items -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_fields_naming_a_call_id_an_item_index_or_quoting_an_item_link_to_it(signed_in):
    run = make_run()
    items = [
        (0, msg("Let me check the weather in the capital city."), {}),
        (0, call("call_weather_1", "get_weather", '{"city": "Paris"}'), {}),
        (1, out("call_weather_1", "sunny, 21 degrees in Paris today"), {"origin": "gym", "tool_status": 200}),
        (1, msg("It is sunny, 21 degrees in Paris today."), {}),
    ]
    verify = _verify(
        failed_call="call_weather_1",
        message_index=3,
        judge_notes='The model wrote "sunny, 21 degrees in Paris today" which matches the tool.',
    )
    rollout = make_rollout(run, make_task(run), calls=[{}, {}], items=items, verify=verify)
    html = page(signed_in, rollout)
    panel = _panel(html)
    seqs = {m: n for m, n in re.findall(r'href="#item-(\d+)"[^>]*>→ #\d+ ([^<]+)</a>', panel)}
    assert seqs.get("1") == "function_call get_weather"  # failed_call by call_id
    assert "3" in seqs  # message_index 3
    notes = panel[panel.index("<dt>judge_notes</dt>") :]
    notes = notes[: notes.index("</dd>")]
    assert re.findall(r'href="#item-(\d+)"', notes) == ["2"]  # the quotation: the first item holding it
    links = re.findall(r'href="#item-(\d+)"', panel)
    assert links
    for seq in links:
        assert f'id="item-{seq}"' in html  # every link lands on an anchor of the page


def test_the_panel_skips_nothing_the_env_added_and_needs_no_database():
    view = verdict_view(
        {"reward": 1.0, "response": {}, "ok": True, "_ng_task_index": 3},
        {"ok": True},
        imported=True,
        items=[],
        max_chars=1000,
    )
    assert view and [e["name"] for e in view["scalars"]] == ["ok"] and view["imported"]
    assert verdict_view({"reward": 1.0, "ok": True}, {"ok": True}, imported=False, items=[], max_chars=1000) is None
    assert verdict_view("not an object", {}, imported=False, items=[], max_chars=1000) is None


@pytest.mark.django_db
def test_a_failed_attempt_has_no_panel(signed_in):
    run = make_run()
    rollout = make_rollout(run, make_task(run), status=Rollout.Status.FAILED, error="boom")
    assert 'class="card traj-verdict"' not in page(signed_in, rollout)
