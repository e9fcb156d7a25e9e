"""Paired statistics over blocks: percent changes, medians and their intervals, percentiles.

Every function is pure; randomness comes in as a seeded `numpy.random.Generator`. Intervals are
the suite's one bootstrap convention (`common.resampling`), resampling whole blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compaction_bench.common.resampling import RESAMPLES, bootstrap_interval

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class PairedChange:
    """The paired comparison of one arm against the reference over the same n blocks.

    `changes_pct[i]` is 100 * (arm_i - ref_i) / ref_i for block i. The interval is None when
    n < MIN_UNITS_FOR_INTERVAL (`common.resampling`). `n_faster` counts blocks where the arm is
    strictly lower.
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
    rng: np.random.Generator,
    *,
    resamples: int = RESAMPLES,
) -> PairedChange:
    """Median paired percent change of `arm` vs `reference`, its interval and direction counts.

    The interval resamples whole blocks, because the arms of a block share load, cache state
    and start time: their paired change is one observation."""
    changes = percent_changes(arm, reference)
    interval = bootstrap_interval(changes, rng, "median", resamples=resamples)
    return PairedChange(
        n=int(changes.size),
        changes_pct=tuple(float(c) for c in changes),
        median_pct=median_or_none(changes.tolist()),
        ci_low_pct=interval[0] if interval else None,
        ci_high_pct=interval[1] if interval else None,
        n_faster=int(np.sum(changes < 0)),
        n_equal=int(np.sum(changes == 0)),
        n_slower=int(np.sum(changes > 0)),
        arm_median=median_or_none(list(arm)),
        reference_median=median_or_none(list(reference)),
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
