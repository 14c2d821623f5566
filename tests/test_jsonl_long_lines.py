"""Reading JSONL: lines are read in linear time with memory bounded by one line, and a
line over GYMWEB_MAX_LINE_BYTES is a clear error naming it, from every path that reads files (the
new-run upload, the import page, ``collect --input``). Timings are in benchmarks/bench_jsonl_line."""

from __future__ import annotations

import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from rollouts.collection.datasets import READ_CHUNK_BYTES, DatasetError, iter_lines, read_jsonl
from rollouts.models import Run


def _row(text: str) -> bytes:
    return json.dumps({"responses_create_params": {"input": text}}).encode()


class CountingStream(io.RawIOBase):
    """A binary stream of ``head`` followed by ``size`` bytes of one endless JSON string (never
    held in memory), counting the bytes handed out."""

    def __init__(self, head: bytes, size: int):
        self.head, self.size, self.served = head, size, 0

    def readable(self):
        return True

    def read(self, n=-1):
        total = len(self.head) + self.size
        n = total - self.served if n is None or n < 0 else min(n, total - self.served)
        out = bytearray()
        while len(out) < n:
            pos = self.served + len(out)
            if pos < len(self.head):
                out += self.head[pos : pos + n - len(out)]
            else:
                out += b"a" * (n - len(out))
        self.served += n
        return bytes(out)


def test_a_line_over_the_cap_is_an_error_naming_the_file_and_line():
    lines = [_row("short") + b"\n", _row("y" * 500) + b"\n", _row("short") + b"\n"]
    with pytest.raises(DatasetError) as info:
        read_jsonl(io.BytesIO(b"".join(lines)), source="tasks.jsonl", max_line_bytes=200)
    assert info.value.line == 2
    assert str(info.value).startswith(
        "tasks.jsonl, line 2: the line is longer than the limit of 200 bytes per line (GYMWEB_MAX_LINE_BYTES)"
    )
    # A list of lines (the tests' and benchmarks' form) is held to the same cap.
    with pytest.raises(DatasetError, match="line 2"):
        read_jsonl(lines, source="tasks.jsonl", max_line_bytes=200)
    # At the cap exactly, the line is fine (its newline not counted).
    exact = _row("z" * 100)
    assert len(read_jsonl(io.BytesIO(exact + b"\n"), max_line_bytes=len(exact)).rows) == 1


def test_reading_stops_at_the_cap_without_reading_the_rest_of_the_line():
    stream = CountingStream(_row("ok") + b'\n{"responses_create_params": {"input": "', 50 * 1024 * 1024)
    with pytest.raises(DatasetError) as info:
        read_jsonl(stream, source="huge.jsonl", max_line_bytes=2 * 1024 * 1024)
    assert info.value.line == 2 and "2 MB" in str(info.value)
    assert stream.served <= 2 * 1024 * 1024 + 2 * READ_CHUNK_BYTES  # not the 50 MB behind it


def test_a_long_line_read_in_many_small_pieces_comes_back_whole():
    class Trickle(io.RawIOBase):
        def __init__(self, data):
            self.data, self.pos = data, 0

        def readable(self):
            return True

        def read(self, n=-1):  # at most 7 bytes a call, as a slow socket would
            out = self.data[self.pos : self.pos + min(7, n if n and n > 0 else 7)]
            self.pos += len(out)
            return out

    long_text = "é" * 5000
    data = _row("a") + b"\r\n\n" + _row(long_text) + b"\n  \n" + _row("last")  # CRLF, blank lines, no final newline
    parsed = read_jsonl(Trickle(data), source="t.jsonl")
    assert [r["responses_create_params"]["input"] for r in parsed.rows] == ["a", long_text, "last"]
    assert parsed.lines == [1, 3, 5]
    assert [n for n, _ in iter_lines(Trickle(data))] == [1, 2, 3, 4, 5]


def test_text_streams_are_read_the_same_way(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(_row("one") + b"\n" + _row("two") + b"\n")
    with path.open("r", encoding="utf-8") as fh:
        assert len(read_jsonl(fh, max_line_bytes=100).rows) == 2
    with path.open("rb") as fh, pytest.raises(DatasetError, match="line 1"):
        read_jsonl(fh, max_line_bytes=10)


def test_the_new_run_form_reports_the_long_line(signed_in, settings):
    settings.GYMWEB_MAX_LINE_BYTES = 1000
    data = _row("fine") + b"\n" + _row("x" * 2000) + b"\n"
    response = signed_in.post(
        reverse("run_new"),
        {
            "dataset_file": SimpleUploadedFile("tasks.jsonl", data),
            "agent_url": "http://127.0.0.1:9102",
            "env_url": "http://127.0.0.1:9101",
            "agent_name": "remote_agent",
            "concurrency": 4,
            "num_repeats": 1,
            "max_attempts": 3,
            "remote_responses_timeout_s": 10,
            "run_timeout_s": 20,
        },
    )
    assert response.status_code == 400
    error = response.context["form"].errors["dataset_file"][0]
    assert (
        error.startswith("tasks.jsonl, line 2: the line is longer than the limit") and "GYMWEB_MAX_LINE_BYTES" in error
    )


def test_the_import_page_reports_the_long_line_and_stores_nothing(signed_in, settings):
    settings.GYMWEB_MAX_LINE_BYTES = 1000
    data = _row("fine") + b"\n" * 3 + _row("x" * 2000) + b"\n"
    response = signed_in.post(reverse("import"), {"rollouts": SimpleUploadedFile("rollouts.jsonl", data)})
    assert response.status_code == 400
    assert "rollouts.jsonl, line 4: the line is longer than the limit" in response.context["form"].errors["rollouts"][0]
    assert not Run.objects.exists()


def test_collect_reports_the_long_line(db, settings, tmp_path):
    settings.GYMWEB_MAX_LINE_BYTES = 1000
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(_row("x" * 2000) + b"\n")
    with pytest.raises(CommandError, match=r"tasks\.jsonl, line 1: the line is longer than the limit"):
        call_command(
            "collect",
            "--agent-url",
            "http://127.0.0.1:9",
            "--env-url",
            "http://127.0.0.1:9",
            "--input",
            str(tasks),
            "--output",
            str(tmp_path / "out" / "rollouts.jsonl"),
            "--no-progress",
        )
