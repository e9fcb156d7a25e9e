"""Paired statistics over blocks: percent changes, medians and their intervals, percentiles.

Every function is pure. The interval of a median paired change is distribution-free: the order
statistics [x(k), x(n-k+1)] of the n per-block changes cover the true median with probability
1 - 2 P(Binomial(n, 1/2) <= k-1), exactly, for any continuous distribution of the changes (and at
least that with ties), because each block's change falls below the median with probability 1/2
independently of the others. `median_interval` takes the narrowest such interval (largest k)
whose coverage is at least `CONFIDENCE` and states that coverage; it replaces the percentile
bootstrap of a median, whose coverage falls far short with few blocks (the bootstrap distribution
of a median of 3-5 values collapses onto the sample's range: measured false-positive rates of
24.9% at 3 blocks, 13.6% at 4, 6.0% at 5, issue 22).

The rule below the minimum: no interval where none reaches `CONFIDENCE`. The widest one, [min,
max], covers the median with 1 - 2 (1/2)^n: 75% at 3 blocks, 87.5% at 4, 93.75% at 5, 96.9% at 6;
so a 95% interval exists from `MIN_BLOCKS_FOR_MEDIAN_INTERVAL` = 6 blocks, and below that the
report names the coverage [min, max] would have had instead of printing it as a 95% interval.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import bdtr

from compaction_bench.common.resampling import CONFIDENCE

PERCENTILES = (50, 90, 99)


def order_coverage(n: int, k: int) -> float:
    """Exact coverage of [x(k), x(n-k+1)] for the median of n independent draws (docstring)."""
    return float(1.0 - 2.0 * bdtr(k - 1, n, 0.5))


def median_rank(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The largest k whose order-statistic interval covers the median with at least
    `confidence`; None where even [min, max] falls short (fewer than the minimum blocks)."""
    found = None
    for k in range(1, n // 2 + 1):
        if order_coverage(n, k) < confidence:
            break
        found = k
    return found


MIN_BLOCKS_FOR_MEDIAN_INTERVAL = next(n for n in range(1, 100) if median_rank(n) is not None)


@dataclass(frozen=True)
class MedianInterval:
    """[low, high] = [x(k), x(n-k+1)] of n values, covering their median with `coverage`."""

    low: float
    high: float
    k: int
    n: int
    coverage: float


def median_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE,
                    *, widest: bool = False) -> MedianInterval | None:
    """The distribution-free interval of the median of `values` (module docstring); None below
    MIN_BLOCKS_FOR_MEDIAN_INTERVAL values, unless `widest` asks for [min, max] there (what a
    simulation of the rule's near miss measures, never what the report prints as an interval)."""
    data = np.sort(np.asarray(values, dtype=float))
    n = int(data.size)
    k = median_rank(n, confidence)
    if k is None:
        if not widest or n == 0:
            return None
        k = 1
    return MedianInterval(low=float(data[k - 1]), high=float(data[n - k]), k=k, n=n,
                          coverage=order_coverage(n, k))


@dataclass(frozen=True)
class PairedChange:
    """The paired comparison of one arm against the reference over the same n blocks.

    `changes_pct[i]` is 100 * (arm_i - ref_i) / ref_i for block i. The interval is the
    order-statistic interval of the median (`median_interval`), `coverage` its exact coverage; both
    are None below MIN_BLOCKS_FOR_MEDIAN_INTERVAL blocks, where `widest_coverage` says what
    [min, max] would have covered. `n_faster` counts blocks where the arm is strictly lower.
    """

    n: int
    changes_pct: tuple[float, ...]
    median_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    n_faster: int
    n_equal: int
    n_slower: int
    arm_median: float | None
    reference_median: float | None
    coverage: float | None = None
    n_censored: int = 0  # blocks where either side was stopped at the wall limit
    # the least and most the median can be, given the censored blocks (paired_change); None
    # with the median, -inf / +inf where the censored blocks leave that side unbounded
    median_low_pct: float | None = None
    median_high_pct: float | None = None

    @property
    def median_bound(self) -> str | None:
        """What the printed median is, given the censored blocks: "exact" (they cannot move
        it), "at least" `median_low_pct` (the high side is unbounded), "at most"
        `median_high_pct`, "between" the two (both finite, apart), or "unknown" (unbounded both
        ways); None without a median."""
        if self.median_pct is None:
            return None
        low = self.median_pct if self.median_low_pct is None else self.median_low_pct
        high = self.median_pct if self.median_high_pct is None else self.median_high_pct
        if low == high == self.median_pct:
            return "exact"
        if math.isinf(low) and math.isinf(high):
            return "unknown"
        if math.isinf(high):
            return "at least"
        if math.isinf(low):
            return "at most"
        return "between"

    @property
    def ratio_of_medians_pct(self) -> float | None:
        """100 * (arm's median / reference's median - 1): context beside the two medians, not
        the paired change (the median of per-block changes, which can differ from it)."""
        if self.arm_median is None or not self.reference_median:
            return None
        return 100.0 * (self.arm_median / self.reference_median - 1.0)

    @property
    def widest_coverage(self) -> float:
        """Coverage of [min, max] at this n: 1 - 2 (1/2)^n (0 without blocks)."""
        return order_coverage(self.n, 1) if self.n else 0.0

    @property
    def share_faster(self) -> float | None:
        return self.n_faster / self.n if self.n else None


