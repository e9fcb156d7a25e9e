"""What the numbers can say: the analysis's false-positive rate, measured by seeded simulation,
and how many blocks would detect a given change with 80% power, from a run's own noise.

Noise model: per block, arm / clean = exp(effect + N(0, sigma)) with clean itself log-normal
(only ratios matter: the paired change is scale free). `sigma` is the block-to-block spread of
log(arm / clean): taken from the placebo arm where the run has one, else from the other arms'
paired changes by a robust estimate (1.4826 x the median absolute deviation of their log ratios
around each arm's median), else 0.1. The placebo is an A/A: clean's history with its own
sampling seed and cache salt (`bench.run.config`), so its spread is that of two independent
continuations of one history, the noise any arm's change must beat. Before issue 22 it had
clean's seed and cache, replayed clean's bytes and measured timing jitter only, so the blocks
this module said were needed read too low.

- False positives: `false_positive_rate` draws `reps` runs of n blocks with no effect and counts
  how often the interval the analysis reports (`bench.analysis.stats.paired_change`, the
  order-statistic interval of the median) excludes 0, at each n the run's own comparisons have.
  Below the n where a 95% interval exists none is reported; there the simulation measures the
  near miss, [min, max], so the report can say what printing it would have cost. The exact rate
  (1 - the interval's coverage) is given beside the measured one: they differ by simulation
  error only, and a larger gap means the analysis does not compute what the statistics say.
- Power, exactly under the noise model: the order-statistic interval [x(k), x(n-k+1)] lies
  above 0 when fewer than k of the n changes are <= 0, and each is with probability
  q = Phi(-log(1 + effect) / sigma), so a change is detected with probability
  P(Binomial(n, q) <= k-1) + P(Binomial(n, 1-q) <= k-1) (a sign test). `blocks_for_power` is the
  smallest n where that reaches 80%; the interval's conservative coverage at a given n (96.9-99.6%
  where 95% is asked) makes it larger than a normal approximation of the median's spread would
  say. A test checks it against the simulation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import bdtr, ndtr

from compaction_bench.bench.analysis.stats import (
    MIN_BLOCKS_FOR_MEDIAN_INTERVAL,
    median_interval,
    median_rank,
    order_coverage,
)
from compaction_bench.common.resampling import MIN_UNITS_FOR_INTERVAL

POWER = 0.8
MAX_BLOCKS = 10_000  # a search bound: beyond it "blocks for power" is not a useful figure
DEFAULT_SIGMA = 0.1


@dataclass(frozen=True)
class FalsePositive:
    """The false-positive rate at one of the run's n: measured over `reps` null runs, and exact.

    `reported` is False below MIN_BLOCKS_FOR_MEDIAN_INTERVAL, where the analysis prints no
    interval and the rate is that of [min, max] (the near miss), not of anything printed."""

    n: int
    rate: float
    exact: float
    reported: bool

    def to_json(self) -> dict[str, object]:
        return {"rate": self.rate, "exact": self.exact, "interval_reported": self.reported}


@dataclass(frozen=True)
class Sensitivity:
    """The run's noise and what it means for detection (see the module docstring)."""

    sigma: float
    sigma_source: str  # placebo | arms | default
    sigma_n: int
    false_positive: dict[int, FalsePositive]  # this run's blocks per comparison -> its rate
    false_positive_reps: int
    blocks_for: dict[float, int | None]  # relative change (0.10, 0.25) -> blocks for 80% power

    def to_json(self) -> dict[str, object]:
        return {"sigma": self.sigma, "sigma_source": self.sigma_source, "sigma_n": self.sigma_n,
                "false_positive": {str(k): v.to_json() for k, v in self.false_positive.items()},
                "false_positive_reps": self.false_positive_reps,
                "min_blocks_for_interval": MIN_BLOCKS_FOR_MEDIAN_INTERVAL,
                "blocks_for_80pct_power": {f"{k:.0%}": v for k, v in self.blocks_for.items()}}


