"""The spread between runs of one configuration: `make bench REPEAT=k` (issue 30).

A run's interval covers the block-to-block variation on this server in the state it was in
while the run ran. It says nothing of how far a second run of the same configuration, on
another day or another host, lands. REPEAT=k runs the configuration k times in one run folder,
interleaved block by block (bench/run/config.py `position`, `repeat_of`): run r's block j is
block (j - 1) k + r, with block j's seeds and replay record and a cache of its own. Each run is
analysed on its own blocks exactly as a run without REPEAT would be (`paired.compare`), and the
spread is the distance between the highest and the lowest of their medians, beside the pooled
interval of all k runs' blocks. Where a run's median is not exact (censored blocks could move
it, `PairedChange.median_bound`), the spread is not stated.

`spread_of` does the same for separate run folders (`make compare`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_bench.bench.analysis.paired import (
    BlockStatus,
    Comparison,
    RunAnalysis,
    compare,
)
from compaction_bench.bench.analysis.stats import PairedChange
from compaction_bench.bench.runfolder import REFERENCE_ARM

# the one sentence every report prints beside its intervals: what they are conditional on
CONDITIONAL = ("Each interval covers the variation from block to block on this server in the "
               "state it was in during this run, not the variation between runs, hosts or "
               "days: `make bench REPEAT=k` (or `make compare` of repeated runs) shows that "
               "spread.")


def repeat_count(manifest: Mapping[str, Any]) -> int:
    """The run's REPEAT (its manifest's config; 1 where it has none)."""
    config = manifest.get("config")
    value = config.get("repeat") if isinstance(config, Mapping) else None
    return value if isinstance(value, int) and value >= 1 else 1


def repeat_of(block: int, repeat: int) -> int:
    """Which run of a REPEAT run block `block` belongs to (bench/run/config.py `repeat_of`)."""
    return (block - 1) % repeat + 1


@dataclass(frozen=True)
class Spread:
    """One arm in one regime (or pooled), in each of several runs."""

    name: str
    arm: str
    runs: tuple[PairedChange | None, ...]  # each run's postfork paired change (None: no blocks)
    pooled: PairedChange | None  # every run's blocks together (REPEAT); None for compare

    @property
    def medians(self) -> tuple[float, ...]:
        return tuple(c.median_pct for c in self.runs
                     if c is not None and c.median_pct is not None)

    @property
    def exact(self) -> bool:
        """Every run has a median that censored blocks cannot move."""
        return all(c is not None and c.median_pct is not None
                   and c.median_bound == "exact" for c in self.runs)

    @property
    def spread_pct(self) -> float | None:
        """Highest minus lowest median, in percentage points (None: fewer than two runs with an
        exact median)."""
        if not self.exact or len(self.medians) < 2:
            return None
        return max(self.medians) - min(self.medians)

    @property
    def outside(self) -> int:
        """How many runs' medians lie outside the pooled interval."""
        if self.pooled is None or self.pooled.ci_low_pct is None:
            return 0
        low, high = self.pooled.ci_low_pct, self.pooled.ci_high_pct
        return sum(not (low <= m <= (high if high is not None else float("inf")))
                   for m in self.medians)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arm": self.arm,
                "medians_pct": [None if c is None else c.median_pct for c in self.runs],
                "n": [0 if c is None else c.n for c in self.runs],
                "spread_pct": self.spread_pct, "outside_pooled_interval": self.outside}


def _blocks_of(blocks: Sequence[BlockStatus], run: int, repeat: int) -> list[BlockStatus]:
    return [b for b in blocks if repeat_of(b.block, repeat) == run]


def repeat_spreads(analysis: RunAnalysis) -> tuple[Spread, ...]:
    """Each arm's paired change in each REPEAT run, beside the pooled one; () without REPEAT."""
    repeat = repeat_count(analysis.records.manifest)
    if repeat < 2:
        return ()
    out = []
    for name, pooled in analysis.primary.items():
        runs = [compare(name, pooled.regimes, _blocks_of(analysis.blocks, r, repeat),
                        analysis.arms, quiet=analysis.quiet_only)
                for r in range(1, repeat + 1)]
        for arm in analysis.arms:
            if arm == REFERENCE_ARM or arm not in pooled.arms:
                continue
            out.append(Spread(name, arm, tuple(_postfork(c, arm) for c in runs),
                              pooled.arms[arm].postfork))
    return tuple(out)


def spread_of(name: str, arm: str, comparisons: Sequence[Comparison | None]) -> Spread:
    """The same arm in the same regime of separate runs (`make compare`)."""
    return Spread(name, arm, tuple(_postfork(c, arm) for c in comparisons), None)


def _postfork(comparison: Comparison | None, arm: str) -> PairedChange | None:
    if comparison is None or arm not in comparison.arms:
        return None
    change = comparison.arms[arm].postfork
    return change if change.n else None
