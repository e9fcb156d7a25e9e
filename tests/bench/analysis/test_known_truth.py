"""The analysis recovers a known effect, and its interval covers the truth about as often as
it claims to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.analysis.stats import paired_change
from compaction_bench.bench.runfolder import ArmRecord, read_run

TRUE_CHANGE = -25.0  # ratio 0.75 with symmetric log-noise: the median paired change is -25%


def test_recovers_a_known_effect(make_run: Callable[..., Path]) -> None:
    run = make_run(regimes=("dedicated",), blocks=30, ratios={"self": 0.75, "external": 0.9},
                   noise=0.05, serving=False)
    analysis = analyze(read_run(run), seed=1)
    self_change = analysis.primary["dedicated"].arms["self"].postfork
    external = analysis.primary["dedicated"].arms["external"].postfork
    assert self_change.n == 30
    assert self_change.median_pct == pytest.approx(TRUE_CHANGE, abs=3.0)
    assert external.median_pct == pytest.approx(-10.0, abs=3.0)
    assert self_change.ci_low_pct is not None and self_change.ci_high_pct is not None
    assert self_change.ci_low_pct <= TRUE_CHANGE <= self_change.ci_high_pct
    # Tolerance: with log-noise sd 0.05 the sample median of 30 blocks has a standard error of
    # about 1.1 points, so 3 points is near 3 standard errors.
    assert self_change.n_faster == 30


def test_interval_coverage_on_known_truth(
    arm_generator: Callable[..., list[ArmRecord]],
) -> None:
    """Coverage of the 95% percentile bootstrap interval of the median paired change.

    400 seeded repetitions of 20 blocks, 10,000 resamples each (about 2-3 s on 2 cores).
    The percentile bootstrap of a median undercovers with few blocks: the bootstrap
    distribution of a sample median is discrete and too narrow. A 3,000-repetition run of this
    setting measured about 93.7% at 20 blocks (94.2% at 10, 94.9% at 25), so the honest claim
    is "close to 95%", not "at least 95%". With 400 repetitions the binomial standard error is
    about 1.2 points, so the band [0.90, 0.98] is nominal +-5 points: it admits the known
    undercoverage of 1-2 points plus 3 standard errors, and fails a broken interval (a wrong
    resampling unit or a mean instead of a median typically lands below 85%).
    Observed with this seed: printed below (run pytest -s); it was 0.955 (382/400) when written.
    """
    rng = np.random.default_rng(20240601)
    repetitions, blocks = 400, 20
    covered = 0
    for _ in range(repetitions):
        records = arm_generator(rng, regimes=("shared",), blocks=blocks,
                                 ratios={"self": 0.75}, noise=0.15)
        clean = [r.postfork_s for r in records if r.arm == "clean"]
        arm = [r.postfork_s for r in records if r.arm == "self"]
        change = paired_change(arm, clean, rng)
        assert change.ci_low_pct is not None and change.ci_high_pct is not None
        covered += change.ci_low_pct <= TRUE_CHANGE <= change.ci_high_pct
    coverage = covered / repetitions
    print(f"observed coverage of the nominal 95% interval: {coverage:.3f} "
          f"({covered}/{repetitions}, {blocks} blocks)")
    assert 0.90 <= coverage <= 0.98


def test_fewer_than_three_blocks_gives_no_interval(make_run: Callable[..., Path]) -> None:
    run = make_run(regimes=("dedicated",), blocks=2, serving=False)
    change = analyze(read_run(run)).primary["dedicated"].arms["self"].postfork
    assert change.n == 2
    assert change.median_pct is not None
    assert change.ci_low_pct is None and change.ci_high_pct is None
