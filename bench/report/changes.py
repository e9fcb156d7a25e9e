"""How a paired change is written in every report table: its median as the bound the censored
blocks leave (`PairedChange.median_bound`), its interval with a censored end in words, and the
two medians beside it with their ratio, each named, so no reader takes one for the other.

Nothing here prints inf: a censored end is "unbounded above" or "unbounded below", a median the
censored blocks can move is "≥ x", "≤ x", "≥ x and ≤ y" or "unbounded both ways", each with the
count of censored blocks.
"""

from __future__ import annotations

import math

from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.analysis.stats import MIN_BLOCKS_FOR_MEDIAN_INTERVAL, PairedChange
from compaction_bench.bench.runfolder import REFERENCE_ARM
from compaction_bench.common.markdown import MISSING, percent

CLEAN_CONTEXT = "clean median (context, not the change's base)"


def _pct(value: float, digits: int) -> str:
    return percent(value, digits, sign=True)


def median_text(change: PairedChange, digits: int = 2) -> str:
    """The median paired change where the censored blocks cannot move it; otherwise the bound
    they leave, with how many blocks were censored."""
    bound = change.median_bound
    if change.median_pct is None or bound is None:
        return MISSING
    count = f"({change.n_censored} of {change.n} censored)"
    low, high = change.median_low_pct, change.median_high_pct
    if bound == "exact":
        return _pct(change.median_pct, digits) + (
            f" ({change.n_censored} of {change.n} censored, which cannot move it)"
            if change.n_censored else "")
    if bound == "at least" and low is not None:
        return f"≥ {_pct(low, digits)} {count}"
    if bound == "at most" and high is not None:
        return f"≤ {_pct(high, digits)} {count}"
    if bound == "between" and low is not None and high is not None:
        return f"≥ {_pct(low, digits)} and ≤ {_pct(high, digits)} {count}"
    return f"unbounded both ways {count}"


def interval_text(change: PairedChange, digits: int = 1) -> str | None:
    """"[low, high]", an end a censored block left open written as "unbounded below/above:
    censored"; None where there is no interval."""
    low, high = change.ci_low_pct, change.ci_high_pct
    if low is None or high is None:
        return None
    open_low, open_high = math.isinf(low), math.isinf(high)
    left = "unbounded below" if open_low else f"{low:+.{digits}f}"
    right = "unbounded above" if open_high else f"{high:+.{digits}f}"
    if open_low and not open_high:
        left += ": censored"
    elif open_high:
        right += ": censored"
    return f"[{left}, {right}]"


def medians_text(change: PairedChange, digits: int = 0, *, unit: str = "") -> str:
    """The arm's and clean's medians with their ratio, named as such: context for the median
    of paired changes that follows them, never its base."""
    if change.arm_median is None or change.reference_median is None:
        return ""
    ratio = change.ratio_of_medians_pct
    return (f"medians {change.arm_median:.{digits}f}{unit} vs clean "
            f"{change.reference_median:.{digits}f}{unit}"
            + ("" if ratio is None else f" (ratio of medians {ratio:+.1f}%)"))


def change_cell(change: PairedChange, *, with_n: bool = False) -> str:
    """Median paired change with its interval, or the reason there is none. Where censored
    blocks (stopped at the wall limit) can move the median, the bound they leave is printed
    instead, with their count; an interval's end they leave open is written in words."""
    if change.n == 0:
        return "no paired blocks (n=0)"
    n = f" (n={change.n})" if with_n else ""
    interval = interval_text(change)
    if interval is None:
        return (f"{median_text(change)} (n={change.n}: no interval below "
                f"{MIN_BLOCKS_FOR_MEDIAN_INTERVAL} blocks; [min, max] covers the median "
                f"{change.widest_coverage:.1%} only)")
    return f"{median_text(change)} {interval}{n}"


def time_effect(analysis: RunAnalysis, regime: str, source: str) -> str:
    """The paired postfork change of arm `source` in `regime` (the clean arm: its median, the
    context), or what the source is where it is no arm (compressor, background)."""
    comparison = analysis.primary.get(regime)
    if comparison is None:
        return MISSING
    if source == REFERENCE_ARM:
        return (MISSING if comparison.clean_median_s is None
                else f"reference: {CLEAN_CONTEXT} {comparison.clean_median_s:.1f} s "
                f"(n={comparison.n_blocks})")
    found = comparison.arms.get(source)
    return change_cell(found.postfork, with_n=True) if found is not None else (
        "— (not an arm: its requests serve the arms or the load)")
