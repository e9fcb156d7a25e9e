"""A run folder with missing or damaged record files gives a report, not a crash, and the
report says which lines and blocks could not be used and why."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from compaction_bench.bench.report.run_report import write_report


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_truncated_and_incomplete_lines_are_reported(make_run: Callable[..., Path]) -> None:
    run = make_run(regimes=("dedicated", "shared"), blocks=4)
    arms = _lines(run / "arms.jsonl")
    # Line 2: dedicated block 1, arm external, loses its postfork time.
    broken = json.loads(arms[1])
    del broken["postfork_s"]
    arms[1] = json.dumps(broken) + "\n"
    # The last line (shared block 4, arm self) is cut mid-JSON, as after a crash.
    arms[-1] = arms[-1][: len(arms[-1]) // 2]
    (run / "arms.jsonl").write_text("".join(arms))
    # metrics.jsonl is cut short too.
    metrics = _lines(run / "metrics.jsonl")
    (run / "metrics.jsonl").write_text("".join(metrics[:-1]) + metrics[-1][:10])

    files = write_report(run)
    text = files.markdown.read_text()
    assert "arms.jsonl line 2: missing field 'postfork_s'" in text
    assert f"arms.jsonl line {len(arms)}: not valid JSON" in text
    assert "last line cut short" in text
    assert f"metrics.jsonl line {len(metrics)}" in text
    assert ("dedicated block 1: arm external: no usable original record "
            "(arms.jsonl line 2: missing field 'postfork_s')") in text
    assert "shared block 4: arm self: no usable original record" in text

    summary = json.loads(files.summary.read_text())
    assert summary["regimes"]["dedicated"]["blocks_complete"] == 3
    assert summary["regimes"]["shared"]["blocks_complete"] == 3
    unusable = summary["regimes"]["dedicated"]["blocks_unusable"]
    assert unusable[0]["block"] == 1 and "postfork_s" in unusable[0]["reasons"][0]
    assert len(summary["issues"]) == 3


def test_missing_files_are_reported(make_run: Callable[..., Path]) -> None:
    run = make_run(regimes=("dedicated",), blocks=3)
    (run / "arms.jsonl").unlink()
    (run / "manifest.json").unlink()
    files = write_report(run)
    text = files.markdown.read_text()
    assert "arms.jsonl: file is missing" in text
    assert "manifest.json: file is missing" in text
    # blocks.jsonl still names the three blocks; none can be used.
    assert "Blocks not used in the primary analysis: 3 of 3." in text
    assert "dedicated block 1: no usable arm records" in text
    summary = json.loads(files.summary.read_text())
    assert summary["run_id"] == run.name
    assert summary["regimes"]["dedicated"]["blocks_complete"] == 0


def test_failed_arm_with_recovery_enters_only_the_sensitivity(
    make_run: Callable[..., Path],
) -> None:
    run = make_run(regimes=("overloaded",), blocks=4, serving=False)
    arms = [json.loads(line) for line in _lines(run / "arms.jsonl")]
    target = next(a for a in arms if a["block"] == 2 and a["arm"] == "self")
    recovery = {**target, "attempt": "recovery", "postfork_s": target["postfork_s"] * 2}
    target.update(status="failed", error="ProtocolError: invalid tool 'edit'")
    (run / "arms.jsonl").write_text("".join(json.dumps(a) + "\n" for a in [*arms, recovery]))

    files = write_report(run)
    summary = json.loads(files.summary.read_text())
    assert summary["regimes"]["overloaded"]["blocks_complete"] == 3
    assert summary["sensitivity"]["regimes"]["overloaded"]["blocks_complete"] == 4
    assert summary["sensitivity"]["regimes"]["overloaded"]["substitutions"] == [
        {"block": 2, "arm": "self"}]
    assert summary["failures"] == [{"regime": "overloaded", "arm": "self", "attempt": "original",
                                    "reason": "ProtocolError: invalid tool 'edit'", "count": 1}]
    assert "overloaded block 2: self replaced by its recovery run" in files.markdown.read_text()


def test_a_block_without_its_block_record_is_not_complete(make_run: Callable[..., Path]) -> None:
    """Issue 22: arms that finished in a block whose record was never written (the server
    unhealthy after the arms, or a crash in between) counted as a complete block with no load
    verdict. It is left out, with why."""
    from compaction_bench.bench.analysis.paired import analyze
    from compaction_bench.bench.runfolder import read_run

    run = make_run(regimes=("shared",), blocks=6, serving=False)
    blocks = _lines(run / "blocks.jsonl")
    (run / "blocks.jsonl").write_text("".join(blocks[:-1]))  # block 6's record is missing
    analysis = analyze(read_run(run))
    (last,) = [b for b in analysis.blocks if b.block == 6]
    assert not last.complete and last.load is None
    assert "no block record: the block did not finish after its arms" in last.reasons[0]
    assert analysis.primary["shared"].arms["self"].postfork.n == 5
