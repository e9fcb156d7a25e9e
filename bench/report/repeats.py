"""The report's section on the spread between the runs of `make bench REPEAT=k`
(bench/analysis/repeats.py), and the spread column of `make compare`."""

from __future__ import annotations

from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.analysis.repeats import (
    CONDITIONAL,
    Spread,
    repeat_count,
    repeat_spreads,
)
from compaction_bench.bench.analysis.stats import PairedChange
from compaction_bench.bench.report.changes import interval_text, median_text
from compaction_bench.bench.report.document import Paragraph, Section, Table


def spread_text(spread: Spread) -> str:
    """The spread of the runs' medians in points, or why it is not stated."""
    if spread.spread_pct is not None:
        return (f"{spread.spread_pct:.1f} points ({min(spread.medians):+.1f}% to "
                f"{max(spread.medians):+.1f}%)")
    if not spread.exact and len(spread.medians) == len(spread.runs):
        return "not stated: censored blocks could move a run's median"
    return "not stated: a run has no paired blocks"


def _run_cell(change: PairedChange | None) -> str:
    return "no paired blocks" if change is None else f"{median_text(change)} (n={change.n})"


def repeat_sections(analysis: RunAnalysis) -> tuple[Section, ...]:
    """One section where the run has REPEAT > 1; none otherwise."""
    spreads = repeat_spreads(analysis)
    if not spreads:
        return ()
    k = repeat_count(analysis.records.manifest)
    rows = []
    for spread in spreads:
        pooled = spread.pooled
        assert pooled is not None  # repeat_spreads always gives the pooled change
        interval = interval_text(pooled) or "no interval (too few blocks)"
        rows.append((spread.name, spread.arm, *(_run_cell(c) for c in spread.runs),
                     spread_text(spread), f"{median_text(pooled)} {interval} (n={pooled.n})",
                     f"{spread.outside} of {k}"))
    return (Section(f"Between runs: the same configuration run {k} times (REPEAT={k})").add(
        Paragraph(f"The {k} runs were interleaved block by block (run 1's block 1, run 2's "
                  "block 1, ..., run 1's block 2, ...), each run's block j with block j's seeds "
                  "and record and a cache of its own, so the host's drift over the run falls on "
                  "every run alike. Each run is analysed on its own blocks as a run without "
                  "REPEAT would be: its median paired postfork change vs clean. The spread is "
                  "the highest run's median minus the lowest's; the last columns give the "
                  "pooled analysis of every run's blocks and how many runs' medians fall "
                  "outside its interval. " + CONDITIONAL),
        Table(("Regime", "Arm", *(f"run {r}" for r in range(1, k + 1)), "spread of medians",
               "all runs' blocks: median [95% interval]", "runs' medians outside it"),
              tuple(rows))),)


def repeat_summary(analysis: RunAnalysis) -> dict[str, object]:
    """summary.json's `repeat`, `between_runs` (one entry per regime and arm where REPEAT > 1,
    else empty) and `interval_conditional_on`."""
    return {"repeat": repeat_count(analysis.records.manifest),
            "between_runs": [s.to_json() for s in repeat_spreads(analysis)],
            "interval_conditional_on": CONDITIONAL}
