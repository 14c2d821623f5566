"""The run table's kept field values (``rollouts.review.field_values``): a sort or filter on a task
or verify field reads them and gives the same rows in the same order as reading the stored JSON
text (on the backend the tests run on: SQLite, or PostgreSQL with ``DATABASE_URL``), and they follow
the run's rollouts: results finished later (a running run, a retry), an import (a new run, as
reverify makes), an archive and its restore."""

from __future__ import annotations

import io
import json

import pytest
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import F
from django.urls import reverse

from rollouts.collection import archive, runs
from rollouts.collection.importer import import_rollouts
from rollouts.models import FieldExtract, FieldValue, Rollout, Run, Task
from rollouts.review import columns, field_values, query
from rollouts.review.query import filtered_rollouts

# Values of one field across rows: numbers (an int and a float equal to it), booleans, strings
# (one that reads as a number), an object, a list, JSON null, and missing (None: key left out).
MIXED = [3, 1, 1.0, 2.5, -4, True, False, "b", "a", "10", "", {"k": 1}, [1, 2], "null", None, 0, "B"]


def _verify(k: int) -> dict:
    value = MIXED[k % len(MIXED)]
    reply = {"reward": float(k % 2), "score": (k * 7) % 11 / 10, "judge": {"verdict": ["A", "B", "tie"][k % 3]}}
    if value is not None:
        reply["mixed"] = None if value == "null" else value
    return reply


def _make_run(total: int = 40, status: str = Run.Status.COMPLETED) -> Run:
    run = Run.objects.create(name="fields", status=status, num_tasks=total, num_keys=total)
    for k in range(total):
        row = {"category": ["math", "code", "search"][k % 3], "level": MIXED[(k * 5) % len(MIXED)]}
        if row["level"] is None:
            del row["level"]
        task = Task.objects.create(run=run, task_index=k, row_json=json.dumps(row))
        if k % 9 == 4:  # a failure: no verify reply
            Rollout.objects.create(
                run=run, task=task, task_index=k, rollout_index=0, status=Rollout.Status.FAILED, failure_kind="x"
            )
            continue
        Rollout.objects.create(
            run=run,
            task=task,
            task_index=k,
            rollout_index=0,
            status=Rollout.Status.SUCCEEDED,
            reward=float(k % 2),
            verify_json=json.dumps(_verify(k)),
        )
    # a superseded kill-shaped row and the attempt that replaced it
    task = Task.objects.get(run=run, task_index=4)
    Rollout.objects.filter(run=run, task_index=4).update(status=Rollout.Status.INTERRUPTED)
    Rollout.objects.create(
        run=run,
        task=task,
        task_index=4,
        rollout_index=0,
        status=Rollout.Status.SUCCEEDED,
        reward=1.0,
        verify_json=json.dumps(_verify(5)),
    )
    return run


def _ids(run: Run, params: dict, kept: bool, monkeypatch) -> list[int]:
    with monkeypatch.context() as m:
        if not kept:
            m.setattr(query.RolloutFilterForm, "use_kept_values", lambda self, run: None)
        qs, form = filtered_rollouts(run, params)
        assert bool(form.kept) == kept or not form.fields_read()
        return list(qs.values_list("id", flat=True))


QUERIES = [
    {"sort": "verify.score"},
    {"sort": "-verify.score"},
    {"sort": "verify.mixed"},
    {"sort": "-verify.mixed"},
    {"sort": "task.level"},
    {"sort": "-task.level"},
    {"sort": "task.category"},
    {"sort": "-verify.judge.verdict"},
    {"f.verify.score": "0.2..0.6"},
    {"f.verify.score": "..0.3", "sort": "-verify.mixed"},
    {"f.verify.mixed": "1"},
    {"f.verify.mixed": "true"},
    {"f.verify.mixed": "a"},
    {"f.verify.mixed": "10"},
    {"f.verify.mixed": '{"k": 1}'},
    {"f.verify.mixed": '"10"'},
    {"f.verify.mixed": '"3"'},
    {"f.verify.mixed": '""'},
    {"f.task.level": '"b"'},
    {"f.task.category": "math", "f.verify.judge.verdict": "B", "sort": "-verify.score"},
    {"f.task.level": "0..2.5", "sort": "task.level"},
    {"f.verify.missing": "1"},
    {"sort": "verify.missing"},
]


@pytest.mark.django_db
@pytest.mark.parametrize("params", QUERIES, ids=[json.dumps(q) for q in QUERIES])
def test_a_sort_or_filter_on_kept_values_gives_the_rows_of_the_json_reading(params, monkeypatch):
    run = _make_run()
    expected = _ids(run, params, kept=False, monkeypatch=monkeypatch)
    assert _ids(run, params, kept=True, monkeypatch=monkeypatch) == expected
    # and again, read from the extract made by the first
    assert _ids(run, params, kept=True, monkeypatch=monkeypatch) == expected
    assert FieldExtract.objects.filter(run=run).exists()


