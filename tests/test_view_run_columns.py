"""The run table's chosen columns on NeMo Gym's real recordings: task and verify fields discovered
from the run's rows, chosen in the querystring (``?cols=``), sorted (``?sort=-verify.x``) and
filtered (numbers by range, strings by value) in SQL, the prompt and final-answer previews
(escaped), and the same filter on the filtered download."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils.html import escape

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout, Task
from rollouts.review import columns


def _import(shared_data, name):
    with (shared_data / name / "example_rollouts.jsonl").open("rb") as fh:
        return import_rollouts(fh, source=f"{name}/example_rollouts.jsonl").run


def _rows(shared_data, name):
    lines = (shared_data / name / "example_rollouts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _table(client, run, query: str) -> str:
    response = client.get(reverse("run", args=[run.pk]) + "?" + query)
    assert response.status_code == 200
    html = response.content.decode()
    start = html.index('id="rollout-table"')
    return html[start:]


def _keys(table_html: str) -> list[int]:
    """The task indices of the table's rows, in order."""
    return [int(t) for t, _r in re.findall(r'class="rollout-link mono" href="[^"]*">(\d+):(\d+)<', table_html)]


@pytest.mark.django_db
def test_the_fields_of_a_run_are_discovered_with_their_types(shared_data):
    run = _import(shared_data, "tau2")
    found = {f.name: f.type for f in columns.discover(Rollout.objects.filter(run=run), imported=True)}
    assert found["verify.config.domain"] == "string"
    assert found["verify.result.duration"] == "number"
    assert found["verify.seed"] == "number"
    assert "verify.response" not in found and "verify.responses_create_params.model" not in found
    assert not any(name.startswith("verify._ng_") for name in found)


