"""What the report says about the host (issue 30): at the top, how many blocks were contended;
a section with each contended block's figure; and, where the quiet blocks alone give another
analysis than every block (QUIET_ONLY or not), that analysis beside the primary one. The
verdicts come from bench/analysis/host.py through the run's analysis."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from compaction_bench.bench.analysis.host import (
    FOREIGN_CORES_LIMIT,
    UNKNOWN,
    HostVerdict,
    contended_line,
)
from compaction_bench.bench.analysis.paired import Comparison, RunAnalysis
from compaction_bench.bench.report.document import Bullets, Paragraph, Section, Table

# (comparisons, caption) -> the postfork comparison table (run_report.comparison_table)
TableOf = Callable[[Mapping[str, Comparison], str], Table]


def _verdicts(analysis: RunAnalysis) -> list[HostVerdict]:
    return [b.host for b in analysis.blocks if b.host is not None]


def host_line(analysis: RunAnalysis) -> str | None:
    """'Host: 2 of 6 blocks contended (worst: other processes used ...).', with the
    restriction in force; None where no block has a host verdict (a run from before it)."""
    line = contended_line(_verdicts(analysis))
    if line is None:
        return None
    if analysis.quiet_only:
        line += " QUIET_ONLY: the primary analysis uses the quiet blocks only."
    elif differs(analysis):
        line += " The analysis of the quiet blocks alone is shown beside the primary one."
    return line


def differs(analysis: RunAnalysis) -> bool:
    """Whether the other analysis (every block, or the quiet ones) covers other blocks."""
    return any(analysis.other.get(name) is not None
               and analysis.other[name].blocks != comparison.blocks
               for name, comparison in analysis.primary.items())


def host_sections(analysis: RunAnalysis, table: TableOf) -> tuple[Section, ...]:
    """The host section: contended blocks with their figures, then the other analysis where it
    differs from the primary one; nothing where no block has a host verdict."""
    verdicts = _verdicts(analysis)
    if not verdicts or all(v.verdict == UNKNOWN for v in verdicts):
        return ()
    section = Section("Host: other processes on this machine").add(Paragraph(
        "While each block's arms ran, the bench sampled the host's CPUs once a second "
        "(host.jsonl): a block is contended where processes outside the run's own (the bench, "
        "its children and the local server's process tree) used at least "
        f"{FOREIGN_CORES_LIMIT:g} cores on average, or the hypervisor stole as much; such a "
        "block's times carry the other work's cost, which differs between arms that ran at "
        "different moments. Unknown: too few host samples."))
    hot = [f"{b.regime} block {b.block}: {b.host.figure()}" for b in analysis.blocks
           if b.host is not None and b.host.contended]
    unknown = [f"{b.regime} block {b.block}: {b.host.why}" for b in analysis.blocks
               if b.host is not None and b.host.verdict == UNKNOWN]
    section.add(Bullets(tuple(hot) or ("No block was contended.",)))
    if unknown:
        section.add(Paragraph("Blocks without a host verdict:"), Bullets(tuple(unknown)))
    if differs(analysis):
        if analysis.quiet_only:
            caption = "Every usable block, contended ones included (QUIET_ONLY is set)"
            words = ("QUIET_ONLY restricts the primary analysis to quiet blocks; here is the "
                     "same analysis over every usable block, contended ones included.")
        else:
            caption = "Quiet blocks only"
            words = ("The same analysis over the blocks whose host was quiet (QUIET_ONLY=1 "
                     "makes it the primary one). Where the two differ, the other processes "
                     "moved the figures.")
        section.add(Paragraph(words), table(analysis.other, caption))
    return (section,)


def host_summary(analysis: RunAnalysis) -> dict[str, Any]:
    """summary.json's host fields: the restriction, and per regime each block's verdict."""
    by_regime: dict[str, dict[str, Any]] = {}
    for b in analysis.blocks:
        if b.host is not None:
            by_regime.setdefault(b.regime, {})[str(b.block)] = b.host.to_json()
    return {"quiet_only": analysis.quiet_only,
            "host": {"blocks_contended": sum(b.host is not None and b.host.contended
                                             for b in analysis.blocks),
                     "blocks_quiet": sum(b.quiet for b in analysis.blocks),
                     "blocks": by_regime,
                     "other_analysis": ("every block" if analysis.quiet_only else "quiet blocks")
                     if differs(analysis) else None}}
