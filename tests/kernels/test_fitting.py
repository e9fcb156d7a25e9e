"""Fits on synthetic levels from known coefficients: recovered, and held-out error computed
as its definition says (leave-one-out by hand for a family whose fit is a plain mean)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from compaction_bench.kernels.fitting import (
    Family,
    Linear,
    Point,
    Roofline,
    ape,
    choose,
    evaluate,
    kfold,
)
from compaction_bench.kernels.limits import measured_limits
from compaction_bench.kernels.shapes import decode_work, prefill_work, shape_for_profile

PREFILL = {"a_s": 0.05, "b_s_per_token": 6e-4, "c_s_per_token_pair": 4e-8}
DECODE = {"s0_s": 0.04, "s1_s_per_seq": 2e-3, "s2_s_per_seq_token": 1.5e-6}


def prefill_points(noise: float, rng: np.random.Generator) -> list[Point]:
    out = []
    for u in (128, 512, 1024, 2048):
        for p in (0, 1024, 3072):
            t = (PREFILL["a_s"] + PREFILL["b_s_per_token"] * u
                 + PREFILL["c_s_per_token_pair"] * u * (p + (u + 1) / 2))
            out.append(Point(f"u={u},P={p}", {"uncached": u, "cached": p},
                             t * float(np.exp(rng.normal(0, noise)))))
    return out


def decode_points(noise: float, rng: np.random.Generator) -> list[Point]:
    out = []
    for b in (1, 2, 4, 8, 16, 32):
        for ctx in (1024, 8192, 32768):
            t = DECODE["s0_s"] + DECODE["s1_s_per_seq"] * b + DECODE["s2_s_per_seq_token"] * (
                b * ctx)
            out.append(Point(f"b={b},L={ctx}", {"batch": b, "mean_context": ctx},
                             t * float(np.exp(rng.normal(0, noise)))))
    return out


def test_linear_prefill_recovers_known_coefficients_exactly_without_noise() -> None:
    points = prefill_points(0.0, np.random.default_rng(0))
    fitted = Linear("prefill").fit(points)
    for name, truth in PREFILL.items():
        assert fitted[name] == pytest.approx(truth, rel=1e-6)


def test_linear_decode_recovers_coefficients_under_noise_and_heldout_error_is_small() -> None:
    points = decode_points(0.02, np.random.default_rng(1))
    result = evaluate(Linear("decode"), points, seed=3)
    for name, truth in DECODE.items():
        assert result["coefficients"][name] == pytest.approx(truth, rel=0.15)
    held = result["heldout"]
    assert held["k"] == 5 and held["n_levels"] == len(points)
    # 2% multiplicative noise: held-out errors of a correct model stay at the noise level
    assert held["median_ape"] < 4.0
    assert all(level["heldout_ape"] is not None for level in result["levels"])


class Mean(Family):
    """A one-coefficient family: the mean of the training levels. Its held-out predictions are
    known in closed form, so k-fold's bookkeeping can be checked against arithmetic."""

    name = "mean"
    formula = "mean"
    parameters = ("mean",)

    def fit(self, points: Sequence[Point]) -> dict[str, Any]:
        return {"mean": float(np.mean([p.y for p in points]))}

    def predict(self, coefficients: dict[str, Any], x: dict[str, float]) -> float:
        return float(coefficients["mean"])


def test_leave_one_out_heldout_error_matches_hand_computation() -> None:
    ys = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    points = [Point(str(i), {"batch": i, "mean_context": 0.0}, y) for i, y in enumerate(ys)]
    result = kfold(Mean(), points, k=len(points))  # k = n: every fold holds one level
    total = sum(ys)
    expected = [(total - y) / (len(ys) - 1) for y in ys]
    assert result["predicted_s"] == pytest.approx(expected)
    errors = [100 * abs(e - y) / y for e, y in zip(expected, ys, strict=True)]
    assert result["median_ape"] == pytest.approx(float(np.median(errors)))
    assert result["max_ape"] == pytest.approx(max(errors))


def test_too_few_levels_give_no_heldout_error_and_say_why() -> None:
    points = decode_points(0.0, np.random.default_rng(0))[:4]
    result = kfold(Linear("decode"), points)
    assert result["median_ape"] is None and "too few" in result["reason"]


def test_roofline_recovers_efficiencies_from_its_own_formula() -> None:
    shape = shape_for_profile("cpu-tiny")
    limits = measured_limits("synthetic", bandwidth_bytes_per_s=10e9,
                             flops={"bf16": 400e9}, how="test")
    t0, eta_f, eta_b = 0.03, 0.4, 0.7
    points = []
    for b in (1, 2, 4):
        for ctx in (128, 1024, 3072):
            work = decode_work(shape, b, ctx)
            t = t0 + max(work.flops / (eta_f * 400e9), work.bytes / (eta_b * 10e9))
            points.append(Point(f"b={b},L={ctx}", {"batch": b, "mean_context": ctx}, t))
    for u in (128, 2048):
        work = prefill_work(shape, u, 1024)
        t = t0 + max(work.flops / (eta_f * 400e9), work.bytes / (eta_b * 10e9))
        points.append(Point(f"u={u}", {"batch": 0, "mean_context": 0}, t))
    family = Roofline("decode", shape, limits)
    fitted = family.fit(points[:9])
    assert fitted["t0_s"] == pytest.approx(t0, rel=1e-3)
    assert fitted["bytes_efficiency"] == pytest.approx(eta_b, rel=1e-3)
    for point in points[:9]:
        assert family.predict(fitted, point.x) == pytest.approx(point.y, rel=1e-4)


def test_choose_takes_the_lower_heldout_error_and_ties_go_to_the_first() -> None:
    def candidate(error: float | None) -> dict[str, Any]:
        return {"coefficients": {}, "heldout": {"median_ape": error}}

    assert choose({"linear": candidate(5.0), "roofline": candidate(3.0)}) == "roofline"
    assert choose({"linear": candidate(3.0), "roofline": candidate(3.0)}) == "linear"
    assert choose({"linear": candidate(None), "roofline": {"unavailable": "x"}}) == "linear"
    assert ape(110.0, 100.0) == pytest.approx(10.0)
