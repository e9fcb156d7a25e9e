"""The fault table's rows run once per module, side by side as `make faults` runs them (the
exclusive ones alone), and each row's test reads its own results."""

from __future__ import annotations

import os

import pytest

from compaction_bench.bench.faults.cli import ALL_ROWS, run_rows
from compaction_bench.bench.faults.harness import FaultResult


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
