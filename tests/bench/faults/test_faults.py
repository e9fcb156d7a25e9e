"""`make faults`, row by row: the same rows, each a real bench process on the fake engine with
its fault injected. A row passes when it survived (the bench ended as it should, with one
clear line and the RESUME hint where it stopped, no traceback, no process left) and no finished
record was lost. The selected rows run once, side by side as `make faults` runs them (the
exclusive ones alone), and each row's test reads its own results."""

from __future__ import annotations

import os

import pytest

from compaction_bench.bench.faults.cli import ALL_ROWS, run_rows
from compaction_bench.bench.faults.harness import FaultResult
from compaction_bench.bench.faults.rows import Row

# The first row's test sets up the module's fixture, which runs every selected row (19 rows,
# three side by side, the two hostile-agent rows alone after them): 92-133 s on 2 cores, 370 s
# on 2 cores busy with other test runs, so its timeout is the whole table's, not one row's.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def fault_results(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[FaultResult]]:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # the hostile rows count every sandbox process on the machine
        pytest.fail(f"the fault table must run alone, not beside {workers - 1} other xdist "
                    f"workers (their agent boxes read as escapes): `make test-e2e` runs it "
                    f"after the parallel part; by hand: pytest {request.path}", pytrace=False)
    selected = {item.callspec.params["row"].name for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    return run_rows([r for r in ALL_ROWS if r.name in selected],
                    tmp_path_factory.mktemp("faults"))


@pytest.mark.parametrize("row", ALL_ROWS, ids=[r.name for r in ALL_ROWS])
def test_fault_is_survived_with_no_record_lost(
        row: Row, fault_results: dict[str, list[FaultResult]]) -> None:
    results = fault_results[row.name]
    assert results
    for result in results:
        assert result.survived, f"{result.fault}: {result.why} (the user saw: {result.line})"
        assert result.lost == 0, f"{result.fault}: {result.lost} finished records lost"
