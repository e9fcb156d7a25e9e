"""The host-contention verdict end to end (issue 30): an A/A bench (ARMS=clean,placebo) on the
fake engine, run while the test's own CPU hog (a Python busy loop per core, started and killed
here) works beside it, reports its blocks contended and QUIET_ONLY's analysis leaves them out;
the same run without the hog reports them quiet.

Runs alone (the Makefile's ALONE list): a sibling test worker on the same machine is exactly
the foreign CPU this verdict reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.runfolder import read_run
from compaction_bench.common.paths import repo_root
from compaction_bench.common.processtree import stop_tree
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

pytestmark = pytest.mark.e2e

LS = "THOUGHT: List the files.\n\n```bash\nls\n```"
BLOCKS = 3


@contextmanager
def hog() -> Iterator[None]:
    """A busy loop per core, in processes outside the bench's tree."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              start_new_session=True) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for p in procs:
            stop_tree(p, grace_s=0)


def bench(results: Path, url: str, run_id: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={url}", f"external_url={url}", "step_limit=4", "selfcheck=0",
         "arms=clean,placebo", f"blocks={BLOCKS}", "quiet_only=1", f"run_id={run_id}"],
        cwd=repo_root(), capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(results)})
    assert done.returncode == 0, done.stderr[-3000:]
    return results / run_id


def verdicts(run: Path) -> list[dict[str, Any]]:
    blocks = [json.loads(line) for line in (run / "blocks.jsonl").read_text().splitlines()
              if line.strip()]
    return [b["host"] for b in blocks]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    # a model call of about a quarter second: each block's arms run for a few host samples
    with FakeProcess(FakeConfig(ttft_ms=250, itl_ms=2, default_content=LS)) as server:
        yield server


def test_a_hog_beside_the_bench_makes_its_blocks_contended_and_quiet_only_drops_them(
        fake: FakeProcess, tmp_path: Path) -> None:
    with hog():
        run = bench(tmp_path, fake.api_url, "hog")
    found = verdicts(run)
    assert [v["verdict"] for v in found] == ["contended"] * BLOCKS, found
    assert all(v["foreign_cores"] >= 0.5 for v in found), found
    # the analysis recomputes the same verdicts from host.jsonl
    analysis = analyze(read_run(run))
    assert all(b.host is not None and b.host.contended for b in analysis.blocks)
    assert analysis.quiet_only and analysis.primary["dedicated"].n_blocks == 0
    assert analysis.other["dedicated"].n_blocks == BLOCKS  # every block, shown beside it
    report = (run / "report.md").read_text()
    top = report[:report.index("## Postfork")]
    assert f"Host: {BLOCKS} of {BLOCKS} blocks contended (worst: other processes used" in top
    assert "Every usable block, contended ones included" in report
    summary = json.loads((run / "summary.json").read_text())
    assert summary["quiet_only"] is True and summary["host"]["blocks_contended"] == BLOCKS


def test_the_same_bench_on_a_quiet_machine_reports_its_blocks_quiet(
        fake: FakeProcess, tmp_path: Path) -> None:
    run = bench(tmp_path, fake.api_url, "calm")
    found = verdicts(run)
    assert [v["verdict"] for v in found] == ["quiet"] * BLOCKS, found
    analysis = analyze(read_run(run))
    assert analysis.primary["dedicated"].n_blocks == BLOCKS  # QUIET_ONLY keeps them all
    report = (run / "report.md").read_text()
    assert f"Host: {BLOCKS} of {BLOCKS} blocks quiet." in report
    assert "Every usable block, contended ones included" not in report
    # the run's own processes were found: the bench's tree and the fake server on its port
    host = [json.loads(line) for line in (run / "host.jsonl").read_text().splitlines()]
    assert any(fake.process is not None and fake.process.pid in line.get("server_pids", [])
               for line in host)
