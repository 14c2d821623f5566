"""Search across a run: the run page filters rollouts by trajectory content (text in any
item, a tool called, a tool output's text, a failure message's text) through the backend's index
(FTS5 trigram on SQLite, pg_trgm on PostgreSQL: the suite runs on both), links each row to the
rollout with ``?q=`` so its hits are highlighted, and exports, file names and the API honour it."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from django.db import connection
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout, TrajectoryItem
from rollouts.search import index, queries
from rollouts.search.text import item_search_text

from .run_factories import finish, key, make_run

S = Rollout.Status


def call(seq, name, arguments, call_id="c1"):
    return TrajectoryItem(
        seq=seq,
        step=0,
        kind="function_call",
        name=name,
        call_id=call_id,
        origin="agent",
        payload={"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id, "id": "fc_1"},
    )


def output(seq, text, call_id="c1"):
    return TrajectoryItem(
        seq=seq,
        step=0,
        kind="function_call_output",
        call_id=call_id,
        origin="gym",
        payload={"type": "function_call_output", "call_id": call_id, "output": text},
    )


def message(seq, text, role="assistant"):
    return TrajectoryItem(
        seq=seq,
        step=0,
        kind="message",
        role=role,
        origin="agent",
        payload={
            "type": "message",
            "role": role,
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        },
    )


def store(rollout, items):
    for item in items:
        item.rollout = rollout
    TrajectoryItem.objects.bulk_create(items)


@pytest.fixture
def run(db):
    """Five rollouts: 0 says hello and runs ls; 1 reads a file whose output holds a NUL; 2 failed
    with a message; 3 writes quotes and FTS operators; 4 has nothing to find."""
    run = make_run(5)
    r0, r1, r2, r3, r4 = (key(run, i) for i in range(5))
    finish(r0, S.SUCCEEDED, 1.0)
    store(
        r0,
        [
            message(0, "Hello World, I will list the files."),
            call(1, "bash", json.dumps({"command": 'ls -la /tmp\necho "done"'})),
            output(2, "total 0\ndrwx tmp"),
        ],
    )
    finish(r1, S.SUCCEEDED, 0.0)
    store(
        r1,
        [
            call(0, "read_file", json.dumps({"path": "notes.txt"})),
            output(1, "header\x00SECRET after the nul"),
            message(2, "The file holds a secret."),
        ],
    )
    finish(r2, S.FAILED, kind="agent_http_error", error="agent returned HTTP 502: Bad Gateway from upstream\x00tail")
    store(r2, [message(0, "thinking about bash")])
    finish(r3, S.SUCCEEDED, 1.0)
    store(r3, [message(0, 'She said "yes AND no" NEAR(this) * ^col: (a OR b) 50% under_score back\\slash')])
    finish(r4, S.SUCCEEDED, 0.5)
    store(r4, [message(0, "nothing here")])
    return run


def keys(client, run, query):
    response = client.get(reverse("run", args=[run.pk]) + "?" + query)
    assert response.status_code == 200, response.content[:500]
    form = response.context["filter"]
    return sorted(r.task_index for r, _ in response.context["rows"]), form


def test_the_index_is_the_backend_s_own(db):
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [index.FTS_TABLE])
            assert "trigram" in cursor.fetchone()[0]
        else:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [index.TRGM_INDEX])
            assert "gin_trgm_ops" in cursor.fetchone()[0]


def test_text_in_a_message_finds_its_rollout_case_insensitively(signed_in, run):
    assert keys(signed_in, run, "text=hello world")[0] == [0]
    assert keys(signed_in, run, "text=HELLO wOrLd")[0] == [0]
    assert keys(signed_in, run, "text=secret")[0] == [1]  # the message and the output


def test_text_in_a_tool_argument_is_found_decoded(signed_in, run):
    assert keys(signed_in, run, "text=" + quote("ls -la /tmp"))[0] == [0]
    # The arguments are JSON text: a quote and a newline inside are found as they read.
    assert keys(signed_in, run, "text=" + quote('echo "done"'))[0] == [0]
    assert keys(signed_in, run, "text=" + quote("/tmp\necho"))[0] == [0]


def test_a_tool_name_called(signed_in, run):
    assert keys(signed_in, run, "tool=bash")[0] == [0]  # 2 only thinks about bash, it calls nothing
    assert keys(signed_in, run, "tool=read_file")[0] == [1]
    assert keys(signed_in, run, "tool=read")[0] == []  # an exact name


def test_a_tool_output_containing_text(signed_in, run):
    assert keys(signed_in, run, "output=drwx")[0] == [0]
    assert keys(signed_in, run, "output=secret")[0] == [1]
    assert keys(signed_in, run, "output=list the files")[0] == []  # in a message, not in an output
    assert keys(signed_in, run, "text=list the files")[0] == [0]


def test_text_after_a_nul_is_found(signed_in, run):
    assert keys(signed_in, run, "output=SECRET after")[0] == [1]
    assert keys(signed_in, run, "text=header")[0] == [1]
    assert keys(signed_in, run, "error=tail")[0] == [2]


def test_a_failure_message(signed_in, run):
    assert keys(signed_in, run, "error=bad gateway")[0] == [2]
    assert keys(signed_in, run, "error=HTTP 502")[0] == [2]
    assert keys(signed_in, run, "error=hello")[0] == []


def test_filters_combine_with_each_other_and_the_others(signed_in, run):
    assert keys(signed_in, run, "text=the&status=succeeded")[0] == [0, 1]
    assert keys(signed_in, run, "text=the&tool=bash")[0] == [0]
    assert keys(signed_in, run, "text=bash&status=failed")[0] == [2]


@pytest.mark.parametrize(
    "query, found",
    [
        ('"yes AND no"', [3]),
        ("yes AND no", [3]),
        ("NEAR(this)", [3]),
        ("NEAR(", [3]),
        ("*", [3]),
        ("^col:", [3]),
        ("(a OR b)", [3]),
        ("50%", [3]),
        ("under_score", [3]),
        ("back\\slash", [3]),
        ("%", [3]),
        # Found where the letters are: "command" holds "and", "world" "or", "notes" "not"; the raw
        # arguments JSON holds quotes and backslashes; "read_file" an underscore.
        ("AND", [0, 3]),
        ("OR", [0, 3]),
        ("NOT", [1, 4]),
        ('"', [0, 1, 3]),
        ("\\", [0, 3]),
        ("_", [1, 3]),
        ("'; DROP TABLE rollouts_rollout; --", []),
        ("' OR 1=1 --", []),
        ("**", []),
        ("AND OR NOT", []),
        ("unde%core", []),
        ("und_r", []),
        ('" OR "', []),
        ("te*", []),
    ],
)
def test_query_syntax_is_literal_text_never_an_error(signed_in, run, query, found):
    for field in ("text", "output", "error"):
        got, form = keys(signed_in, run, f"{field}={quote(query)}")
        assert not form.errors
        if field == "text":
            assert got == found, query
    assert Rollout.objects.filter(run=run).count() == 5


def test_short_and_empty_queries(signed_in, run):
    assert keys(signed_in, run, "text=ld")[0] == [0, 1]  # two characters: answered by a scan ("world", "holds")
    assert keys(signed_in, run, "text=")[0] == [0, 1, 2, 3, 4]
    assert keys(signed_in, run, "text=%20%20")[0] == [0, 1, 2, 3, 4]


def test_a_nul_in_the_query_is_a_field_error_not_a_500(signed_in, run):
    got, form = keys(signed_in, run, "text=a%00b")
    assert "text" in form.errors and got == []  # an invalid filter: its error, no rows


def test_rows_link_to_the_rollout_with_q_for_highlighting(signed_in, run):
    response = signed_in.get(reverse("run", args=[run.pk]) + "?text=hello+world")
    ((row, url),) = response.context["rows"]
    assert url == reverse("rollout", args=[run.pk, row.pk]) + "?text=hello+world&q=hello+world"
    assert url.replace("&", "&amp;") in response.content.decode()
    response = signed_in.get(reverse("run", args=[run.pk]) + "?output=drwx")
    assert response.context["rows"][0][1].endswith("?output=drwx&q=drwx")
    response = signed_in.get(reverse("run", args=[run.pk]) + "?tool=bash")
    assert response.context["rows"][0][1].endswith("?tool=bash&q=bash")


def test_the_filter_s_description_and_the_download_names_say_it(signed_in, run):
    response = signed_in.get(reverse("run", args=[run.pk]) + "?text=hello+world&tool=bash")
    html = response.content.decode()
    assert "trajectory contains “hello world” · tool called bash" in html
    assert f"run-{run.pk}_rollouts_text-hello_world_tool-bash.jsonl" in html


def test_exports_honour_the_content_filter(signed_in, run):
    response = signed_in.get(reverse("run_export", args=[run.pk, "rollouts"]) + "?text=secret")
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [row["_ng_task_index"] for row in lines] == [1]
    assert f"run-{run.pk}_rollouts_text-secret.jsonl" in response["Content-Disposition"]
    response = signed_in.get(reverse("run_export", args=[run.pk, "rollouts_failures"]) + "?error=gateway")
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert len(lines) == 1 and "Bad Gateway" in json.dumps(lines[0])
    response = signed_in.get(reverse("run_export", args=[run.pk, "rollouts"]) + "?tool=bash&review=1")
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [row["_ng_task_index"] for row in lines] == [0]
    response = signed_in.get(reverse("run_export_sft", args=[run.pk]) + "?output=drwx")
    assert f"run-{run.pk}_sft_output-drwx.jsonl" in response["Content-Disposition"]


def test_the_api_list_honours_the_content_filter(client, run, user):
    from rollouts.tokens import create_token

    _row, token = create_token(user, "t")
    response = client.get(f"/api/v1/runs/{run.pk}/rollouts?text=hello%20world", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    assert [r["task_index"] for r in response.json()["items"]] == [0]


def test_previous_next_on_the_rollout_page_walk_the_searched_list(signed_in, run):
    r1 = key(run, 1)
    response = signed_in.get(reverse("rollout", args=[run.pk, r1.pk]) + "?text=the&q=the")
    assert response.status_code == 200
    nav = response.context["nav"]
    assert nav["prev_id"] == key(run, 0).pk and nav["next_id"] is None and nav["total"] == 2


def test_an_imported_run_is_searchable(signed_in, shared_data):
    path = shared_data / "workplace_assistant" / "example_rollouts.jsonl"
    with path.open("rb") as fh:
        run = import_rollouts(fh, source=path.name).run
    got, _ = keys(signed_in, run, "tool=customer_relationship_manager_search_customers")
    assert got
    assert set(keys(signed_in, run, "output=no customers found")[0]) <= set(got)
    assert keys(signed_in, run, "output=no customers found")[0]
    assert keys(signed_in, run, "text=total_visits")[0]
    assert keys(signed_in, run, "text=no such text anywhere 123")[0] == []


def test_items_written_later_are_found_and_deleted_ones_are_not(signed_in, run):
    r4 = key(run, 4)
    assert keys(signed_in, run, "text=late arrival")[0] == []
    TrajectoryItem.objects.create(
        rollout=r4,
        seq=5,
        step=1,
        kind="message",
        origin="agent",
        payload={"type": "message", "content": "a Late Arrival"},
    )
    assert keys(signed_in, run, "text=late arrival")[0] == [4]
    TrajectoryItem.objects.filter(rollout=r4, seq=5).delete()
    assert keys(signed_in, run, "text=late arrival")[0] == []


def test_the_search_text_of_an_item():
    text = item_search_text(
        {
            "type": "function_call",
            "id": "fc_9",
            "status": "completed",
            "name": "Bash",
            "arguments": json.dumps({"cmd": 'say "hi"\x00there'}),
        }
    )
    assert "bash" in text and 'say "hi" there' in text
    assert "function_call" not in text and "completed" not in text and "fc_9" not in text
    assert (
        item_search_text({"type": "reasoning", "summary": [{"text": "Deep \ud800 Thought"}]}) == "deep \ufffd thought"
    )
    assert item_search_text(None) == ""


@pytest.mark.django_db(transaction=True)
def test_a_collected_run_is_searchable_as_the_worker_wrote_it(
    tmp_path, counter_env_url, counter_agent_url, counter_tasks_path
):
    from django.core.management import call_command

    from rollouts.models import Run

    call_command(
        "collect",
        "--agent-url",
        counter_agent_url,
        "--env-url",
        counter_env_url,
        "--input",
        str(counter_tasks_path),
        "--output",
        str(tmp_path / "rollouts.jsonl"),
        "--no-progress",
    )
    run = Run.objects.get()
    rollouts = Rollout.objects.filter(run=run)
    names = set(TrajectoryItem.objects.filter(rollout__run=run, kind="function_call").values_list("name", flat=True))
    assert names and all(queries.filter_tool(rollouts, n).exists() for n in names)
    tool = sorted(names)[0]
    assert queries.filter_tool(rollouts, tool).count() == 5
    out = TrajectoryItem.objects.filter(rollout__run=run, kind="function_call_output").first()
    assert out.search_text and queries.filter_output(rollouts, out.search_text[:20]).exists()


def test_a_common_text_walks_the_run_and_finds_the_same_rollouts(signed_in, run, monkeypatch):
    """A text found in many items (``queries.COMMON_ITEMS``) is answered by probing each rollout
    instead of listing every hit: the same rollouts either way."""
    cases = [
        "text=hello world",
        "text=secret",
        "output=secret",
        "text=" + quote('echo "done"'),
        "text=AND",
        "text=%25",
        "text=" + quote("NEAR(this)"),
    ]
    indexed = [keys(signed_in, run, q)[0] for q in cases]
    monkeypatch.setattr(queries, "COMMON_ITEMS", 1)
    assert [keys(signed_in, run, q)[0] for q in cases] == indexed
    assert indexed[:3] == [[0], [1], [1]]


def test_a_search_counts_its_matches_up_to_a_cap(signed_in, run, monkeypatch):
    from rollouts.web import views

    monkeypatch.setattr(views.CappedPaginator, "cap", 2)
    monkeypatch.setattr(views, "ROLLOUTS_PER_PAGE", 1)
    html = signed_in.get(reverse("run", args=[run.pk]) + "?text=e").content.decode()  # 5 rollouts hold an "e"
    assert "page 1 of 2 · 2+ rows" in html
    html = signed_in.get(reverse("run", args=[run.pk]) + "?text=the").content.decode()  # rollouts 0 and 1
    assert "page 1 of 2 · 2 rows" in html
    html = signed_in.get(reverse("run", args=[run.pk]) + "?status=succeeded").content.decode()  # no search: exact
    assert "page 1 of 4 · 4 rows" in html
