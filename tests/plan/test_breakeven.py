"""Break-even uses (the study's n (T_C - T_K) > T_R) from matched continuations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compaction_bench.plan.breakeven import break_even, pairs, time_and_cost
from compaction_bench.plan.observations import Continuation


def test_known_saving_and_rewrite_give_the_known_break_even() -> None:
    matched = [(10.0, 6.0), (12.0, 8.0), (11.0, 7.0)]  # saving exactly 4 s per use
    found = break_even("self", "dedicated", "time", "s", matched, 6.0, b=500,
                       confidence=0.95, rng=np.random.default_rng(0))
    assert found.saving == pytest.approx(4.0) and found.saving_ci == pytest.approx((4.0, 4.0))
    assert found.uses == pytest.approx(1.5) and found.uses_whole == 2
    assert found.p_no_saving == 0.0
    assert found.serial == pytest.approx(7.0 + 6.0)
    assert found.amortized[3] == pytest.approx(7.0 + 2.0)
    # the plot's net saving crosses zero between one and two uses
    net = {k: v for k, v, _, _ in found.curve}
    assert net[1] == pytest.approx(-2.0) and net[2] == pytest.approx(2.0)


def test_no_saving_means_no_finite_break_even() -> None:
    found = break_even("self", "shared", "time", "s", [(10.0, 11.0), (10.0, 12.0),
                                                      (10.0, 10.5)], 3.0,
                       b=200, confidence=0.95, rng=np.random.default_rng(0))
    assert math.isinf(found.uses or 0.0) and found.uses_whole is None
    assert found.p_no_saving == 1.0 and found.uses_ci == (math.inf, None)


def test_one_or_two_pairs_get_no_interval() -> None:
    found = break_even("self", "dedicated", "time", "s", [(10.0, 8.0), (10.0, 7.0)], 3.0,
                       b=200, confidence=0.95, rng=np.random.default_rng(0))
    assert found.saving == pytest.approx(2.5) and found.uses == pytest.approx(1.2)
    assert found.saving_ci is None and found.uses_ci is None and found.p_no_saving is None
    assert "too few for an interval" in found.note


def test_unknown_rewrite_time_gives_uses_per_second_of_rewriting() -> None:
    found = break_even("self", "dedicated", "time", "s", [(10.0, 8.0)] * 4, None, b=100,
                       confidence=0.95, rng=np.random.default_rng(0))
    assert found.uses is None and found.uses_per_unit == pytest.approx(0.5)


def _c(arm: str, block: int, postfork: float, **kw: object) -> Continuation:
    return Continuation(arm=arm, condition="dedicated", block=block, postfork_s=postfork,
                        complete=True, **kw)  # type: ignore[arg-type]


def test_pairs_match_by_block_and_the_rewrite_during_the_continuation_counts() -> None:
    clean = [_c("clean", 1, 10.0), _c("clean", 2, 10.0), _c("clean", 3, 10.0)]
    self_ = [_c("self", 1, 7.0, rewrite_s=1.0, fork_rewrite_s=4.0),
             _c("self", 2, 7.0, rewrite_s=1.0, fork_rewrite_s=4.0),
             _c("self", 4, 1.0, rewrite_s=0.0, fork_rewrite_s=4.0)]  # block 4: no partner
    assert len(pairs(clean, self_)) == 2
    found = time_and_cost("self", "dedicated", clean, self_, cost=None, one_time_cost=None,
                          cost_unit="GPU-s", cost_note="no prices", b=100, confidence=0.95,
                          rng=np.random.default_rng(0))
    time, cost = found
    assert time.saving == pytest.approx(2.0)  # 10 - (7 + 1)
    assert time.uses == pytest.approx(2.0) and time.n_pairs == 2
    assert cost.n_pairs == 0 and cost.note == "no prices"
