"""The fault table's rows run once per module, side by side as `make faults` runs them (the
exclusive ones alone), and each row's test reads its own results."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from compaction_bench.bench.faults.cli import ALL_ROWS, run_rows
from compaction_bench.bench.faults.harness import FaultResult
from compaction_bench.bench.faults.rows import Row


@pytest.fixture(scope="module")
def fault_results(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[FaultResult]]:
    selected = {item.callspec.params["row"].name for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    rows = [r for r in ALL_ROWS if r.name in selected]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and any(r.exclusive for r in rows):
        # the hostile rows count every sandbox process on the machine
        pytest.fail(f"the exclusive fault rows must run alone, not beside {workers - 1} other "
                    f"xdist workers (their agent boxes read as escapes): `make test-e2e` runs "
                    f"them after the parallel part; by hand: pytest {request.path}",
                    pytrace=False)
    return run_rows(rows, tmp_path_factory.mktemp("faults"))


@pytest.fixture
def survived(fault_results: dict[str, list[FaultResult]]) -> Callable[[Row], None]:
    """Asserts a row passed: it survived (the bench ended as it should, with one clear line and
    the RESUME hint where it stopped, no traceback, no process left) and lost no record."""

    def check(row: Row) -> None:
        results = fault_results[row.name]
        assert results
        for result in results:
            assert result.survived, (f"{result.fault}: {result.why} (the user saw: "
                                     f"{result.line})")
            assert result.lost == 0, f"{result.fault}: {result.lost} finished records lost"

    return check