SORTS = [q for q in QUERIES if "sort" in q]


@pytest.mark.django_db
@pytest.mark.parametrize("params", SORTS, ids=[json.dumps(q) for q in SORTS])
def test_every_page_of_a_field_sort_is_that_slice_of_the_whole_order(params, monkeypatch):
    # On PostgreSQL the first pages of a sort on kept numbers come from the index
    # (``field_values.sort_head``), the others and any page past the numbers from the whole
    # order: pages of 4 rows cross the boundaries between numbers, texts and missing values.
    run = _make_run()
    # ties break in task order, here not the order of the rows' ids
    Rollout.objects.filter(run=run).update(task_index=100 - F("task_index"))
    _make_run()  # another run with the same fields kept: none of its values joins
    expected = _ids(run, params, kept=False, monkeypatch=monkeypatch)
    monkeypatch.setattr(query.PagedIds, "HEAD_ROWS", 20)
    qs, form = filtered_rollouts(run, params)
    if connection.vendor == "postgresql" and params["sort"].lstrip("-") == "verify.score":
        assert form.head is not None
    paginator = Paginator(form.page_ids(qs), 4)
    pages = [list(paginator.page(n).object_list) for n in paginator.page_range]
    assert [i for page in pages for i in page] == expected


@pytest.mark.django_db
def test_the_run_page_sorted_on_a_field_reads_the_kept_values(signed_in):
    run = _make_run()
    response = signed_in.get(reverse("run", args=[run.pk]), {"cols": "verify.score", "sort": "-verify.score"})
    assert response.status_code == 200
    assert FieldExtract.objects.filter(run=run, field="verify.score").exists()
    kept = dict(FieldValue.objects.filter(run=run, field="verify.score").values_list("rollout_id", "number"))
    succeeded = Rollout.objects.filter(run=run).exclude(verify_json="")
    assert kept == {r.pk: json.loads(r.verify_json)["score"] for r in succeeded}


@pytest.mark.django_db
def test_results_finished_after_the_extract_are_added_when_next_read(monkeypatch):
    run = _make_run(12, status=Run.Status.RUNNING)
    Rollout.objects.filter(run=run).exclude(verify_json="").update(result_seq=1)
    pending = Rollout.objects.filter(run=run).order_by("task_index").first()
    Rollout.objects.filter(pk=pending.pk).update(status=Rollout.Status.RUNNING, verify_json="", result_seq=None)
    params = {"sort": "-verify.score"}
    before = _ids(run, params, kept=True, monkeypatch=monkeypatch)
    assert not FieldValue.objects.filter(rollout_id=pending.pk).exists()
    # the worker writes its result (a higher number than any before)
    Rollout.objects.filter(pk=pending.pk).update(
        status=Rollout.Status.SUCCEEDED, verify_json=json.dumps({"reward": 1.0, "score": 99}), result_seq=2
    )
    after = _ids(run, params, kept=True, monkeypatch=monkeypatch)
    assert after[0] == pending.pk and after != before
    assert after == _ids(run, params, kept=False, monkeypatch=monkeypatch)
    assert FieldExtract.objects.get(run=run, field="verify.score").upto_seq == 2


@pytest.mark.django_db
def test_a_retried_key_gets_its_values_once_its_new_attempt_ends(monkeypatch):
    run = _make_run(30)  # keys 13 and 22 failed
    run.max_attempts = 3
    run.save(update_fields=["max_attempts"])
    params = {"f.task.category": "code", "sort": "-verify.score"}
    _ids(run, params, kept=True, monkeypatch=monkeypatch)
    assert runs.resume(run) > 0  # the failed keys get new pending attempts
    new = Rollout.objects.filter(run=run, status=Rollout.Status.PENDING).order_by("id").first()
    # a task field follows the new rows at once (its value is the task's)
    rows = _ids(run, {"f.task.category": json.loads(new.task.row_json)["category"]}, True, monkeypatch)
    assert new.pk in rows
    Rollout.objects.filter(pk=new.pk).update(
        status=Rollout.Status.SUCCEEDED, verify_json=json.dumps({"reward": 1.0, "score": 5}), result_seq=1
    )
    assert _ids(run, {"sort": "-verify.score"}, True, monkeypatch)[0] == new.pk
    assert _ids(run, params, True, monkeypatch) == _ids(run, params, False, monkeypatch)


