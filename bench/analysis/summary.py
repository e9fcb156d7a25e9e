"""summary.json: the machine-readable figures of one run (schema in bench/summary_schema.md).

Built from the same `RunAnalysis` the report renders, so every number appears once in the code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from compaction_bench.bench.analysis.overhead import harness_overhead
from compaction_bench.bench.analysis.paired import POOLED, ArmComparison, Comparison, RunAnalysis
from compaction_bench.bench.analysis.stats import MIN_BLOCKS_FOR_MEDIAN_INTERVAL, PairedChange
from compaction_bench.bench.runfolder import REFERENCE_ARM
from compaction_bench.common.resampling import CONFIDENCE, RESAMPLES

SUMMARY_SCHEMA_VERSION = 3


def unbounded(change: PairedChange) -> str | None:
    """Which end of the interval a censored block left open ("low", "high", "both"): JSON
    writes that end as null, so this says it is unbounded, not missing."""
    ends = [name for name, end in (("low", change.ci_low_pct), ("high", change.ci_high_pct))
            if end is not None and math.isinf(end)]
    return "both" if len(ends) == 2 else ends[0] if ends else None


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value


def median_bounds(change: PairedChange) -> dict[str, Any]:
    """What the median is given the censored blocks: `median_bound` "exact" (they cannot move
    it), "at least", "at most", "between" or "unknown", and the least and most it can be (null
    where unbounded)."""
    return {"median_bound": change.median_bound,
            "median_low_pct": _finite(change.median_low_pct),
            "median_high_pct": _finite(change.median_high_pct)}


def _paired(change: PairedChange) -> dict[str, Any]:
    return {
        "n": change.n,
        "median": change.arm_median,
        "clean_median": change.reference_median,
        "ratio_of_medians_pct": change.ratio_of_medians_pct,
        "paired_median_change_pct": change.median_pct,
        **median_bounds(change),
        "ci_low_pct": change.ci_low_pct,
        "ci_high_pct": change.ci_high_pct,
        "ci_coverage": change.coverage,
        "ci_unbounded": unbounded(change),
        "n_censored": change.n_censored,
        "n_lower": change.n_faster,
        "n_equal": change.n_equal,
        "n_higher": change.n_slower,
    }


def _arm(analysis: RunAnalysis, comparison: Comparison, arm: str) -> dict[str, Any]:
    found: ArmComparison | None = comparison.arms.get(arm)
    cache = (
        analysis.cache_rate(comparison.name, arm) if comparison.name != POOLED else None
    )
    entry: dict[str, Any] = {
        "blocks_complete": comparison.n_blocks,
        "median_postfork_s": (
            comparison.clean_median_s if found is None else found.postfork.arm_median
        ),
        "paired_median_change_pct": None,
        "ci_low_pct": None,
        "ci_high_pct": None,
        "share_faster": None,
        "cache_hit_rate": cache.hit_rate if cache else None,
        "cache_requests": cache.n_requests if cache else 0,
    }
    if found is not None:
        entry.update({
            "paired_median_change_pct": found.postfork.median_pct,
            **median_bounds(found.postfork),
            "ci_low_pct": found.postfork.ci_low_pct,
            "ci_high_pct": found.postfork.ci_high_pct,
            "ci_coverage": found.postfork.coverage,
            "ci_unbounded": unbounded(found.postfork),
            "n_censored": found.postfork.n_censored,
            "share_faster": found.postfork.share_faster,
            "n_faster": found.postfork.n_faster,
            "n_equal": found.postfork.n_equal,
            "n_slower": found.postfork.n_slower,
            "with_rewrite": _paired(found.with_rewrite),
            "with_fork_rewrite": _paired(found.with_fork_rewrite),
            "reasoning_tokens": _paired(found.reasoning_tokens),
            "completion_tokens": _paired(found.completion_tokens),
            "history_tokens": _paired(found.history_tokens),
        })
    return entry


def _cache_states(analysis: RunAnalysis, regime: str) -> dict[str, dict[str, int]]:
    """Per arm: how many original attempts found their fork cold, partial or warm."""
    out: dict[str, dict[str, int]] = {}
    for record in analysis.records.arms:
        if record.regime == regime and record.fork_cache_state is not None:
            counts = out.setdefault(record.arm, {})
            counts[record.fork_cache_state] = counts.get(record.fork_cache_state, 0) + 1
    return out


def _comparison(analysis: RunAnalysis, comparison: Comparison) -> dict[str, Any]:
    return {
        "regimes": list(comparison.regimes),
        "blocks_complete": comparison.n_blocks,
        "blocks": [[regime, block] for regime, block in comparison.blocks],
        "arms": {arm: _arm(analysis, comparison, arm) for arm in analysis.arms},
    }


def _section(analysis: RunAnalysis, comparisons: Mapping[str, Comparison]) -> dict[str, Any]:
    return {name: _comparison(analysis, comparisons[name]) for name in analysis.regimes}


def build_summary(analysis: RunAnalysis) -> dict[str, Any]:
    """The summary.json object of one analysed run."""
    regimes = _section(analysis, analysis.primary)
    for name, entry in regimes.items():
        blocks = [b for b in analysis.blocks if b.regime == name]
        entry["blocks_total"] = len(blocks)
        entry["blocks_unusable"] = [
            {"block": b.block, "reasons": list(b.reasons)} for b in blocks if not b.complete
        ]
        entry["blocks_invalid_load"] = [
            {"block": b.block, "reasons": list(b.load_reasons)} for b in blocks
            if b.load_reasons]
        entry["load"] = {str(b.block): b.load.to_json() for b in blocks if b.load is not None}
        entry["fork_cache_states"] = _cache_states(analysis, name)
        entry["max_requests_waiting"] = analysis.max_waiting.get(name)
        check = next((c for c in analysis.cache_check if c.regime == name), None)
        entry["cache_hit_rate_all_sources"] = check.from_requests if check else None
        entry["cache_hit_rate_metrics"] = check.from_metrics if check else None
    sensitivity = _section(analysis, analysis.sensitivity)
    for name, entry in sensitivity.items():
        entry["substitutions"] = [
            {"block": b.block, "arm": arm}
            for b in analysis.blocks if b.regime == name and b.sensitivity
            for arm in b.substituted
        ]
    pooled = analysis.primary.get(POOLED)
    pooled_sensitivity = analysis.sensitivity.get(POOLED)
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "run_id": analysis.run_id,
        "task": analysis.records.manifest.get("task"),
        "reference_arm": REFERENCE_ARM,
        "arms": list(analysis.arms),
        "seed": analysis.seed,
        "bootstrap_resamples": RESAMPLES,
        "confidence": CONFIDENCE,
        "interval": "order statistics of the median paired change (distribution-free)",
        "min_blocks_for_interval": MIN_BLOCKS_FOR_MEDIAN_INTERVAL,
        "regimes": regimes,
        "pooled": _comparison(analysis, pooled) if pooled else None,
        "sensitivity": {
            "regimes": sensitivity,
            "pooled": _comparison(analysis, pooled_sensitivity) if pooled_sensitivity else None,
        },
        "failures": [
            {"regime": f.regime, "arm": f.arm, "attempt": f.attempt, "reason": f.reason,
             "count": f.count}
            for f in analysis.failures
        ],
        "max_requests_waiting": analysis.max_waiting.get("all"),
        "serving": analysis.serving,
        "noise": analysis.noise.to_json(),
        "harness": harness_overhead(analysis.records).to_json(),
        "issues": [
            {"file": i.file, "line": i.line, "reason": i.reason} for i in analysis.records.issues
        ],
    }
