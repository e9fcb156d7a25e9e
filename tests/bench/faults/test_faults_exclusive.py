"""The fault table's exclusive rows (hostile agent commands, the agent's box closed): they
count every sandbox process on the machine, so they run one after another, never beside xdist
workers (the Makefile's ALONE list); see test_faults.py for what a row must do to pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from compaction_bench.bench.faults.cli import ALL_ROWS
from compaction_bench.bench.faults.rows import Row

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
EXCLUSIVE = [r for r in ALL_ROWS if r.exclusive]


@pytest.mark.parametrize("row", EXCLUSIVE, ids=[r.name for r in EXCLUSIVE])
def test_exclusive_fault_is_survived_with_no_record_lost(
        row: Row, survived: Callable[[Row], None]) -> None:
    survived(row)
