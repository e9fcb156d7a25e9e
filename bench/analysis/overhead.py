"""The harness's own share of a run's time: how much longer a block takes than its arms' own
time (postfork plus rewriting: the slowest arm's where the arms ran side by side, their sum
where they ran one after another), and how much of each invocation of `make bench` went neither
to starting servers nor to blocks. From `blocks.jsonl`, `arms.jsonl` and `phases.jsonl`; runs
without phases (older or imported ones) get the block figures only."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from compaction_bench.bench.runfolder import PhaseRecord, RunRecords

TARGET_RATIO = 1.1  # a block should last at most 10% longer than its arms' own time


@dataclass(frozen=True)
class BlockOverhead:
    """One block pass: its wall time against its original arms' own time."""

    regime: str
    block: int
    block_pass: int
    wall_s: float
    arms_s: float  # the slowest arm's postfork + rewrite, or the sum one after another
    setup_s: float | None  # from the block's start to the arms' release (workspaces, rewrites)

    @property
    def ratio(self) -> float:
        return self.wall_s / self.arms_s


@dataclass(frozen=True)
class InvocationOverhead:
    """One `make bench` invocation (a resumed run has several), up to its report's start."""

    wall_s: float
    server_start_s: float
    compressor_start_s: float  # lazy helper starts; they happen inside blocks
    selfcheck_s: float
    service_probe_s: float
    blocks_s: float
    blocks: int

    @property
    def outside_s(self) -> float:
        """Time neither starting the server nor running blocks: the self-check, the probe, the
        background's start and stop, telemetry and the harness's own bookkeeping."""
        return self.wall_s - self.server_start_s - self.blocks_s


@dataclass(frozen=True)
class HarnessOverhead:
    blocks: tuple[BlockOverhead, ...]
    invocations: tuple[InvocationOverhead, ...]

    def ratios(self) -> list[float]:
        return [b.ratio for b in self.blocks]

    def to_json(self) -> dict[str, Any]:
        ratios = self.ratios()
        return {
            "target_ratio": TARGET_RATIO,
            "block_ratio_median": statistics.median(ratios) if ratios else None,
            "block_ratio_max": max(ratios) if ratios else None,
            "blocks_over_target": [
                {"regime": b.regime, "block": b.block, "block_pass": b.block_pass,
                 "ratio": b.ratio} for b in self.blocks if b.ratio > TARGET_RATIO],
            "blocks": [{**asdict(b), "ratio": b.ratio} for b in self.blocks],
            "invocations": [{**asdict(i), "outside_s": i.outside_s} for i in self.invocations],
        }


def harness_overhead(records: RunRecords) -> HarnessOverhead:
    """Every block pass with a span and at least one timed original arm, and every invocation
    recorded in phases.jsonl."""
    config = records.manifest.get("config")
    apart = isinstance(config, dict) and config.get("side_by_side") is False
    blocks = []
    for block in records.blocks:
        if block.started_s is None or block.ended_s is None:
            continue
        block_pass = block.block_pass or 1
        own = [a.postfork_s + (a.rewrite_s or 0.0) for a in records.arms
               if a.regime == block.regime and a.block == block.block
               and a.attempt == "original" and (a.block_pass or 1) == block_pass]
        slowest = sum(own) if apart else max(own, default=0.0)
        if slowest <= 0:
            continue
        setup = (block.released_s - block.started_s) if block.released_s is not None else None
        blocks.append(BlockOverhead(block.regime, block.block, block_pass,
                                    block.ended_s - block.started_s, slowest, setup))
    invocations = []
    for inv in (p for p in records.phases if p.phase == "invocation"):
        inside = [p for p in records.phases
                  if p.phase != "invocation" and inv.started_s <= p.started_s <= inv.ended_s]

        def total(name: str, inside: list[PhaseRecord] = inside) -> float:
            return float(sum(p.ended_s - p.started_s for p in inside if p.phase == name))

        spans = [(b.started_s, b.ended_s) for b in records.blocks
                 if b.started_s is not None and b.ended_s is not None
                 and inv.started_s <= b.started_s <= inv.ended_s]
        invocations.append(InvocationOverhead(
            wall_s=inv.ended_s - inv.started_s, server_start_s=total("server_start"),
            compressor_start_s=total("compressor_start"), selfcheck_s=total("selfcheck"),
            service_probe_s=total("service_probe"),
            blocks_s=sum(end - start for start, end in spans), blocks=len(spans)))
    return HarnessOverhead(tuple(blocks), tuple(invocations))


def overhead_lines(overhead: HarnessOverhead) -> list[str]:
    """The report's run-section bullets."""
    lines = []
    ratios = overhead.ratios()
    if ratios:
        over = [b for b in overhead.blocks if b.ratio > TARGET_RATIO]
        setups = [b.setup_s for b in overhead.blocks if b.setup_s is not None]
        lines.append(
            f"harness share per block: block wall time / its arms' own time (postfork + "
            f"rewrite; the slowest arm's, or the sum where arms ran one after another), median "
            f"{statistics.median(ratios):.3f}, max {max(ratios):.3f} (n={len(ratios)} block "
            f"passes; target <= {TARGET_RATIO}"
            + (f"; over it: {', '.join(f'{b.regime} {b.block} ({b.ratio:.2f})' for b in over)}"
               if over else "") + ")"
            + (f"; setup before release median {statistics.median(setups):.2f} s"
               if setups else ""))
    else:
        lines.append("harness share per block: no block with a span and a timed arm (n=0)")
    for number, inv in enumerate(overhead.invocations, 1):
        label = "run" if len(overhead.invocations) == 1 else f"invocation {number}"
        lines.append(
            f"{label} wall time to the report: {inv.wall_s:.1f} s = server start "
            f"{inv.server_start_s:.1f} s + {inv.blocks} blocks {inv.blocks_s:.1f} s (lazy "
            f"compressor start inside them: {inv.compressor_start_s:.1f} s) + harness outside "
            f"server start and blocks {inv.outside_s:.1f} s (self-check {inv.selfcheck_s:.1f} s, "
            f"service probe {inv.service_probe_s:.1f} s, background start/stop and the rest "
            f"{inv.outside_s - inv.selfcheck_s - inv.service_probe_s:.1f} s)")
    if not overhead.invocations:
        lines.append("harness time outside blocks: not recorded (no phases.jsonl: a run from "
                     "before it existed, or imported)")
    return lines
