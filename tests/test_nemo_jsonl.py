"""rollouts.nemo.jsonl: the one reader of JSONL files of rows, and its error naming file and line."""

import pytest

from rollouts.collection.datasets import DatasetError
from rollouts.evaluation.compare_report import CompareError
from rollouts.evaluation.profile_report import ProfileInputError
from rollouts.evaluation.shards import ShardError
from rollouts.nemo.jsonl import JsonlError, iter_objects


def test_rows_with_their_line_numbers_and_bytes_blank_lines_and_a_bom_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n  {"b": [2]}  \r\n')
    assert list(iter_objects(path)) == [(1, b'\xef\xbb\xbf{"a": 1}', {"a": 1}), (3, b'{"b": [2]}', {"b": [2]})]


@pytest.mark.parametrize(
    ("data", "parser", "reason"),
    [
        (b'{"a": 1}\n{not json\n', "json", "not valid JSON (Expecting property name enclosed in double quotes)"),
        (b'{"a": "caf\xe9"}\n', "json", "not UTF-8 text (invalid continuation byte at byte 10)"),
        (b"[1]\n", "json", "expected a JSON object, got list"),
        (b"[1]\n", "orjson", "expected a JSON object, got list"),
        (b'{"a": NaN}\n', "orjson", "not valid JSON ("),  # then orjson's own message
    ],
)
def test_a_bad_line_names_file_line_and_reason(tmp_path, data, parser, reason):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    with pytest.raises(JsonlError) as caught:
        list(iter_objects(path, parser=parser))
    line = data.count(b"\n")
    assert (caught.value.source, caught.value.line) == (str(path), line)
    assert caught.value.reason == reason or reason.endswith("(") and caught.value.reason.startswith(reason)
    assert str(caught.value) == f"{path}, line {line}: {caught.value.reason}"


def test_the_callers_error_types_are_jsonl_errors_and_keep_their_messages(tmp_path):
    path = tmp_path / "side.jsonl"
    path.write_bytes(b"7\n")
    with pytest.raises(CompareError, match=r"side\.jsonl, line 1: a row must be an object, got int$"):
        list(iter_objects(path, error=CompareError, not_object="a row must be an object"))
    assert all(issubclass(e, JsonlError) for e in (CompareError, ProfileInputError, ShardError, DatasetError))
    assert str(ShardError("whole file")) == "whole file"
    assert str(DatasetError("bad", 3, "tasks.jsonl")) == "tasks.jsonl, line 3: bad"
