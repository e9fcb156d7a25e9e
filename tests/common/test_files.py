"""Records that survive: atomic whole-file writes, one-write JSONL lines, torn last lines."""

from __future__ import annotations

import json
import math
import multiprocessing
from pathlib import Path

import pytest

from compaction_bench.common.files import (
    SCHEMA,
    JsonlWriter,
    RecordWriteError,
    read_jsonl,
    write_json_atomic,
    write_text_atomic,
)


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_write_that_fails_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    write_text_atomic(path, "old")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"x": object()})
    assert path.read_text() == "old" and len(list(tmp_path.iterdir())) == 1


def test_non_finite_floats_become_null_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_json_atomic(path, {"nan": math.nan, "inf": [math.inf, 1.5]})
    assert json.loads(path.read_text()) == {"nan": None, "inf": [None, 1.5]}
    with JsonlWriter(tmp_path / "r.jsonl") as writer:
        writer.write({"x": float("nan")})
    line = (tmp_path / "r.jsonl").read_text()
    assert "NaN" not in line and json.loads(line)["x"] is None


def test_a_torn_last_line_is_reported_and_the_next_record_starts_clean(tmp_path: Path) -> None:
    path = tmp_path / "arms.jsonl"
    path.write_text('{"schema": 2, "a": 1}\n{"schema": 2, "a": 2, "cut')  # a crash mid-write
    writer = JsonlWriter(path)
    assert writer.torn_line_repaired
    writer.write({"a": 3})
    writer.close()
    read = read_jsonl(path)
    assert [row["a"] for row in read.objects] == [1, 3]  # the new record is not swallowed
    (issue,) = read.issues
    assert issue.line == 2 and "not valid JSON" in issue.reason
    path.write_text('{"a": 1}\n{"a": 2, "cut')
    (torn,) = read_jsonl(path).issues
    assert "last line cut short" in torn.reason


def test_lines_carry_the_schema_and_non_objects_are_issues(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    with JsonlWriter(path) as writer:
        writer.write({"k": "v"})
    with path.open("a") as handle:
        handle.write("[1, 2]\n\n")
    read = read_jsonl(path)
    assert read.objects == [{"schema": SCHEMA, "k": "v"}]
    assert read.issues[0].reason.startswith("not a JSON object")
    assert read_jsonl(tmp_path / "missing.jsonl").rows == []


def _append(path: str, worker: int) -> None:
    with JsonlWriter(path) as writer:
        for i in range(200):
            writer.write({"worker": worker, "i": i, "pad": "x" * 3000})


@pytest.mark.e2e
def test_processes_appending_to_one_file_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    procs = [multiprocessing.get_context("spawn").Process(target=_append, args=(str(path), w))
             for w in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    read = read_jsonl(path)
    assert read.issues == [] and len(read.objects) == 600


def test_a_closed_writer_refuses_with_the_file_named(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "w.jsonl")
    writer.close()
    with pytest.raises(RecordWriteError, match=r"w\.jsonl"):
        writer.write({"a": 1})