def noise_sigma(changes_pct: Mapping[str, Sequence[float]]) -> tuple[float, str, int]:
    """(sigma, source, n) from paired percent changes per arm (see the module docstring)."""
    logs = {arm: np.log1p(np.asarray(v, dtype=float) / 100.0) for arm, v in changes_pct.items()
            if len(v) >= MIN_UNITS_FOR_INTERVAL}
    if "placebo" in logs:
        values = logs["placebo"]
        return float(np.std(values, ddof=1)), "placebo", int(values.size)
    deviations = np.concatenate([v - np.median(v) for v in logs.values()]) if logs else (
        np.array([]))
    if deviations.size >= MIN_UNITS_FOR_INTERVAL:
        sigma = 1.4826 * float(np.median(np.abs(deviations)))
        if sigma > 0:
            return sigma, "arms", int(deviations.size)
    return DEFAULT_SIGMA, "default", 0


def simulate_changes(rng: np.random.Generator, n: int, sigma: float,
                     effect: float = 0.0) -> np.ndarray:
    """One simulated run's paired percent changes (n blocks)."""
    clean = 60.0 * np.exp(rng.normal(0.0, 0.3, n))
    arm = clean * np.exp(math.log1p(effect) + rng.normal(0.0, sigma, n))
    return np.asarray(100.0 * (arm - clean) / clean)


def detection_rate(n: int, sigma: float, effect: float, *, reps: int, seed: int) -> float:
    """Share of simulated runs whose interval excludes 0 (the false-positive rate at effect 0);
    below the minimum blocks, of [min, max] (module docstring)."""
    rng = np.random.default_rng([seed, n, int(effect * 1e6)])
    hits = 0
    for _ in range(reps):
        interval = median_interval(simulate_changes(rng, n, sigma, effect), widest=True)
        hits += interval is not None and (interval.low > 0 or interval.high < 0)
    return hits / reps


def false_positive_rate(n: int, sigma: float, *, reps: int = 2000, seed: int = 0) -> float:
    return detection_rate(n, sigma, 0.0, reps=reps, seed=seed)


def false_positive(n: int, sigma: float, *, reps: int, seed: int) -> FalsePositive:
    """Measured and exact false-positive rate of the interval at n blocks (module docstring)."""
    k = median_rank(n)
    return FalsePositive(n=n, rate=false_positive_rate(n, sigma, reps=reps, seed=seed),
                         exact=1.0 - order_coverage(n, k or 1), reported=k is not None)


def detection_probability(n: int, sigma: float, effect: float) -> float:
    """Exact probability that the interval at n blocks excludes 0 (module docstring)."""
    k = median_rank(n)
    if k is None or sigma <= 0:
        return 0.0 if k is None else 1.0
    q = float(ndtr(-math.log1p(effect) / sigma))
    return float(bdtr(k - 1, n, q) + bdtr(k - 1, n, 1.0 - q))


def blocks_for_power(sigma: float, effect: float, power: float = POWER) -> int | None:
    """The fewest blocks detecting a relative change `effect` with `power` (module docstring);
    None when even MAX_BLOCKS would not."""
    return next((n for n in range(MIN_BLOCKS_FOR_MEDIAN_INTERVAL, MAX_BLOCKS)
                 if detection_probability(n, sigma, effect) >= power), None)


def noise_figures(changes_pct: Mapping[str, Sequence[float]], blocks: Iterable[int], *,
                  seed: int = 0, reps: int = 2000) -> Sensitivity:
    """The run's noise, the false-positive rate at each n in `blocks` (the sizes of the run's
    own comparisons) and the blocks needed for 80% power."""
    sigma, source, count = noise_sigma(changes_pct)
    return Sensitivity(
        sigma=sigma, sigma_source=source, sigma_n=count,
        false_positive={n: false_positive(n, sigma, reps=reps, seed=seed)
                        for n in sorted({n for n in blocks if n > 0})},
        false_positive_reps=reps,
        blocks_for={effect: blocks_for_power(sigma, effect) for effect in (0.10, 0.25)})
