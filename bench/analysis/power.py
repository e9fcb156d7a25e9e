"""What the numbers can say: the analysis's false-positive rate, measured by seeded simulation,
and how many blocks would detect a given change with 80% power, from a run's own noise.

Noise model: per block, arm / clean = exp(effect + N(0, sigma)) with clean itself log-normal
(only ratios matter: the paired change is scale free). `sigma` is the block-to-block spread of
log(arm / clean): taken from the placebo arm where the run has one (pure noise), else from the
other arms' paired changes by a robust estimate (1.4826 x the median absolute deviation of their
log ratios around each arm's median), else 0.1.

- False positives: `false_positive_rate` draws `reps` runs of n blocks with no effect and counts
  how often the interval the analysis reports (`bench.analysis.stats.paired_change`, 95% percentile
  bootstrap of the median, here with `resamples` resamples) excludes 0.
- Power: the sample median of n paired changes has a standard error of about
  1.2533 * sigma / sqrt(n) (its asymptotic efficiency against the mean under normal noise), so a
  two-sided 95% interval excludes 0 with probability 0.8 once
  n = ((1.96 + 0.8416) * 1.2533 * sigma / log(1 + effect))^2. A test checks this against the
  simulation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compaction_bench.common.resampling import MIN_UNITS_FOR_INTERVAL, bootstrap_interval

Z_95 = 1.959964
Z_80 = 0.841621
MEDIAN_SE_FACTOR = 1.2533  # sqrt(pi / 2)
DEFAULT_SIGMA = 0.1
FPR_BLOCKS = (5, 25)


@dataclass(frozen=True)
class Sensitivity:
    """The run's noise and what it means for detection (see the module docstring)."""

    sigma: float
    sigma_source: str  # placebo | arms | default
    sigma_n: int
    false_positive: dict[int, float]  # blocks -> share of null runs whose interval excludes 0
    false_positive_reps: int
    blocks_for: dict[float, int]  # relative change (0.10, 0.25) -> blocks for 80% power

    def to_json(self) -> dict[str, object]:
        return {"sigma": self.sigma, "sigma_source": self.sigma_source, "sigma_n": self.sigma_n,
                "false_positive": {str(k): v for k, v in self.false_positive.items()},
                "false_positive_reps": self.false_positive_reps,
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


def detection_rate(n: int, sigma: float, effect: float, *, reps: int, resamples: int,
                   seed: int) -> float:
    """Share of simulated runs whose interval excludes 0 (the false-positive rate at effect 0)."""
    rng = np.random.default_rng([seed, n, int(effect * 1e6)])
    hits = 0
    for _ in range(reps):
        interval = bootstrap_interval(simulate_changes(rng, n, sigma, effect), rng, "median",
                                      resamples=resamples)
        hits += interval is not None and (interval[0] > 0 or interval[1] < 0)
    return hits / reps


def false_positive_rate(n: int, sigma: float, *, reps: int = 1000, resamples: int = 1000,
                        seed: int = 0) -> float:
    return detection_rate(n, sigma, 0.0, reps=reps, resamples=resamples, seed=seed)


def blocks_for_power(sigma: float, effect: float, power_z: float = Z_80) -> int:
    """Blocks needed to detect a relative change `effect` with 80% power (module docstring)."""
    n = ((Z_95 + power_z) * MEDIAN_SE_FACTOR * sigma / abs(math.log1p(effect))) ** 2
    return max(MIN_UNITS_FOR_INTERVAL, math.ceil(n))


def noise_figures(changes_pct: Mapping[str, Sequence[float]], *, seed: int = 0,
                reps: int = 500) -> Sensitivity:
    sigma, source, count = noise_sigma(changes_pct)
    return Sensitivity(
        sigma=sigma, sigma_source=source, sigma_n=count,
        false_positive={n: false_positive_rate(n, sigma, reps=reps, seed=seed)
                        for n in FPR_BLOCKS},
        false_positive_reps=reps,
        blocks_for={effect: blocks_for_power(sigma, effect) for effect in (0.10, 0.25)})
