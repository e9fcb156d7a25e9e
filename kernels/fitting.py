"""Fitting step-time models to measured sweep levels, and their k-fold held-out error.

Two families per phase, fitted to minimize the squared *relative* error (each level weighs the
same whether it took 50 ms or 5 s), coefficients constrained non-negative:

- `linear`: prefill t = a + b*u + c*u*(P + (u+1)/2); decode step t = s0 + s1*b + s2*b*L.
  u uncached tokens, P cached tokens, b concurrent sequences, L their mean context. The prefill
  attention term counts the keys the new tokens attend: token i of u sees P + i keys, so
  u*P + u(u+1)/2 in all; the issue's `c*u*P` is its cached part (with P = 0 it would leave
  attention unmodelled).
- `roofline`: t = t0 + max(F / (eta_f * peak_flops), B / (eta_b * peak_bytes)) with F and B the
  FLOPs and bytes of the step from the model's shape (kernels/shapes.py) and the peaks from the
  device's limits: fitted are a fixed overhead t0 and the efficiencies eta_f, eta_b. Because its
  terms are physical, the same efficiencies can be tried on another device's limits.

Held-out error: levels are split into k folds (k = min(5, levels), seeded); each fold is
predicted by a fit to the other folds. A level is one sweep setting (all its repetitions), so
no repetition of a held-out level is ever seen in training. Reported: median, p90 and max
absolute percentage error over levels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from compaction_bench.kernels.limits import DeviceLimits
from compaction_bench.kernels.shapes import ModelShape, Work, decode_work, prefill_work

PHASES = ("prefill", "decode")
X_NAMES = {"prefill": ("uncached", "cached"), "decode": ("batch", "mean_context")}


@dataclass(frozen=True)
class Point:
    """One sweep level: its settings `x` (X_NAMES of the phase) and measured median seconds."""

    level: str
    x: dict[str, float]
    y: float


class Family:
    """A model family: `fit(points)` returns coefficients, `predict(coefficients, x)`."""

    name = ""
    formula = ""
    parameters: tuple[str, ...] = ()

    def fit(self, points: Sequence[Point]) -> dict[str, Any]:
        raise NotImplementedError

    def predict(self, coefficients: dict[str, Any], x: dict[str, float]) -> float:
        raise NotImplementedError


class Linear(Family):
    name = "linear"

    def __init__(self, phase: str) -> None:
        self.phase = phase
        if phase == "prefill":
            self.formula = "a + b*u + c*u*(P + (u+1)/2)"
            self.parameters = ("a_s", "b_s_per_token", "c_s_per_token_pair")
        else:
            self.formula = "s0 + s1*b + s2*b*L"
            self.parameters = ("s0_s", "s1_s_per_seq", "s2_s_per_seq_token")

    def features(self, x: dict[str, float]) -> list[float]:
        if self.phase == "prefill":
            u, p = x["uncached"], x["cached"]
            return [1.0, u, u * (p + (u + 1.0) / 2.0)]
        b, ctx = x["batch"], x["mean_context"]
        return [1.0, b, b * ctx]

    def fit(self, points: Sequence[Point]) -> dict[str, Any]:
        a = np.array([self.features(p.x) for p in points])
        y = np.array([p.y for p in points])
        # relative error: scale each row by 1/y, fit to ones; the columns are scaled to unit
        # norm so nnls sees a well-conditioned problem (u*P reaches 1e7 where 1 is 1)
        weighted = a / y[:, None]
        norms = np.linalg.norm(weighted, axis=0)
        norms[norms == 0] = 1.0
        solution, _ = nnls(weighted / norms, np.ones(len(points)))
        return dict(zip(self.parameters, (solution / norms).tolist(), strict=True))

    def predict(self, coefficients: dict[str, Any], x: dict[str, float]) -> float:
        return float(np.dot([coefficients[p] for p in self.parameters], self.features(x)))


class Roofline(Family):
    name = "roofline"
    formula = "t0 + max(F / (eta_f * peak_flops), B / (eta_b * peak_bytes))"
    parameters = ("t0_s", "flops_efficiency", "bytes_efficiency")

    def __init__(self, phase: str, shape: ModelShape, limits: DeviceLimits,
                 dtype: str = "bf16") -> None:
        peak = limits.flops(dtype)
        if peak is None:
            raise ValueError(f"limits of {limits.name} have no {dtype} FLOP/s")
        self.phase, self.shape, self.limits, self.dtype = phase, shape, limits, dtype
        self.peak_flops, self.peak_bytes = peak, limits.hbm_bytes_per_s

    def work(self, x: dict[str, float]) -> Work:
        if self.phase == "prefill":
            return prefill_work(self.shape, x["uncached"], x["cached"])
        return decode_work(self.shape, x["batch"], x["mean_context"])

    def _terms(self, x: dict[str, float]) -> tuple[float, float]:
        work = self.work(x)
        return work.flops / self.peak_flops, work.bytes / self.peak_bytes

    def fit(self, points: Sequence[Point]) -> dict[str, Any]:
        terms = np.array([self._terms(p.x) for p in points])
        y = np.array([p.y for p in points])

        def residual(v: np.ndarray) -> np.ndarray:
            t0, kf, kb = v
            predicted = t0 + np.maximum(kf * terms[:, 0], kb * terms[:, 1])
            return np.asarray((predicted - y) / y, dtype=float)

        # starts: the additive roofline (non-overlapping terms) by nnls, and each bound alone
        design = np.column_stack([np.ones(len(y)), terms]) / y[:, None]
        additive, _ = nnls(design, np.ones(len(y)))
        starts = [additive, [y.min() / 2, float(np.median(y / terms[:, 0])), 0.0],
                  [y.min() / 2, 0.0, float(np.median(y / terms[:, 1]))]]
        best: Any = None
        for start in starts:
            x0 = np.maximum(np.asarray(start, dtype=float), 1e-12)
            result = least_squares(residual, x0, bounds=(0.0, np.inf), x_scale="jac")
            if best is None or result.cost < best.cost:
                best = result
        t0, kf, kb = (float(v) for v in best.x)
        # an efficiency of None: that bound contributes under a nanosecond at every measured
        # level (the fit gave it no cost), so it never binds there
        flops_on = kf * float(terms[:, 0].max()) > 1e-9
        bytes_on = kb * float(terms[:, 1].max()) > 1e-9
        return {"t0_s": t0, "flops_efficiency": 1.0 / kf if flops_on else None,
                "bytes_efficiency": 1.0 / kb if bytes_on else None}

    def predict(self, coefficients: dict[str, Any], x: dict[str, float]) -> float:
        flops_t, bytes_t = self._terms(x)
        eta_f, eta_b = coefficients["flops_efficiency"], coefficients["bytes_efficiency"]
        return float(coefficients["t0_s"]) + max(flops_t / eta_f if eta_f else 0.0,
                                                 bytes_t / eta_b if eta_b else 0.0)


def ape(predicted: float, measured: float) -> float:
    """Absolute percentage error, in percent."""
    return 100.0 * abs(predicted - measured) / measured


def _summary(errors: list[float]) -> dict[str, float | None]:
    if not errors:
        return {"median_ape": None, "p90_ape": None, "max_ape": None}
    values = np.array(errors)
    return {"median_ape": float(np.median(values)), "p90_ape": float(np.quantile(values, 0.9)),
            "max_ape": float(values.max())}


def kfold(family: Family, points: Sequence[Point], *, seed: int = 0,
          k: int = 5) -> dict[str, Any]:
    """Held-out predictions of every point by fits to the other folds (module docstring)."""
    n = len(points)
    k = min(k, n)
    needed = len(family.parameters) + 1
    if k < 2 or n - math.ceil(n / k) < needed:
        return {"k": k, "n_levels": n, "predicted_s": [None] * n, **_summary([]),
                "reason": f"{n} levels: too few to hold any out and still fit "
                          f"{len(family.parameters)} coefficients on {needed} or more"}
    order = np.random.default_rng(seed).permutation(n)
    predicted: list[float | None] = [None] * n
    for fold in np.array_split(order, k):
        held = set(fold.tolist())
        coefficients = family.fit([p for i, p in enumerate(points) if i not in held])
        for i in held:
            predicted[i] = family.predict(coefficients, points[i].x)
    errors = [ape(pr, p.y) for pr, p in zip(predicted, points, strict=True) if pr is not None]
    return {"k": k, "n_levels": n, "seed": seed, "predicted_s": predicted, **_summary(errors)}


def evaluate(family: Family, points: Sequence[Point], *, seed: int = 0) -> dict[str, Any]:
    """Fit on all points, with in-sample and k-fold held-out errors per level."""
    coefficients = family.fit(points)
    fitted = [family.predict(coefficients, p.x) for p in points]
    held = kfold(family, points, seed=seed)
    levels = [{"level": p.level, "x": dict(p.x), "measured_s": p.y, "predicted_s": f,
               "heldout_predicted_s": h, "heldout_ape": ape(h, p.y) if h is not None else None}
              for p, f, h in zip(points, fitted, held.pop("predicted_s"), strict=True)]
    return {"family": family.name, "formula": family.formula, "coefficients": coefficients,
            "in_sample": _summary([ape(f, p.y) for f, p in zip(fitted, points, strict=True)]),
            "heldout": held, "levels": levels}


def choose(candidates: dict[str, dict[str, Any]]) -> str | None:
    """The candidate with the lowest held-out median APE (ties: the first, i.e. linear)."""
    scored = [(c["heldout"]["median_ape"], name) for name, c in candidates.items()
              if "heldout" in c and c["heldout"]["median_ape"] is not None]
    if scored:
        return min(scored, key=lambda s: s[0])[1]
    return next((name for name, c in candidates.items() if "coefficients" in c), None)