@pytest.mark.django_db
def test_an_archived_then_restored_run_reads_its_values_again(settings, tmp_path, monkeypatch):
    settings.GYMWEB_ARCHIVE_DIR = str(tmp_path / "archive")
    run = _make_run(12)
    params = {"sort": "-verify.score"}
    expected = _ids(run, params, True, monkeypatch)
    assert FieldValue.objects.filter(run=run).exists()
    archive.archive_run(run)
    assert not FieldValue.objects.filter(run=run).exists() and not FieldExtract.objects.filter(run=run).exists()
    archived = _ids(run, params, True, monkeypatch)
    assert archived == _ids(run, params, False, monkeypatch)
    archive.restore_run(run)
    assert not FieldExtract.objects.filter(run=run).exists()  # the archived (empty) values are gone
    assert _ids(run, params, True, monkeypatch) == expected


@pytest.mark.django_db
def test_each_imported_run_has_its_own_values(shared_data, monkeypatch):
    name = "tau2"
    with (shared_data / name / "example_rollouts.jsonl").open("rb") as fh:
        run = import_rollouts(fh, source=f"{name}/example_rollouts.jsonl").run
    params = {"sort": "-verify.result.duration"}
    assert _ids(run, params, True, monkeypatch) == _ids(run, params, False, monkeypatch)
    # a second import of the same file is another run: its own extract, its own rows
    with (shared_data / name / "example_rollouts.jsonl").open("rb") as fh:
        again = import_rollouts(io.BytesIO(fh.read()), source=f"{name}/example_rollouts.jsonl").run
    assert _ids(again, params, True, monkeypatch) == _ids(again, params, False, monkeypatch)
    mine = set(FieldValue.objects.filter(run=again).values_list("rollout_id", flat=True))
    assert mine and mine <= set(Rollout.objects.filter(run=again).values_list("id", flat=True))


@pytest.mark.django_db
def test_forget_drops_a_runs_values_and_the_next_read_extracts_them_again(monkeypatch):
    run = _make_run(12)
    params = {"sort": "verify.mixed"}
    expected = _ids(run, params, True, monkeypatch)
    Rollout.objects.filter(run=run).exclude(verify_json="").update(verify_json=json.dumps({"mixed": 1}))
    field_values.forget(run.pk)
    assert not FieldValue.objects.filter(run=run).exists()
    now = _ids(run, params, True, monkeypatch)
    assert now == _ids(run, params, False, monkeypatch) and now != expected


@pytest.mark.django_db
def test_a_large_run_s_first_read_queues_the_extraction_once_and_reads_the_json_meanwhile(
    queued, settings, monkeypatch
):
    settings.GYMWEB_TASKS_INLINE = False
    monkeypatch.setattr(field_values, "INLINE_ROWS", 10)
    run = _make_run(30)
    params = {"sort": "-verify.score", "f.task.category": "code"}
    expected = _ids(run, params, kept=False, monkeypatch=monkeypatch)
    for _ in range(2):  # the page is read twice before a worker gets to it: queued once
        qs, form = filtered_rollouts(run, params)
        assert form.kept == set() and list(qs.values_list("id", flat=True)) == expected
    tasks = sorted(args for args in queued if args[0] == "rollouts.review.field_values.extract")
    assert tasks == [
        ("rollouts.review.field_values.extract", run.pk, "task.category"),
        ("rollouts.review.field_values.extract", run.pk, "verify.score"),
    ]
    assert not FieldValue.objects.filter(run=run).exists()
    for _, run_id, name in tasks:  # as the worker runs them
        assert field_values.extract(run_id, name) == f"run {run.pk}: {name} kept"
    qs, form = filtered_rollouts(run, params)
    assert form.kept == {"verify.score", "task.category"}
    assert list(qs.values_list("id", flat=True)) == expected


@pytest.mark.django_db
def test_prepare_run_keeps_every_discovered_field_and_a_sort_then_extracts_nothing(monkeypatch):
    run = _make_run(12)
    found = {f.name for f in columns.discover(Rollout.objects.filter(run=run))}
    assert {"task.category", "task.level", "verify.score", "verify.judge.verdict", "verify.mixed"} <= found
    assert field_values.prepare_run(run.pk) == f"run {run.pk}: {len(found)} field(s) kept"
    assert set(FieldExtract.objects.filter(run=run).values_list("field", flat=True)) == found
    values = FieldValue.objects.filter(run=run).count()
    assert _ids(run, {"sort": "-verify.mixed"}, True, monkeypatch) == _ids(
        run, {"sort": "-verify.mixed"}, False, monkeypatch
    )
    assert FieldValue.objects.filter(run=run).count() == values


def _with_nul(run: Run) -> dict[int, dict]:
    """Three rows' verify replies given a NUL: in the model's output only, in a field, and the text
    ``\\u0000`` written with an escaped backslash (no NUL at all). Returns the replies by rollout id."""
    rows = list(Rollout.objects.filter(run=run).exclude(verify_json="").order_by("id"))[:3]
    texts = [
        {"response": {"output": [{"content": [{"text": "FINAL with \x00 NUL"}]}]}},
        {"judge_note": "nul\x00inside"},
        {"judge_note": "\\u0000 is six characters"},
    ]
    out = {}
    for row, extra in zip(rows, texts):
        reply = {**json.loads(row.verify_json), **extra}
        Rollout.objects.filter(pk=row.pk).update(verify_json=json.dumps(reply))
        out[row.pk] = reply
    return out


