"""Quantile estimates and intervals of resamples (plan.resampling)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compaction_bench.plan.resampling import interval, quantile, quantile_weights, smoothed


def test_harrell_davis_weights_and_estimate() -> None:
    for n in (1, 2, 10, 31):
        assert quantile_weights(n, 0.9).sum() == pytest.approx(1.0)
    values = np.arange(1.0, 102.0)  # 1..101
    assert float(quantile(values, 0.5)) == pytest.approx(51.0, abs=0.01)
    rows = np.vstack([values, values * 2])
    assert quantile(rows, 0.5, axis=1).tolist() == pytest.approx([51.0, 102.0], abs=0.02)


def test_interval_keeps_infinite_resamples_as_infinite_ends() -> None:
    values = [1.0] * 10 + [math.inf] * 90
    low, high = interval(values, 0.95)
    assert low == 1.0 and math.isinf(high)
    assert interval([2.0, math.nan, 4.0], 0.5) == (2.0, 4.0)


def test_smoothed_resamples_keep_the_level_and_spread() -> None:
    rng = np.random.default_rng(0)
    values = np.exp(rng.normal(3.0, 0.3, size=40))
    draws = np.log(smoothed(values, 2000, rng))
    assert float(draws.mean()) == pytest.approx(float(np.log(values).mean()), abs=0.01)
    assert float(draws.std()) == pytest.approx(float(np.log(values).std()), rel=0.05)
    assert smoothed(np.array([5.0]), 3, rng) == pytest.approx(np.full((3, 1), 5.0))
