"""Continuations stopped at the wall limit (`TimeExceeded`) are censored: their time is a lower
bound. Counted at the cap, they make an arm that is slower look faster than it is; the paired
interval is widened by the bound instead, so its stated coverage holds."""

from __future__ import annotations

import numpy as np

from compaction_bench.bench.analysis.paired import _paired, is_censored
from compaction_bench.bench.analysis.stats import paired_change
from compaction_bench.bench.runfolder import ArmRecord

TRUE_MEDIAN_PCT = 20.0


def censored_sample(rng: np.random.Generator, n: int, limit_s: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n blocks whose arm is truly 20% slower at the median; the arm is stopped at `limit_s`."""
    clean = rng.uniform(80.0, 120.0, n)
    arm = clean * (1.0 + rng.normal(TRUE_MEDIAN_PCT / 100.0, 0.1, n))
    return clean, np.minimum(arm, limit_s), arm > limit_s


def coverage(n: int, *, with_flags: bool, reps: int = 400) -> float:
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(reps):
        clean, arm, cut = censored_sample(rng, n, limit_s=115.0)
        change = paired_change(arm, clean, arm_censored=cut if with_flags else None)
        assert change.ci_low_pct is not None and change.ci_high_pct is not None
        covered += change.ci_low_pct <= TRUE_MEDIAN_PCT <= change.ci_high_pct
    return covered / reps


def test_counting_censored_times_at_the_cap_loses_the_coverage_the_bound_keeps() -> None:
    # about 59% of the arm's continuations pass the 115 s limit here
    assert coverage(9, with_flags=False) < 0.7
    assert coverage(9, with_flags=True) >= 0.95


def test_an_end_that_reaches_a_censored_block_is_unbounded() -> None:
    change = paired_change([100, 100, 100, 100, 100, 100], [80, 90, 95, 105, 110, 120],
                           arm_censored=[True, False, False, False, False, True],
                           reference_censored=[False] * 6)
    assert change.n == 6 and change.n_censored == 2 and change.coverage is not None
    assert change.ci_high_pct == np.inf and change.ci_low_pct == change.changes_pct[5]
    uncut = paired_change([100] * 6, [80, 90, 95, 105, 110, 120])
    assert uncut.n_censored == 0 and uncut.ci_high_pct == uncut.changes_pct[0]


def record(arm: str, postfork_s: float, status: str = "Submitted") -> ArmRecord:
    return ArmRecord(regime="dedicated", block=1, arm=arm, attempt="original",
                     status="complete", postfork_s=postfork_s, terminal_status=status,
                     history_tokens=1000)


def test_the_paired_analysis_flags_arms_stopped_by_the_wall_limit() -> None:
    blocks = [{"clean": record("clean", 100.0),
               "external": record("external", 150.0, "TimeExceeded" if i < 2 else "Submitted")}
              for i in range(6)]
    assert is_censored(blocks[0]["external"]) and not is_censored(blocks[0]["clean"])
    postfork = _paired(blocks, "external", lambda r: r.postfork_s)
    assert postfork.n == 6 and postfork.n_censored == 2 and postfork.ci_high_pct == np.inf
    # the history sent at the fork is never cut by the limit
    history = _paired(blocks, "external", lambda r: r.history_tokens, censored=False)
    assert history.n_censored == 0
