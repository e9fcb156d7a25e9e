"""A monotone load-response curve through measured levels, and its inverse at a target.

The measured statistic per level (a quantile of postfork time, a mean cycle time) is first made
non-decreasing in N by weighted isotonic regression (pool-adjacent-violators, weights = the
level's continuations): more agents on one server never make an agent faster, so a dip between
two levels is noise. Scipy's PCHIP then interpolates the pooled values; it keeps their
monotonicity and reproduces a straight line exactly. Beyond the measured levels the curve goes on
as the straight line of its last (or first) segment, and every value there is flagged
extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.interpolate import PchipInterpolator


def isotonic(values: ArrayLike, weights: ArrayLike) -> np.ndarray:
    """The weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for value, weight in zip(np.asarray(values, dtype=float), np.asarray(weights, dtype=float),
                             strict=True):
        blocks.append([float(value), float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks[-1]
            total = a[1] + b[1]
            a[0] = (a[0] * a[1] + b[0] * b[1]) / total if total else (a[0] + b[0]) / 2
            a[1], a[2] = total, a[2] + b[2]
    out: list[float] = []
    for mean, _, count in blocks:
        out += [mean] * int(count)
    return np.asarray(out)


@dataclass(frozen=True)
class Inverse:
    """The largest N whose curve value meets a target. `value` is None when even the smallest
    measured level (extrapolated down to N = 0) misses it, and math.inf when the curve never
    reaches the target (flat beyond the measured levels)."""

    value: float | None
    extrapolated: bool


def end_slopes(levels: np.ndarray, fitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per fitted curve (a row), the slopes it goes on with below its first level and above its
    last: the end segment's, or where pooling left that end flat, the secant from the end to
    the nearest level whose value differs. A flat end is the isotonic fit's, not the load's: two
    measured quantiles that dipped (73.7 s at N = 8 under 74.9 s at N = 4, on a curve rising to
    83 s) pool into one value, and a flat last segment extrapolated flat read "beyond measured
    range: > 16" for a true 5.5 (issue 29). Only a curve flat at every level stays flat."""
    x, f = np.asarray(levels, dtype=float), np.atleast_2d(fitted)
    rows = len(f)
    if len(x) < 2:
        return np.zeros(rows), np.zeros(rows)
    last = len(x) - 1
    lower = f[:, :-1] < f[:, -1:]  # levels below the top value
    has_low = lower.any(axis=1)
    k = last - 1 - np.argmax(lower[:, ::-1], axis=1)  # the nearest such level to the top
    upper = f[:, 1:] > f[:, :1]  # levels above the first value
    has_up = upper.any(axis=1)
    j = 1 + np.argmax(upper, axis=1)
    index = np.arange(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        top = np.where(has_low, (f[:, -1] - f[index, k]) / (x[-1] - x[k]), 0.0)
        bottom = np.where(has_up, (f[index, j] - f[:, 0]) / (x[j] - x[0]), 0.0)
    return bottom, top


class MonotoneCurve:
    """The fitted curve (module docstring). `levels` ascending, one value per level."""

    def __init__(self, levels: ArrayLike, values: ArrayLike,
                 weights: ArrayLike | None = None) -> None:
        x = np.asarray(levels, dtype=float)
        if len(x) == 0 or np.any(np.diff(x) <= 0):
            raise ValueError(f"levels must be ascending and distinct, got {x.tolist()}")
        w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=float)
        self.levels = x
        self.measured = np.asarray(values, dtype=float)
        self.fitted = isotonic(self.measured, w)
        self._pchip = PchipInterpolator(x, self.fitted) if len(x) >= 2 else None

    @property
    def low(self) -> float:
        return float(self.levels[0])

    @property
    def high(self) -> float:
        return float(self.levels[-1])

    def _slope(self, end: int) -> float:
        """The slope the curve goes on with past one end (`end` 0: below the first level, -1:
        above the last): its end segment's, or where the fit is flat at that end (pooled
        levels), the secant to the nearest level with another value (`end_slopes`)."""
        first, last = end_slopes(self.levels, self.fitted[None, :])
        return float(first[0] if end == 0 else last[0])

    def __call__(self, n: float) -> float:
        if self._pchip is None:
            return float(self.fitted[0])
        if n > self.high:
            return float(self.fitted[-1] + self._slope(-1) * (n - self.high))
        if n < self.low:
            return float(self.fitted[0] + self._slope(0) * (n - self.low))
        return float(self._pchip(n))

    def extrapolated(self, n: float) -> bool:
        return not self.low <= n <= self.high

    def inverse(self, target: float) -> Inverse:
        """The largest N (real-valued) with curve(N) <= target (see `Inverse`)."""
        top = float(self.fitted[-1])
        if top <= target:
            slope = self._slope(-1)
            if slope <= 0:
                return Inverse(math.inf, True)
            return Inverse(self.high + (target - top) / slope, self.high + (target - top)
                           / slope > self.high)
        first = float(self.fitted[0])
        if first > target:
            slope = self._slope(0)
            if slope <= 0:
                return Inverse(None, True)
            below = self.low - (first - target) / slope
            return Inverse(below if below > 0 else None, True)
        assert self._pchip is not None  # two levels at least: fitted[0] <= target < fitted[-1]
        # the last segment whose left end meets the target holds the crossing
        i = int(np.nonzero(self.fitted <= target)[0][-1])
        c3, c2, c1, c0 = (float(v) for v in self._pchip.c[:, i])  # in t = N - levels[i]
        lo, hi = 0.0, float(self.levels[i + 1] - self.levels[i])
        for _ in range(50):  # bisection: the cubic is monotone on the segment
            mid = (lo + hi) / 2
            if ((c3 * mid + c2) * mid + c1) * mid + c0 <= target:
                lo = mid
            else:
                hi = mid
        return Inverse(float(self.levels[i]) + lo, False)


class CurveBatch:
    """Many curves over the same levels at once (the bootstrap's resamples): the same fit as
    `MonotoneCurve` row by row, with PCHIP built once along an axis and every inverse and
    evaluation vectorized. `values` has one row per curve."""

    def __init__(self, levels: ArrayLike, values: ArrayLike, weights: ArrayLike) -> None:
        self.levels = np.asarray(levels, dtype=float)
        rows = np.atleast_2d(np.asarray(values, dtype=float))
        self.fitted = np.array([isotonic(row, weights) for row in rows])
        self.c = (PchipInterpolator(self.levels, self.fitted, axis=1).c
                  if len(self.levels) >= 2 else None)  # (4, segments, curves)

    def _end_slopes(self) -> tuple[np.ndarray, np.ndarray]:
        return end_slopes(self.levels, self.fitted)

    def inverse(self, targets: ArrayLike) -> np.ndarray:
        """Per curve, the largest N with curve(N) <= target: NaN where none (as
        `Inverse.value` None), inf where the curve never reaches the target."""
        target = np.broadcast_to(np.asarray(targets, dtype=float), (len(self.fitted),))
        x, f = self.levels, self.fitted
        first_slope, last_slope = self._end_slopes()
        out = np.full(len(f), np.nan)
        above = f[:, -1] <= target
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(above, np.where(last_slope > 0, x[-1] + (target - f[:, -1])
                                           / last_slope, np.inf), out)
            below = f[:, 0] > target
            down = x[0] - (f[:, 0] - target) / first_slope
            out = np.where(below & (first_slope > 0) & (down > 0), down, out)
        inside = ~above & ~below
        if self.c is not None and inside.any():
            rows = np.nonzero(inside)[0]
            segment = (f[rows] <= target[rows, None]).sum(axis=1) - 1
            c = self.c[:, segment, rows]
            lo, hi = np.zeros(len(rows)), x[segment + 1] - x[segment]
            for _ in range(50):
                mid = (lo + hi) / 2
                ok = ((c[0] * mid + c[1]) * mid + c[2]) * mid + c[3] <= target[rows]
                lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
            out[rows] = x[segment] + lo
        return out

    def at(self, points: ArrayLike) -> np.ndarray:
        """Curve i evaluated at points[i] (linear beyond the measured levels)."""
        n = np.broadcast_to(np.asarray(points, dtype=float), (len(self.fitted),))
        x, f = self.levels, self.fitted
        first_slope, last_slope = self._end_slopes()
        out = np.where(n > x[-1], f[:, -1] + last_slope * (n - x[-1]),
                       f[:, 0] + first_slope * (n - x[0]))
        inside = (n >= x[0]) & (n <= x[-1])
        if self.c is not None and inside.any():
            rows = np.nonzero(inside)[0]
            segment = np.clip(np.searchsorted(x, n[rows], side="right") - 1, 0, len(x) - 2)
            t = n[rows] - x[segment]
            c = self.c[:, segment, rows]
            out[rows] = ((c[0] * t + c[1]) * t + c[2]) * t + c[3]
        return np.asarray(out, dtype=float)


def leave_one_level_out(levels: Sequence[float], values: Sequence[float],
                        weights: Sequence[float]) -> list[dict[str, float | bool]]:
    """Each level predicted by the curve fitted without it: level, measured, predicted, the
    absolute percentage error, and whether the prediction was an extrapolation (an end
    level)."""
    out: list[dict[str, float | bool]] = []
    if len(levels) < 3:
        return out
    for i, level in enumerate(levels):
        keep = [j for j in range(len(levels)) if j != i]
        curve = MonotoneCurve([levels[j] for j in keep], [values[j] for j in keep],
                              [weights[j] for j in keep])
        predicted = curve(level)
        measured = float(values[i])
        out.append({"level": float(level), "measured": measured, "predicted": predicted,
                    "ape_pct": abs(predicted - measured) / measured * 100 if measured else 0.0,
                    "extrapolated": curve.extrapolated(level)})
    return out


@dataclass(frozen=True)
class ModelError:
    """The curve's own error, from its leave-one-level-out residuals (a residual-based term,
    added to the bootstrap's sampling error), relative to the curve's value.

    Past the largest level: `top`, the APE of the largest level predicted by the curve without
    it (its secant over the two levels below, `prev_gap` wide, extrapolated by `gap`), scaled
    to the distance d past the largest level as a secant's error scales on a curve with a
    steady bend (exact for a quadratic): top x d (d + gap) / (gap (gap + prev_gap)). Between
    the measured levels no band is added: `inside`, the median APE of the interior levels, is
    reported, but there it is mostly the levels' own sampling noise, which the bootstrap
    already holds (adding it made the intervals over-cover a straight-line truth: 60 of 60).
    Zero with fewer than 3 levels (no residual exists)."""

    inside: float = 0.0
    top: float = 0.0
    gap: float = 0.0
    prev_gap: float = 0.0

    def at(self, distance: ArrayLike) -> np.ndarray:
        """The relative band at `distance` agents past the largest level (none inside)."""
        d = np.maximum(np.asarray(distance, dtype=float), 0.0)
        if self.gap <= 0:
            return np.zeros(d.shape)
        return np.asarray(self.top * d * (d + self.gap) / (self.gap * (self.gap + self.prev_gap)),
                          dtype=float)


def model_error(lolo: Sequence[dict[str, float | bool]], levels: Sequence[float]
                ) -> ModelError:
    """`ModelError` from `leave_one_level_out`'s entries over ascending `levels`."""
    inside = [float(e["ape_pct"]) / 100 for e in lolo if not e["extrapolated"]]
    top = [e for e in lolo if float(e["level"]) == float(levels[-1])]
    if not top or len(levels) < 3:
        return ModelError()
    return ModelError(inside=float(np.median(inside)) if inside else 0.0,
                      top=float(top[0]["ape_pct"]) / 100,
                      gap=float(levels[-1]) - float(levels[-2]),
                      prev_gap=float(levels[-2]) - float(levels[-3]))


EDGE_GRID = 128  # grid cells over (0, reach] in which the first crossing is looked for


def largest_meeting_batch(batch: CurveBatch, targets: ArrayLike, error: ModelError, sign: int,
                          reach: float) -> np.ndarray:
    """Per curve of a batch (a bootstrap's resamples), the largest N in (0, reach] such that
    the band's edge meets the target at every n <= N: the first crossing of edge(n) = target.
    The edge is curve(n) x (1 + band) for sign +1 (pessimistic) and curve(n) / (1 + band) for
    sign -1 (optimistic), the band `error` at n's distance past the largest level: applied to
    each resample, so an interval read off these holds both the sampling and the model error.
    NaN where no N > 0 meets it, inf where every n up to the reach does.

    Issue 29: the optimistic edge was curve x (1 - band), which reaches 0 (then -inf) where the
    band passes 1, so on a bending curve the edge met the target again at the reach and the
    interval's upper end read infinite for a crossing well inside the measured levels. The
    optimistic edge now stays positive (the band's mirror in log space), and the crossing is the
    first one: a grid scan of EDGE_GRID cells over (0, reach], then bisection inside the first
    cell that fails (a dip narrower than reach / EDGE_GRID can be missed)."""
    target = np.broadcast_to(np.asarray(targets, dtype=float), (len(batch.fitted),))
    high = float(batch.levels[-1])
    rows = len(target)

    def edge(n: np.ndarray) -> np.ndarray:
        factor = 1 + np.asarray(error.at(n - high), dtype=float)
        values = np.asarray(batch.at(n), dtype=float)
        out: np.ndarray = values * factor if sign > 0 else values / factor
        return out

    grid = np.linspace(0.0, reach, EDGE_GRID + 1)
    grid[0] = 1e-9
    first_fail = np.full(rows, -1)
    for k, n in enumerate(grid):
        fails = (first_fail < 0) & ~(edge(np.full(rows, n)) <= target)
        first_fail[fails] = k
    out = np.full(rows, np.nan)  # fails at the first point: no N > 0 meets the target
    out[first_fail < 0] = np.inf
    inside = first_fail > 0
    lo = np.where(inside, grid[np.maximum(first_fail - 1, 0)], 0.0)
    hi = np.where(inside, grid[np.maximum(first_fail, 0)], 0.0)
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = edge(mid) <= target
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    out[inside] = lo[inside]
    return out