@pytest.mark.django_db
def test_chosen_columns_show_the_fields_and_stay_in_the_links(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    html = _table(signed_in, run, "cols=verify.config.domain,verify.result.duration")
    assert "verify.config.domain" in html and "verify.result.duration" in html
    for domain in ("retail", "telecom", "airline"):
        assert f">{domain}</td>" in html
    # sort links and the rollout links keep the chosen columns
    assert "cols=verify.config.domain%2Cverify.result.duration" in html
    page = signed_in.get(reverse("run", args=[run.pk]) + "?cols=verify.config.domain").content.decode()
    assert 'value="verify.config.domain" checked' in page  # the chooser shows the choice
    assert 'value="verify.result.duration"' in page  # and offers the other fields


@pytest.mark.django_db
def test_sorting_on_a_number_field_orders_the_rows_by_it(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rows = _rows(shared_data, "tau2")
    expected = [r["_ng_task_index"] for r in sorted(rows, key=lambda r: -r["result"]["duration"])]
    html = _table(signed_in, run, "cols=verify.result.duration&sort=-verify.result.duration")
    assert _keys(html) == expected
    html = _table(signed_in, run, "cols=verify.result.duration&sort=verify.result.duration")
    assert _keys(html) == expected[::-1]


@pytest.mark.django_db
def test_a_number_range_filter_keeps_exactly_the_rows_in_range(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rows = _rows(shared_data, "tau2")
    durations = sorted(r["result"]["duration"] for r in rows)
    low, high = durations[1], durations[3]
    expected = sorted(r["_ng_task_index"] for r in rows if low <= r["result"]["duration"] <= high)
    assert 0 < len(expected) < len(rows)
    html = _table(signed_in, run, f"f.verify.result.duration={low!r}..{high!r}")
    assert sorted(_keys(html)) == expected
    only_low = _table(signed_in, run, f"f.verify.result.duration=..{low!r}")
    assert sorted(_keys(only_low)) == sorted(r["_ng_task_index"] for r in rows if r["result"]["duration"] <= low)


@pytest.mark.django_db
def test_a_string_filter_keeps_the_rows_with_that_value(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rows = _rows(shared_data, "tau2")
    expected = sorted(r["_ng_task_index"] for r in rows if r["config"]["domain"] == "telecom")
    html = _table(signed_in, run, "f.verify.config.domain=telecom")
    assert sorted(_keys(html)) == expected
    mini = _import(shared_data, "mini_swe_agent_2")
    html = _table(signed_in, mini, "f.verify.instance_id=sympy__sympy-20916")
    assert _keys(html) == [3]


@pytest.mark.django_db
def test_previews_and_field_values_are_escaped(signed_in, shared_data):
    run = _import(shared_data, "mini_swe_agent_2")
    payload = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    task = Task.objects.get(run=run, task_index=0)
    row = json.loads(task.row_json)
    row["category"] = payload
    first_user = next(i for i in row["responses_create_params"]["input"] if i.get("role") == "user")
    first_user["content"] = payload + " fix the bug"
    task.row_json = json.dumps(row)
    task.save()
    html = _table(signed_in, run, "cols=task.category,prompt,answer&f.task.category=" + payload.replace("&", "%26"))
    assert _keys(html) == [0]
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    rollout = Rollout.objects.get(run=run, task_index=0)
    verify = json.loads(rollout.verify_json)
    last = [i for i in verify["response"]["output"] if i.get("type") == "message" and i.get("role") == "assistant"]
    if last:  # the final-answer preview: the last assistant message's first characters
        text = " ".join(c.get("text", "") for c in last[-1]["content"] if isinstance(c, dict))
        answer = " ".join(re.sub(r"<think>.*?</think>", " ", text, flags=re.DOTALL).split())
        assert escape(answer[:40]) in html


@pytest.mark.django_db
def test_a_filtered_export_has_the_rows_of_the_filtered_table(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    query = "f.verify.config.domain=telecom&sort=-verify.result.duration&cols=verify.result.duration"
    table_keys = sorted(_keys(_table(signed_in, run, query)))
    response = signed_in.get(reverse("run_export", args=[run.pk, "rollouts"]) + "?" + query)
    assert response.status_code == 200
    exported = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines() if line]
    assert sorted(r["_ng_task_index"] for r in exported) == table_keys
    assert len(table_keys) == 3
    assert "verify.config.domain-telecom" in response["Content-Disposition"]


@pytest.mark.django_db
def test_the_api_list_reads_the_same_field_filter_and_sort(client, user, shared_data):
    from rollouts.tokens import create_token

    run = _import(shared_data, "tau2")
    rows = _rows(shared_data, "tau2")
    _row, token = create_token(user, "t")
    response = client.get(
        f"/api/v1/runs/{run.pk}/rollouts?f.verify.config.domain=telecom&sort=verify.result.duration",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 200, response.content
    telecom = [r for r in rows if r["config"]["domain"] == "telecom"]
    expected = [r["_ng_task_index"] for r in sorted(telecom, key=lambda r: r["result"]["duration"])]
    assert [r["task_index"] for r in response.json()["items"]] == expected


@pytest.mark.django_db
def test_previous_next_walk_the_list_sorted_by_a_field(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rows = _rows(shared_data, "tau2")
    order = [r["_ng_task_index"] for r in sorted(rows, key=lambda r: r["result"]["duration"])]
    middle = Rollout.objects.get(run=run, task_index=order[2])
    response = signed_in.get(reverse("rollout", args=[run.pk, middle.pk]) + "?sort=verify.result.duration")
    assert response.status_code == 200
    nav = response.context["nav"]
    ids = {r.task_index: r.pk for r in Rollout.objects.filter(run=run)}
    assert (nav["prev_id"], nav["next_id"], nav["position"]) == (ids[order[1]], ids[order[3]], 3)


def test_number_ranges_read_as_written():
    assert columns.parse_range("0.5..1") == (0.5, 1.0)
    assert columns.parse_range("..1") == (None, 1.0)
    assert columns.parse_range("2..") == (2.0, None)
    assert columns.parse_range("true") == (1.0, 1.0)
    assert columns.parse_range("math") is None and columns.parse_range("..") is None
    assert columns.parse_columns(["verify.a,task.b", "verify.a", "bad name!", "prompt"]) == [
        "verify.a",
        "task.b",
        "prompt",
    ]


@pytest.mark.django_db
def test_a_nul_in_a_reply_shows_as_the_replacement_character_and_breaks_no_other_column(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    rollout = Rollout.objects.filter(run=run).exclude(verify_json="").order_by("task_index").first()
    reply = json.loads(rollout.verify_json)
    reply["judge_note"], reply["judge_link"] = "nul\x00inside", "plain"
    reply.setdefault("response", {}).setdefault("output", []).append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "FINAL with \x00 NUL"}]}
    )
    Rollout.objects.filter(pk=rollout.pk).update(verify_json=json.dumps(reply))
    for query in ("cols=verify.judge_note", "cols=verify.judge_link", "cols=prompt", "cols=answer"):
        assert _keys(_table(signed_in, run, query)) == sorted(r.task_index for r in Rollout.objects.filter(run=run))
    html = _table(signed_in, run, "cols=verify.judge_note,verify.judge_link&f.verify.judge_note=nul%EF%BF%BDinside")
    assert _keys(html) == [rollout.task_index]
    assert "nul\ufffdinside" in html and "plain" in html and "\x00" not in html
    assert _keys(_table(signed_in, run, "cols=verify.judge_note&f.verify.judge_note=nul")) == []


@pytest.mark.django_db
def test_a_field_filter_holding_a_nul_is_the_form_s_error_never_a_server_error(signed_in, shared_data):
    run = _import(shared_data, "tau2")
    response = signed_in.get(reverse("run", args=[run.pk]) + "?f.task.expected_count=%00")
    assert response.status_code == 200
    assert "f.task.expected_count: Null characters are not allowed." in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value, words",
    [
        ("1..0", "the low end 1 is above the high end 0"),
        ("..", "a range needs at least one bound"),
        ("nan", "Enter a finite number"),
        ("inf", "Enter a finite number"),
        ("1e400", "Enter a finite number"),
    ],
)
def test_an_impossible_field_range_is_a_form_error_on_the_page_and_a_400_naming_it_in_the_api(
    signed_in, client, user, shared_data, value, words
):
    from urllib.parse import quote

    from rollouts.tokens import create_token

    run = _import(shared_data, "tau2")
    url = reverse("run", args=[run.pk]) + f"?f.verify.result.duration={quote(value)}&cols=verify.result.duration"
    for headers in ({}, {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "rollouts"}):  # the page, the htmx partial
        html = signed_in.get(url, **headers).content.decode()
        assert f"verify.result.duration: {words}" in html
        assert _keys(html) == [] and "No rows shown: a filter above is invalid" in html
        assert 'id="filtered-downloads"' not in html
        assert f'name="f.verify.result.duration" value="{escape(value)}"' in html  # the box keeps what was typed
    _row, token = create_token(user, "t")
    response = client.get(
        f"/api/v1/runs/{run.pk}/rollouts?f.verify.result.duration={quote(value)}", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"f.verify.result.duration: {words}")


def test_an_impossible_reward_range_is_a_400_naming_the_parameter_in_the_api(client, user, db):
    from rollouts.tokens import create_token

    from .run_factories import make_run

    run = make_run()
    _row, token = create_token(user, "t")
    response = client.get(
        f"/api/v1/runs/{run.pk}/rollouts?reward_min=1&reward_max=0", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 400 and response.json()["detail"] == "reward_min: above reward_max (0)"


@pytest.mark.django_db
@pytest.mark.parametrize("headers", [{}, {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "rollouts"}])
def test_an_impossible_reward_range_shows_its_error_and_no_rows_like_an_invalid_field_filter(
    signed_in, shared_data, headers
):
    run = _import(shared_data, "tau2")
    assert _keys(_table(signed_in, run, "reward_max=1")) != []
    html = signed_in.get(reverse("run", args=[run.pk]) + "?reward_min=1&reward_max=0", **headers).content.decode()
    assert "reward_min: above reward_max (0)" in html
    assert _keys(html) == [] and "No rows shown: a filter above is invalid" in html


def test_a_quoted_field_filter_is_always_text():
    assert columns.literal_text('"nan"') == "nan" and columns.literal_text(' "1..0" ') == "1..0"
    assert columns.literal_text('""') == "" and columns.literal_text('" a "') == " a "
    assert columns.literal_text('""x""') == '"x"'
    assert columns.literal_text("nan") is None and columns.literal_text('"') is None
    assert columns.range_problem('"nan"') is None and columns.range_problem('"1..0"') is None


@pytest.mark.django_db
@pytest.mark.parametrize("kept", [False, True], ids=["json", "kept"])
def test_a_text_field_filters_by_any_literal_in_double_quotes_on_both_readings(
    signed_in, shared_data, kept, monkeypatch
):
    from urllib.parse import quote

    from rollouts.review import query

    if not kept:
        monkeypatch.setattr(query.RolloutFilterForm, "use_kept_values", lambda self, run: None)
    run = _import(shared_data, "tau2")
    rows = list(Rollout.objects.filter(run=run).exclude(verify_json="").order_by("task_index"))
    values = {0: "nan", 1: "1..0", 2: "1", 3: 1, 4: ""}
    for row, value in zip(rows, values.values()):
        reply = json.loads(row.verify_json)
        reply["code"] = value
        Rollout.objects.filter(pk=row.pk).update(verify_json=json.dumps(reply))
    task = {i: rows[i].task_index for i in values}
    for typed, expected in [
        ('"nan"', [task[0]]),
        ('"1..0"', [task[1]]),
        ('"1"', [task[2]]),  # the string "1", not the number 1
        ("1", [task[3]]),  # unquoted: the number
        ('""', [task[4]]),
    ]:
        html = _table(signed_in, run, f"cols=verify.code&f.verify.code={quote(typed)}")
        assert sorted(_keys(html)) == expected, typed
        assert "errorlist" not in html
    html = signed_in.get(reverse("run", args=[run.pk]) + "?f.verify.code=" + quote('"nan"')).content.decode()
    assert "verify.code “nan”" in html  # the description next to the downloads
    page = signed_in.get(reverse("run", args=[run.pk]) + "?cols=verify.code").content.decode()
    assert "in double quotes is always a text" in page  # the form's help
