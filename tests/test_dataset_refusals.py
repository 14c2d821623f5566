"""Task files a user wrote: a gzip file is named as such, and an object that names a key twice is
refused with its line (JSON readers disagree on which value wins)."""

from __future__ import annotations

import gzip
import io

import pytest

from rollouts.collection.datasets import DatasetError, read_jsonl

ROW = b'{"responses_create_params": {"input": "hi"}}\n'


def test_a_gzip_file_is_refused_as_gzip_not_as_bad_utf8():
    with pytest.raises(DatasetError) as exc:
        read_jsonl(io.BytesIO(gzip.compress(ROW * 3)), "tasks.jsonl.gz")
    assert "gzip-compressed" in str(exc.value) and "UTF-8" not in str(exc.value)


@pytest.mark.parametrize(
    "line",
    [
        b'{"responses_create_params": {"input": "hi"}, "id": 1, "id": 2}\n',
        b'{"responses_create_params": {"input": "hi", "input": "there"}}\n',
    ],
)
def test_a_key_named_twice_in_one_object_is_refused_with_its_line(line):
    with pytest.raises(DatasetError) as exc:
        read_jsonl(io.BytesIO(ROW + line), "tasks.jsonl")
    assert exc.value.line == 2 and "appears twice" in str(exc.value)


def test_the_same_key_in_two_objects_is_fine():
    parsed = read_jsonl(io.BytesIO(b'{"responses_create_params": {"input": "a"}, "meta": {"input": 1}}\n'), "t.jsonl")
    assert len(parsed.rows) == 1


@pytest.mark.parametrize("blank_after", [b"", b"\n\n"])
def test_a_one_line_json_array_is_named_as_such_with_the_command_that_converts_it(blank_after):
    line = b"[" + ROW.strip() + b", " + ROW.strip() + b"]\n"
    with pytest.raises(DatasetError) as exc:
        read_jsonl(io.BytesIO(line + blank_after), "data/tasks.json")
    message = str(exc.value)
    assert "must be a JSON object" not in message and exc.value.line is None
    assert "this is a JSON array, not JSONL (one JSON object per line)" in message
    assert "jq -c '.[]' tasks.json > tasks.jsonl" in message


def test_a_json_array_on_several_lines_gets_the_same_command():
    text = b"[\n  " + ROW.strip() + b",\n  " + ROW.strip() + b"\n]\n"
    with pytest.raises(DatasetError) as exc:
        read_jsonl(io.BytesIO(text), "my tasks")
    assert "this is a JSON array, not JSONL" in str(exc.value)
    assert "jq -c '.[]' 'my tasks' > 'my tasks.jsonl'" in str(exc.value)


def test_an_array_line_followed_by_rows_is_that_line_s_error():
    with pytest.raises(DatasetError) as exc:
        read_jsonl(io.BytesIO(b"[" + ROW.strip() + b"]\n" + ROW), "tasks.jsonl")
    assert exc.value.line == 1 and "must be a JSON object, got a JSON array" in str(exc.value)
