"""What the numbers can say: the interval's false-positive rate by seeded simulation, and the
blocks-for-power formula checked against the same simulation."""

from __future__ import annotations

import pytest

from compaction_bench.bench.analysis.power import (
    blocks_for_power,
    detection_rate,
    false_positive_rate,
    noise_sigma,
)


@pytest.mark.parametrize("blocks", [5, 25])
def test_false_positive_rate_is_five_percent_give_or_take_two(blocks: int) -> None:
    rate = false_positive_rate(blocks, 0.1, reps=2000, seed=11)
    assert 0.03 <= rate <= 0.07, rate  # measured 0.061 at 5 and 0.047 at 25 (seed 1, n=1000)


@pytest.mark.parametrize(("sigma", "effect"), [(0.1, 0.10), (0.3, 0.25)])
def test_blocks_for_power_give_about_eighty_percent(sigma: float, effect: float) -> None:
    blocks = blocks_for_power(sigma, effect)
    assert 0.7 <= detection_rate(blocks, sigma, effect, reps=400, resamples=1000, seed=3) <= 0.95


def test_noise_comes_from_the_placebo_first() -> None:
    sigma, source, n = noise_sigma({"placebo": [1.0, -1.0, 2.0, -2.0], "self": [-30.0] * 4})
    assert source == "placebo" and n == 4 and 0.01 < sigma < 0.03
    assert noise_sigma({"self": [-20.0, -25.0, -22.0]})[1] == "arms"
    assert noise_sigma({})[1:] == ("default", 0)
