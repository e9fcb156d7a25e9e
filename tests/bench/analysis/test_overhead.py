"""The harness-overhead figures from a run folder with known spans (real files, real reader)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.bench.analysis.overhead import TARGET_RATIO, harness_overhead, overhead_lines
from compaction_bench.bench.runfolder import (
    ArmRecord,
    BlockRecord,
    PhaseRecord,
    read_run,
    write_json,
    write_records,
)


def test_block_ratio_and_time_outside_blocks_from_known_spans(tmp_path: Path) -> None:
    write_json(tmp_path / "manifest.json", {"run_id": "spans", "arms": ["clean", "self"]})
    write_records(tmp_path / "blocks.jsonl", [
        BlockRecord("dedicated", 1, started_s=10.0, ended_s=22.0, released_s=11.0),
        BlockRecord("dedicated", 2, started_s=22.0, ended_s=31.0, released_s=22.5),
    ])
    write_records(tmp_path / "arms.jsonl", [
        ArmRecord("dedicated", 1, "clean", "original", "complete", 10.0),
        ArmRecord("dedicated", 1, "self", "original", "complete", 8.0),
        ArmRecord("dedicated", 2, "clean", "original", "complete", 8.8),
        ArmRecord("dedicated", 2, "self", "original", "complete", 9.0),
    ])
    write_records(tmp_path / "phases.jsonl", [
        PhaseRecord("server_start", 1.0, 6.0),
        PhaseRecord("selfcheck", 6.0, 8.0),
        PhaseRecord("service_probe", 8.0, 9.0),
        PhaseRecord("compressor_start", 12.0, 15.0),
        PhaseRecord("invocation", 0.0, 40.0),
    ])
    overhead = harness_overhead(read_run(tmp_path))
    first, second = overhead.blocks
    assert first.ratio == pytest.approx(12.0 / 10.0) and first.setup_s == pytest.approx(1.0)
    assert second.ratio == pytest.approx(9.0 / 9.0)
    (run,) = overhead.invocations
    assert (run.wall_s, run.server_start_s, run.blocks_s, run.blocks) == (40.0, 5.0, 21.0, 2)
    assert run.outside_s == pytest.approx(40.0 - 5.0 - 21.0)
    assert run.compressor_start_s == pytest.approx(3.0)
    summary = overhead.to_json()
    assert [b["block"] for b in summary["blocks_over_target"]] == [1] and first.ratio > TARGET_RATIO
    text = "\n".join(overhead_lines(overhead))
    assert "max 1.200" in text and "dedicated 1 (1.20)" in text and "outside server start and " \
        "blocks 14.0 s" in text


def test_a_run_without_phases_says_the_split_was_not_recorded(tmp_path: Path) -> None:
    write_records(tmp_path / "blocks.jsonl", [BlockRecord("dedicated", 1)])  # no span
    write_records(tmp_path / "arms.jsonl", [
        ArmRecord("dedicated", 1, "clean", "original", "complete", 10.0)])
    text = "\n".join(overhead_lines(harness_overhead(read_run(tmp_path))))
    assert "(n=0)" in text and "not recorded (no phases.jsonl" in text


@pytest.mark.parametrize(("side_by_side", "arms_s"), [(True, 9.5), (False, 4.0 + 0.5 + 5.0)])
def test_the_arms_own_time_counts_rewriting_and_sums_arms_run_one_after_another(
        tmp_path: Path, side_by_side: bool, arms_s: float) -> None:
    write_json(tmp_path / "manifest.json", {"run_id": "own", "arms": ["clean", "self"],
                                             "config": {"side_by_side": side_by_side}})
    write_records(tmp_path / "blocks.jsonl", [
        BlockRecord("dedicated", 1, started_s=0.0, ended_s=10.0, released_s=0.0)])
    write_records(tmp_path / "arms.jsonl", [
        ArmRecord("dedicated", 1, "clean", "original", "complete", 4.0, rewrite_s=0.0),
        # the self arm's inline rewriting is its own time, not the harness's
        ArmRecord("dedicated", 1, "self", "original", "complete", 5.0, rewrite_s=4.5 if
                  side_by_side else 0.5)])
    (block,) = harness_overhead(read_run(tmp_path)).blocks
    assert block.arms_s == pytest.approx(arms_s)
    assert block.ratio == pytest.approx(10.0 / arms_s)
