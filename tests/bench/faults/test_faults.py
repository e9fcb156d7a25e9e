"""`make faults`, row by row: the same rows, each a real bench process on the fake engine with
its fault injected. A row passes when it survived (the bench ended as it should, with one
clear line and the RESUME hint where it stopped, no traceback, no process left) and no finished
record was lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.faults.cli import ALL_ROWS
from bench.faults.harness import Context
from bench.faults.rows import Row


@pytest.mark.parametrize("row", ALL_ROWS, ids=[r.name for r in ALL_ROWS])
def test_fault_is_survived_with_no_record_lost(row: Row, tmp_path: Path) -> None:
    results = row.run(Context(tmp_path))
    assert results
    for result in results:
        assert result.survived, f"{result.fault}: {result.why} (the user saw: {result.line})"
        assert result.lost == 0, f"{result.fault}: {result.lost} finished records lost"