@dataclass(frozen=True)
class Distribution:
    """Percentiles of a sample, with its size. Empty samples have n = 0 and no percentiles."""

    n: int
    percentiles: dict[int, float]
    mean: float | None


def median_or_none(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def percent_changes(arm: Sequence[float], reference: Sequence[float]) -> np.ndarray:
    """Per-block percent change of `arm` against `reference` (same order, same length)."""
    a = np.asarray(arm, dtype=float)
    r = np.asarray(reference, dtype=float)
    if a.shape != r.shape:
        raise ValueError(f"paired samples differ in length: {a.shape} vs {r.shape}")
    return np.asarray(100.0 * (a - r) / r)


def paired_change(
    arm: Sequence[float],
    reference: Sequence[float],
    *,
    arm_censored: Sequence[bool] | None = None,
    reference_censored: Sequence[bool] | None = None,
) -> PairedChange:
    """Median paired percent change of `arm` vs `reference`, its interval and direction counts.

    The unit is the block, because the arms of a block share load, cache state and start time:
    their paired change is one observation, and the blocks are the independent draws the
    order-statistic interval needs.

    Censoring: a value stopped at a wall limit is a lower bound of the true one, so a block's
    change is a lower bound where the arm was censored and an upper bound where the reference
    was. The interval's low end is taken from the changes with every reference-censored block at
    -inf, its high end with every arm-censored block at +inf: each is a bound of the true order
    statistic, so the coverage stated still holds (an end that reaches a censored block is
    unbounded). The median and the direction counts are of the observed values, and
    `n_censored` says how many blocks they rest on a bound. The same bounds bound the median:
    `median_low_pct` is the median with every reference-censored change at -inf (arm-censored
    ones at their observed value, a lower bound), `median_high_pct` with every arm-censored one
    at +inf; where both equal the observed median the censored blocks cannot move it
    (`PairedChange.median_bound`)."""
    changes = percent_changes(arm, reference)
    n = int(changes.size)
    arm_cut = np.asarray(arm_censored if arm_censored is not None else [False] * n, dtype=bool)
    ref_cut = np.asarray(reference_censored if reference_censored is not None else [False] * n,
                         dtype=bool)
    if arm_cut.shape != changes.shape or ref_cut.shape != changes.shape:
        raise ValueError(f"censoring flags differ in length from the {n} paired values")
    interval = median_interval(changes)
    lows, highs = np.sort(np.where(ref_cut, -np.inf, changes)), np.sort(
        np.where(arm_cut, np.inf, changes))
    low = high = None
    if interval is not None:
        low, high = float(lows[interval.k - 1]), float(highs[n - interval.k])
    return PairedChange(
        n=n,
        changes_pct=tuple(float(c) for c in changes),
        median_pct=median_or_none(changes.tolist()),
        ci_low_pct=low,
        ci_high_pct=high,
        n_faster=int(np.sum(changes < 0)),
        n_equal=int(np.sum(changes == 0)),
        n_slower=int(np.sum(changes > 0)),
        arm_median=median_or_none(list(arm)),
        reference_median=median_or_none(list(reference)),
        coverage=interval.coverage if interval else None,
        n_censored=int(np.sum(arm_cut | ref_cut)),
        # lows holds no +inf and highs no -inf, so neither median is nan
        median_low_pct=float(np.median(lows)) if n else None,
        median_high_pct=float(np.median(highs)) if n else None,
    )


def distribution(values: Sequence[float] | np.ndarray) -> Distribution:
    """p50/p90/p99 (linear interpolation) and mean of a sample."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Distribution(n=0, percentiles={}, mean=None)
    points = np.percentile(data, PERCENTILES)
    return Distribution(
        n=int(data.size),
        percentiles={p: float(v) for p, v in zip(PERCENTILES, points, strict=True)},
        mean=float(np.mean(data)),
    )


def counter_delta(values: Sequence[float]) -> float | None:
    """Increase of a cumulative counter over a series of samples, surviving server restarts.

    A drop means the counter restarted from zero, so the sample after the drop counts in full.
    """
    if len(values) < 2:
        return None
    total = 0.0
    for before, after in itertools.pairwise(values):
        total += after - before if after >= before else after
    return total
