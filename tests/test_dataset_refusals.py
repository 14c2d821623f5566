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
