"""`make faults`, row by row: the same rows, each a real bench process on the fake engine with
its fault injected. A row passes when it survived (the bench ended as it should, with one
clear line and the RESUME hint where it stopped, no traceback, no process left) and no finished
record was lost. This module holds the rows that run side by side; the exclusive rows, which
count every sandbox process on the machine, are in test_faults_exclusive.py. Both run in the
e2e tier's alone part (the Makefile's ALONE)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from compaction_bench.bench.faults.cli import ALL_ROWS
from compaction_bench.bench.faults.rows import Row

# The first row's test sets up the module's fixture (conftest.py), which runs every selected
# row (17 rows, three side by side): its timeout is the whole table's, not one row's (370 s
# measured on 2 cores busy with other test runs).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SHARED = [r for r in ALL_ROWS if not r.exclusive]


@pytest.mark.parametrize("row", SHARED, ids=[r.name for r in SHARED])
def test_fault_is_survived_with_no_record_lost(row: Row, survived: Callable[[Row], None]) -> None:
    survived(row)
