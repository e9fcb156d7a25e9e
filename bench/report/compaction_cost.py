"""What each compaction arm paid for its history (the study's T_R), and what its requests found
in the prefix cache, beside its time effect: the `self` arm rewrites each raw reasoning block in
a request of its own (fork prefix in its arm file, new blocks during the continuation), the
`self-inline` arm asks the target, in the agent's own context, for one summary
(histories/policies/inline.py), so its request is a prefix the engine may hold. A cache hit is
never a saving on its own: the postfork change stands in the same row."""

from __future__ import annotations

import statistics

from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.report.changes import time_effect
from compaction_bench.bench.report.document import Paragraph, Section, Table
from compaction_bench.bench.runfolder import REFERENCE_ARM, ArmRecord
from compaction_bench.common.markdown import MISSING
from compaction_bench.histories.policies.registry import arm_kind

KINDS = ("compaction", "inline")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _share(part: int | None, whole: int | None) -> float | None:
    return None if part is None or not whole else part / whole


def _cell(value: float | None, fmt: str, n: int, unit: str = "") -> str:
    return MISSING if value is None else f"{format(value, fmt)}{unit} (n={n})"


NOT_HERE = "not measured here (a recorded branch: its rewriting was done where it was recorded)"


def t_r(record: ArmRecord) -> float | None:
    """The arm's whole rewrite time: the fork prefix's, from its file, and the continuation's;
    None for a replayed recorded branch whose file records no rewrite (the study's `external`):
    its rewriting happened where it was recorded, and 0 would read as free."""
    if record.fork_rewrite_s is None and record.continuation == "recorded":
        return None
    return (record.fork_rewrite_s or 0.0) + (record.rewrite_s or 0.0)


def compaction_cost_section(analysis: RunAnalysis) -> list[Section]:
    """One row per regime and compaction arm over the primary analysis's blocks; no section
    where no compaction arm ran."""
    arms = [a for a in analysis.arms if a != REFERENCE_ARM and arm_kind(a) in KINDS]
    if not arms:
        return []
    rows = []
    for regime, comparison in analysis.primary.items():
        if regime not in analysis.regimes:
            continue  # pooled: the per-regime rows say it
        used = set(comparison.blocks)
        for arm in arms:
            records = [r for r in analysis.records.arms
                       if r.arm == arm and r.attempt == "original" and r.status == "complete"
                       and (r.regime, r.block) in used]
            if not records:
                continue
            asked = [r for r in records if r.rewrite_prompt_tokens]
            hit = [s for r in asked
                   if (s := _share(r.rewrite_cached_tokens, r.rewrite_prompt_tokens)) is not None]
            after = [s for r in records
                     if (s := _share(r.fork_cached_tokens, r.fork_prompt_tokens)) is not None]
            rows.append((
                regime, arm, "in context, one summary" if arm_kind(arm) == "inline"
                else "per reasoning block",
                _cell(_median(known), ".1f", len(known), " s") if (known := [
                    t for r in records if (t := t_r(r)) is not None]) else NOT_HERE,
                _cell(_median([float(r.rewrite_requests or 0) + float(
                    r.fork_rewrite_requests or 0) for r in records]), ".0f", len(records)),
                _cell(_median([float(r.rewrite_prompt_tokens or 0) for r in asked]), ".0f",
                      len(asked)),
                _cell(_median(hit), ".0%", len(hit)) if hit else (
                    "not recorded" if asked else "— (no request during the continuation)"),
                _cell(_median(after), ".0%", len(after)),
                time_effect(analysis, regime, arm)))
    if not rows:
        return []
    return [Section("What compaction cost and what it found in the cache").add(
        Paragraph("T_R: the arm's rewrite seconds (the fork prefix's compaction recorded in its "
                  "arm file plus the rewriting during the continuation; self-inline has no file "
                  "and pays its one compaction request at the fork). Compaction requests: the "
                  "fork file's and the continuation's. Their prompt tokens and the share of "
                  "them served from the prefix cache are the continuation's requests (the fork "
                  "file's are recorded in the file). First request after: the share of the "
                  "first postfork request's prompt served from the cache. The postfork change "
                  "is beside them because a cache hit is not a saving on its own. Medians over "
                  "the complete original attempts of the primary analysis's blocks."),
        Table(("Regime", "Arm", "How it compacts", "T_R (median)", "compaction requests",
               "their prompt tokens (median)", "of them cached (median)",
               "first request after: cached", "postfork change vs clean [95% CI]"),
              tuple(rows)))]
