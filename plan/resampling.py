"""Quantile estimates and percentile intervals of bootstrap resamples.

A level has few continuations, and a plain bootstrap of a tail quantile from few values covers
it too rarely: resamples never exceed the sample's largest value. Measured on lognormal times
(400 seeded repetitions, B = 1000, p90): 74% of nominal-95% intervals covered the truth with 15
values, 92% with 30, 94% with 60. Two standard remedies bring it to nominal: the Harrell-Davis
estimate (a Beta-weighted average of all order statistics, smooth where the sample quantile
jumps between two of them) and a smoothed bootstrap (Silverman & Young 1987): each resampled
value gets Gaussian kernel noise in log space, bandwidth 1.06 n^(-1/5) times the level's
log-spread, rescaled so the spread is kept. Together: 92%, 96% and 96% on the same
repetitions.

A resample with no finite answer (no break-even, a curve that never reaches the SLO) is +inf;
the interval's ends are order statistics of the sorted resamples (no interpolation between a
finite value and infinity), so an end that falls among infinite resamples is infinite.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import beta


def quantile_weights(n: int, q: float) -> np.ndarray:
    """Harrell-Davis weights of the n order statistics for the q-quantile."""
    if n == 1:
        return np.ones(1)
    a, b = (n + 1) * q, (n + 1) * (1 - q)
    edges = beta.cdf(np.arange(n + 1) / n, a, b)
    return np.diff(edges)


def quantile(values: ArrayLike, q: float, axis: int = -1) -> np.ndarray:
    """The Harrell-Davis q-quantile of `values` along `axis` (a float for a 1-d input)."""
    data = np.sort(np.asarray(values, dtype=float), axis=axis)
    weights = quantile_weights(data.shape[axis], q)
    return np.asarray(np.tensordot(np.moveaxis(data, axis, -1), weights, axes=([-1], [0])))


def smoothed(values: np.ndarray, b: int, rng: np.random.Generator) -> np.ndarray:
    """`b` smoothed bootstrap resamples (rows) of positive `values` (module docstring)."""
    n = len(values)
    logs = np.log(values)
    draws = logs[rng.integers(0, n, size=(b, n))]
    spread = float(logs.std(ddof=1)) if n > 1 else 0.0
    if spread > 0:
        h = 1.06 * n ** -0.2
        mean = float(logs.mean())
        draws = mean + (draws + h * spread * rng.normal(size=(b, n)) - mean) / np.sqrt(1 + h * h)
    return np.asarray(np.exp(draws))


def interval(values: ArrayLike, confidence: float) -> tuple[float, float]:
    """The central `confidence` percentile interval of `values` (NaN left out; +inf kept)."""
    data = np.asarray(values, dtype=float)
    data = np.sort(data[~np.isnan(data)])
    if not len(data):
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2
    low = data[int(np.floor(tail * (len(data) - 1)))]
    high = data[int(np.ceil((1 - tail) * (len(data) - 1)))]
    return float(low), float(high)