NUL_QUERIES = [
    {"sort": "verify.score"},
    {"sort": "-verify.judge_note"},
    {"f.verify.score": "0..1"},
    {"f.verify.judge_note": "nul\ufffdinside"},
    {"f.verify.judge_note": "nul"},
    {"f.verify.judge_note": "\\u0000 is six characters"},
]


@pytest.mark.django_db
@pytest.mark.parametrize("params", NUL_QUERIES, ids=[json.dumps(q) for q in NUL_QUERIES])
def test_a_nul_in_a_rollout_s_reply_reads_as_the_replacement_character_on_both_paths(params, monkeypatch):
    run = _make_run(12)
    replies = _with_nul(run)
    expected = _ids(run, params, kept=False, monkeypatch=monkeypatch)
    assert _ids(run, params, kept=True, monkeypatch=monkeypatch) == expected
    note = params.get("f.verify.judge_note")
    if note is not None:  # a NUL never cuts a value: "nul" matches nothing
        assert expected == [
            pk for pk, r in replies.items() if r.get("judge_note", "").replace("\x00", "\ufffd") == note
        ]
    if "f.verify.score" in params:
        assert set(replies) <= set(expected)
    kept = dict(FieldValue.objects.filter(run=run, field="verify.judge_note").values_list("rollout_id", "text"))
    if kept:
        assert {pk: kept.get(pk) for pk in replies} == {
            pk: r["judge_note"].replace("\x00", "\ufffd") if "judge_note" in r else None for pk, r in replies.items()
        }


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite cannot read a lone surrogate as text")
def test_postgresql_reads_a_lone_surrogate_as_the_replacement_character_and_a_pair_as_its_character(monkeypatch):
    run = _make_run(6)
    rows = list(Rollout.objects.filter(run=run).exclude(verify_json="").order_by("id"))[:2]
    for row, note in zip(rows, ["lone \\ud800 here", "pair \\ud83d\\ude00 here"]):
        Rollout.objects.filter(pk=row.pk).update(verify_json=row.verify_json[:-1] + f', "judge_note": "{note}"}}')
    params = {"sort": "verify.judge_note"}
    assert _ids(run, params, kept=True, monkeypatch=monkeypatch) == _ids(
        run, params, kept=False, monkeypatch=monkeypatch
    )
    kept = dict(FieldValue.objects.filter(run=run, field="verify.judge_note").values_list("rollout_id", "text"))
    assert kept == {rows[0].pk: "lone \ufffd here", rows[1].pk: "pair \U0001f600 here"}


# Values of one field, for the documented order (docs/trajectory.md: numbers, then texts, then rows
# without it, both ways): MISSING is a key left out; None is JSON null (read as missing too).
MISSING = object()
ORDERED = [3, "b", 1, None, "a", 1.0, 2.5, MISSING, -4, True, "10", False, "", 0, "B", "é", "Z", 1, "b"]


def _documented_key(value, desc: bool):
    if value is MISSING or value is None:
        return (2,)
    if isinstance(value, (bool, int, float)):
        return (0, -float(value) if desc else float(value))
    return (1, tuple(-ord(c) for c in value) + (1,) if desc else tuple(ord(c) for c in value))


@pytest.mark.django_db
@pytest.mark.parametrize("desc", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("kept", [False, True], ids=["json", "kept"])
def test_a_field_sort_puts_numbers_then_texts_then_missing_values_on_every_backend(desc, kept, monkeypatch):
    run = Run.objects.create(name="order", status=Run.Status.COMPLETED, num_tasks=len(ORDERED), num_keys=len(ORDERED))
    for k, value in enumerate(ORDERED):
        task = Task.objects.create(run=run, task_index=k, row_json=json.dumps({"category": "x"}))
        reply = {"reward": 1.0} if value is MISSING else {"reward": 1.0, "v": value}
        Rollout.objects.create(
            run=run,
            task=task,
            task_index=k,
            rollout_index=0,
            status=Rollout.Status.SUCCEEDED,
            reward=1.0,
            verify_json=json.dumps(reply),
        )
    # ties (1, 1.0 and true; the two "b") break in task order
    expected = sorted(range(len(ORDERED)), key=lambda k: (_documented_key(ORDERED[k], desc), k))
    ids = _ids(run, {"sort": ("-" if desc else "") + "verify.v"}, kept=kept, monkeypatch=monkeypatch)
    by_id = dict(Rollout.objects.filter(run=run).values_list("id", "task_index"))
    assert [by_id[i] for i in ids] == expected
