"""The report's word on the host (issue 30): how many blocks were contended, at the top; the
quiet blocks' analysis beside the primary one where they differ; QUIET_ONLY making it the
primary one; summary.json's fields; and nothing where the run has no host samples."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.report.run_report import write_report
from compaction_bench.bench.runfolder import read_run
from compaction_bench.common.files import JsonlWriter


def with_host(run: Path, contended: set[int], *, quiet_only: bool = False) -> None:
    """host.jsonl over the run's clock: 1.6 foreign cores of 2 during the `contended` blocks,
    none elsewhere; with `quiet_only`, the manifest's config says QUIET_ONLY."""
    blocks = read_run(run).blocks
    end = max(b.ended_s or 0.0 for b in blocks)
    busy = own = 0.0
    with JsonlWriter(run / "host.jsonl") as out:
        t = 0.0
        while t <= end + 1:
            hot = any(b.block in contended and (b.started_s or 0) <= t <= (b.ended_s or 0)
                      for b in blocks)
            out.write({"t_s": t, "n_cpus": 2, "busy_s": busy, "own_s": own, "steal_s": None})
            busy, own, t = busy + 0.5 + (1.6 if hot else 0.0), own + 0.5, t + 1.0
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"] = {"quiet_only": quiet_only}
    (run / "manifest.json").write_text(json.dumps(manifest))


def summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())  # type: ignore[no-any-return]


def test_contended_blocks_are_counted_at_the_top_and_the_quiet_analysis_shown(
        make_run: Callable[..., Path]) -> None:
    run = make_run("hot", regimes=("dedicated",), blocks=8, serving=False)
    with_host(run, {1, 2})
    analysis = analyze(read_run(run))
    assert [b.block for b in analysis.blocks if b.host and b.host.contended] == [1, 2]
    assert analysis.primary["dedicated"].n_blocks == 8  # contended blocks stay in by default
    assert analysis.other["dedicated"].n_blocks == 6
    write_report(run)
    text = (run / "report.md").read_text()
    top = text[:text.index("## Postfork")]
    assert "Host: 2 of 8 blocks contended (worst: other processes used 1.6 of 2 cores" in top
    assert "Quiet blocks only" in text and "dedicated block 1: other processes used" in text
    found = summary(run)
    assert found["quiet_only"] is False and found["host"]["blocks_contended"] == 2
    assert found["host"]["blocks"]["dedicated"]["1"]["verdict"] == "contended"
    assert found["host"]["other_analysis"] == "quiet blocks"


def test_quiet_only_restricts_the_primary_analysis_and_shows_every_block_beside_it(
        make_run: Callable[..., Path]) -> None:
    run = make_run("quiet-only", regimes=("dedicated",), blocks=8, serving=False)
    with_host(run, {3}, quiet_only=True)
    analysis = analyze(read_run(run))
    assert analysis.quiet_only and analysis.primary["dedicated"].n_blocks == 7
    assert ("dedicated", 3) not in analysis.primary["dedicated"].blocks
    assert analysis.other["dedicated"].n_blocks == 8
    write_report(run)
    text = (run / "report.md").read_text()
    assert "QUIET_ONLY: the primary analysis uses the quiet blocks only" in text
    assert "Every usable block, contended ones included" in text
    assert summary(run)["host"]["other_analysis"] == "every block"


def test_a_quiet_run_says_so_and_shows_one_analysis(make_run: Callable[..., Path]) -> None:
    run = make_run("calm", regimes=("dedicated",), blocks=6, serving=False)
    with_host(run, set())
    write_report(run)
    text = (run / "report.md").read_text()
    assert "Host: 6 of 6 blocks quiet." in text and "Quiet blocks only" not in text
    assert summary(run)["host"]["other_analysis"] is None


def test_a_run_from_before_host_sampling_has_no_host_line(make_run: Callable[..., Path]) -> None:
    run = make_run("old", regimes=("dedicated",), blocks=6, serving=False)
    analysis = analyze(read_run(run))
    assert all(b.host is not None and b.host.verdict == "unknown" for b in analysis.blocks)
    write_report(run)
    text = (run / "report.md").read_text()
    assert "Host:" not in text and "Quiet blocks only" not in text
    assert summary(run)["host"]["blocks_contended"] == 0
