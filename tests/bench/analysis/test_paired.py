"""Paired comparisons that restrict to what is comparable: tokens on equal-turn pairs, the fork
prefix's compaction in the serial rewrite-inclusive time, invalid-load blocks left out."""

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


def arm(block: int, name: str, postfork: float, turns: int, tokens: int,
        fork_rewrite: float | None = None) -> ArmRecord:
    return ArmRecord("dedicated", block, name, "original", "complete", postfork, rewrite_s=1.0,
                     turns=turns, reasoning_tokens=tokens, completion_tokens=tokens,
                     fork_rewrite_s=fork_rewrite)


def test_tokens_pair_on_equal_turns_and_fork_rewrite_is_added(tmp_path: Path) -> None:
    records = []
    for block in range(1, 6):
        records.append(arm(block, "clean", 100.0, 4, 1000))
        # block 5: the arm took one more turn, so its tokens are not comparable
        records.append(arm(block, "self", 80.0, 5 if block == 5 else 4, 600, fork_rewrite=10.0))
    write_records(tmp_path / "arms.jsonl", records)
    write_records(tmp_path / "blocks.jsonl", [BlockRecord("dedicated", b) for b in range(1, 6)])
    write_json(tmp_path / "manifest.json", {"arms": ["clean", "self"], "task": "t"})
    self_arm = analyze(read_run(tmp_path)).primary["dedicated"].arms["self"]
    assert self_arm.postfork.n == 5 and self_arm.reasoning_tokens.n == 4
    assert self_arm.reasoning_tokens.median_pct == -40.0
    assert self_arm.with_rewrite.median_pct == (81.0 - 101.0) / 101.0 * 100
    assert self_arm.with_fork_rewrite.median_pct == (91.0 - 101.0) / 101.0 * 100


def test_a_block_whose_load_was_invalid_is_left_out(tmp_path: Path) -> None:
    records = [arm(b, name, 100.0 if name == "clean" else 90.0, 4, 100)
               for b in (1, 2) for name in ("clean", "self")]
    write_records(tmp_path / "arms.jsonl", records)
    # block 2 ran under a shared regime's manifest but no background request was recorded
    write_records(tmp_path / "blocks.jsonl", [
        BlockRecord("shared", 1, started_s=0.0, ended_s=10.0),
        BlockRecord("shared", 2, started_s=20.0, ended_s=30.0)])
    write_records(tmp_path / "arms.jsonl", [ArmRecord(
        "shared", r.block, r.arm, r.attempt, r.status, r.postfork_s, turns=4) for r in records])
    write_json(tmp_path / "manifest.json", {"arms": ["clean", "self"], "task": "t",
                                            "regime": {"name": "shared", "background_users": 2}})
    analysis = analyze(read_run(tmp_path))
    assert analysis.primary["shared"].n_blocks == 0
    assert all(b.load_reasons == ("no background request ended or was in flight during the "
                                  "block: its 2 users sent nothing; see the load's log in the "
                                  "run folder's background/",) for b in analysis.blocks)
    assert all("invalid load" in "; ".join(b.reasons) for b in analysis.blocks)
