"""The monotone curve: isotonic pooling, PCHIP through it, its inverse, the batch form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compaction_bench.plan.curve import CurveBatch, MonotoneCurve, isotonic, leave_one_level_out


def test_isotonic_pools_a_dip_by_weight() -> None:
    fitted = isotonic([10.0, 14.0, 12.0, 20.0], [1, 1, 3, 1])
    assert fitted.tolist() == pytest.approx([10.0, 12.5, 12.5, 20.0])
    assert isotonic([1.0, 2.0, 3.0], [1, 1, 1]).tolist() == [1.0, 2.0, 3.0]


def test_a_straight_line_is_reproduced_and_inverted_exactly() -> None:
    curve = MonotoneCurve([1, 2, 4, 8], [25, 30, 40, 60], [5, 5, 5, 5])
    for n in (1.5, 3.0, 5.5, 7.9):
        assert curve(n) == pytest.approx(20 + 5 * n)
    found = curve.inverse(47.5)
    assert found.value == pytest.approx(5.5) and not found.extrapolated


def test_inverse_beyond_and_below_the_measured_levels() -> None:
    curve = MonotoneCurve([1, 2, 4], [10, 12, 16], [1, 1, 1])
    up = curve.inverse(20)  # last segment: slope 2 per agent
    assert up.value == pytest.approx(6.0) and up.extrapolated
    down = curve.inverse(9)  # first segment's slope 2: N = 0.5
    assert down.value == pytest.approx(0.5) and down.extrapolated
    assert curve.inverse(7).value is None  # not even one agent
    flat = MonotoneCurve([1, 2, 4], [10, 9, 9.5], [1, 1, 1])  # pooled flat: never reached
    assert flat.inverse(11).value == math.inf


def test_a_dip_at_the_top_level_does_not_make_the_curve_flat_forever() -> None:
    # a saturating sweep whose p90 at N = 8 came out under N = 4's (16 continuations each): the
    # fit pools them into one flat top, which extrapolated flat read the SLO as never reached
    levels, values = [1, 2, 4, 8], [36.2, 54.5, 74.9, 73.7]
    curve = MonotoneCurve(levels, values, [16, 16, 16, 16])
    pooled = (74.9 + 73.7) / 2
    slope = (pooled - 54.5) / (8 - 2)  # the secant to the nearest level below the pooled top
    up = curve.inverse(74.9)
    assert up.value == pytest.approx(8 + (74.9 - pooled) / slope) and up.extrapolated
    assert curve(12) == pytest.approx(pooled + 4 * slope)
    batch = CurveBatch(levels, [values], [16, 16, 16, 16])
    assert batch.inverse([74.9])[0] == pytest.approx(up.value)
    # the same at the bottom: a first level pooled with the second
    low = MonotoneCurve([1, 2, 4], [12, 11, 16], [1, 1, 1])
    assert low.inverse(11).value == pytest.approx(1 - 0.5 / ((16 - 11.5) / 3))


def test_the_batch_agrees_with_the_single_curve_row_by_row() -> None:
    rng = np.random.default_rng(3)
    levels = [1, 2, 4, 8]
    rows = np.cumsum(rng.normal(3, 4, size=(200, 4)), axis=1) + 20  # dips included
    targets = rng.uniform(15, 40, size=200)
    points = rng.uniform(0.5, 12, size=200)
    batch = CurveBatch(levels, rows, [3, 3, 3, 3])
    inverses, values = batch.inverse(targets), batch.at(points)
    for i, row in enumerate(rows):
        single = MonotoneCurve(levels, row, [3, 3, 3, 3])
        expected = single.inverse(float(targets[i])).value
        if expected is None:
            assert math.isnan(inverses[i])
        else:
            assert inverses[i] == pytest.approx(expected, rel=1e-6)
        assert values[i] == pytest.approx(single(float(points[i])), rel=1e-9)


def test_leave_one_level_out_on_a_line_has_no_error_inside() -> None:
    rows = leave_one_level_out([1, 2, 4, 8], [25, 30, 40, 60], [1, 1, 1, 1])
    assert [r["extrapolated"] for r in rows] == [True, False, False, True]
    assert all(r["ape_pct"] == pytest.approx(0.0, abs=1e-9) for r in rows)
