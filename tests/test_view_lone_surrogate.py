"""A field value holding a lone UTF-16 surrogate (JSON ``"\\ud800"``, which an env's reply may carry
and ``lossless.dumps`` keeps as that escape): the run table's column, sort and filter on it, the
content search, the rollout page and the download never fail on it, on SQLite (whose JSON functions
give such a value as bytes that are not UTF-8) and PostgreSQL. Pages show U+FFFD; the download
keeps the escape (lossless)."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from rollouts.collection.importer import import_rollouts
from rollouts.models import Rollout
from rollouts.review import query

LONE = "lone \\ud800 here"  # as JSON text: the escape, six characters
PAIR = "pair \\ud83d\\ude00 here"


def _run_with_odd_values(shared_data):
    with (shared_data / "tau2" / "example_rollouts.jsonl").open("rb") as fh:
        run = import_rollouts(fh, source="tau2/example_rollouts.jsonl").run
    rows = list(Rollout.objects.filter(run=run).exclude(verify_json="").order_by("task_index"))
    for row, note in zip(rows, [LONE, PAIR, "zorble \\\\ud800 plain"]):
        Rollout.objects.filter(pk=row.pk).update(verify_json=row.verify_json[:-1] + f', "note": "{note}"}}')
    return run, rows


def _keys(html: str) -> list[int]:
    html = html[html.index('id="rollout-table"') :]
    return [int(t) for t, _r in re.findall(r'class="rollout-link mono" href="[^"]*">(\d+):(\d+)<', html)]


@pytest.mark.django_db
@pytest.mark.parametrize("kept", [False, True], ids=["json", "kept"])
def test_the_run_table_shows_sorts_and_filters_a_lone_surrogate_as_the_replacement_character(
    signed_in, shared_data, kept, monkeypatch
):
    if not kept:
        monkeypatch.setattr(query.RolloutFilterForm, "use_kept_values", lambda self, run: None)
    run, rows = _run_with_odd_values(shared_data)
    url = reverse("run", args=[run.pk])
    for params in ({"cols": "verify.note"}, {"cols": "verify.note", "sort": "-verify.note"}):
        response = signed_in.get(url, params)
        assert response.status_code == 200
        html = response.content.decode()
        assert ">lone \ufffd here</td>" in html and ">pair \U0001f600 here</td>" in html
        assert ">zorble \\ud800 plain</td>" in html  # an escaped backslash: the text is as written
    # descending texts by code point: "zorble…" > "pair…" > "lone…"
    assert _keys(signed_in.get(url, {"sort": "-verify.note"}).content.decode())[:3] == [
        rows[2].task_index,
        rows[1].task_index,
        rows[0].task_index,
    ]
    html = signed_in.get(url, {"cols": "verify.note", "f.verify.note": "lone \ufffd here"}).content.decode()
    assert _keys(html) == [rows[0].task_index]


@pytest.mark.django_db
def test_the_content_search_finds_the_row_and_its_snippet_shows_the_replacement_character(signed_in, shared_data):
    run, rows = _run_with_odd_values(shared_data)
    response = signed_in.get(reverse("run", args=[run.pk]), {"text": "lone"})
    assert response.status_code == 200
    html = response.content.decode()
    assert _keys(html) == [rows[0].task_index]
    assert "<mark>lone</mark> \ufffd here" in html


@pytest.mark.django_db
def test_the_rollout_page_shows_the_value_and_the_download_keeps_its_escape(signed_in, shared_data):
    run, rows = _run_with_odd_values(shared_data)
    response = signed_in.get(reverse("rollout", args=[run.pk, rows[0].pk]))
    assert response.status_code == 200
    assert "lone \ufffd here" in response.content.decode()
    download = signed_in.get(reverse("run_export", args=[run.pk, "rollouts"]))
    assert download.status_code == 200
    body = b"".join(download.streaming_content)
    body.decode("utf-8")  # every byte UTF-8
    assert b'"note":"lone \\ud800 here"' in body  # the escape as stored, byte for byte
    assert '"note":"pair \U0001f600 here"'.encode() in body
    exported = {r["_ng_task_index"]: r for r in map(json.loads, body.decode().splitlines())}
    assert exported[rows[0].task_index]["note"] == "lone \ud800 here"  # the same value, read back
    assert exported[rows[1].task_index]["note"] == "pair \U0001f600 here"
