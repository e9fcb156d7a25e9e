"""An arm that waited for its compressor server's lazy start mid-block did not run side by side
with the other arms: the block is left out of the primary and the sensitivity analysis, with
the reason, and a later pass of the same block counts instead (real files, real reader)."""

from __future__ import annotations

from pathlib import Path

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.runfolder import (
    ArmRecord,
    BlockRecord,
    read_run,
    write_json,
    write_records,
)


def _arms(block: int, wait: float | None, block_pass: int | None = None) -> list[ArmRecord]:
    return [ArmRecord("dedicated", block, "clean", "original", "complete", 10.0,
                      block_pass=block_pass),
            ArmRecord("dedicated", block, "external", "original", "complete", 9.0,
                      helper_wait_s=wait, block_pass=block_pass)]


def test_a_block_with_a_long_helper_wait_is_not_compared(tmp_path: Path) -> None:
    write_json(tmp_path / "manifest.json", {"run_id": "wait", "arms": ["clean", "external"]})
    write_records(tmp_path / "arms.jsonl", [*_arms(1, None), *_arms(2, 216.3),
                                            *_arms(3, 0.4)])
    write_records(tmp_path / "blocks.jsonl", [BlockRecord("dedicated", b) for b in (1, 2, 3)])
    status = {b.block: b for b in analyze(read_run(tmp_path)).blocks}
    assert status[1].complete and status[3].complete  # no wait, or a negligible one
    assert not status[2].complete and not status[2].sensitivity
    assert any("arm external waited 216 s for its compressor server to start" in r
               for r in status[2].reasons), status[2].reasons


def test_the_next_pass_of_that_block_is_the_one_compared(tmp_path: Path) -> None:
    write_json(tmp_path / "manifest.json", {"run_id": "wait", "arms": ["clean", "external"]})
    write_records(tmp_path / "arms.jsonl", [*_arms(1, 216.3), *_arms(1, None, block_pass=2)])
    write_records(tmp_path / "blocks.jsonl", [BlockRecord("dedicated", 1),
                                              BlockRecord("dedicated", 1, block_pass=2)])
    (block,) = analyze(read_run(tmp_path)).blocks
    assert block.complete and all(r.block_pass == 2 for r in block.primary.values())
