"""REPEAT=k (bench/analysis/repeats.py): each run of the configuration analysed on its own
interleaved blocks, and the spread of their medians beside the pooled interval."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.analysis.repeats import repeat_count, repeat_spreads, spread_of
from compaction_bench.bench.analysis.stats import paired_change
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.runfolder import read_run


def _with_repeat(run: Path, repeat: int) -> Path:
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "config": {"repeat": repeat}}))
    return run


def test_blocks_interleave_run_by_run_with_the_first_runs_seeds() -> None:
    config = BenchConfig(repeat=3)
    assert [config.repeat_of(b) for b in range(1, 8)] == [1, 2, 3, 1, 2, 3, 1]
    assert [config.position(b) for b in range(1, 8)] == [1, 1, 1, 2, 2, 2, 3]
    alone = BenchConfig()
    assert [alone.position(b) for b in range(1, 4)] == [1, 2, 3]  # no REPEAT: unchanged


def test_each_run_is_analysed_on_its_own_blocks_and_the_spread_is_of_their_medians(
        make_run: Callable[..., Path]) -> None:
    run = _with_repeat(make_run(regimes=("dedicated",), blocks=18, ratios={"self": 0.75},
                                noise=0.1, serving=False), 3)
    records = read_run(run)
    analysis = analyze(records)
    spreads = [s for s in repeat_spreads(analysis) if s.name == "dedicated"]
    assert len(spreads) == 1
    spread = spreads[0]
    by_block = {(a.block, a.arm): a.postfork_s for a in records.arms}
    expected = []
    for r in (1, 2, 3):  # run r: blocks r, r+3, r+6, ...
        blocks = range(r, 19, 3)
        expected.append(paired_change([by_block[(b, "self")] for b in blocks],
                                      [by_block[(b, "clean")] for b in blocks]).median_pct)
    assert [c.n for c in spread.runs if c is not None] == [6, 6, 6]
    assert spread.medians == pytest.approx(expected)
    assert spread.spread_pct == pytest.approx(max(expected) - min(expected))
    assert spread.pooled is not None and spread.pooled.n == 18
    assert spread.to_json()["medians_pct"] == pytest.approx(expected)


def test_without_repeat_there_is_no_spread_and_a_run_without_blocks_states_none(
        make_run: Callable[..., Path]) -> None:
    run = make_run(regimes=("dedicated",), blocks=6, ratios={"self": 0.75}, serving=False)
    analysis = analyze(read_run(run))
    assert repeat_count(analysis.records.manifest) == 1 and repeat_spreads(analysis) == ()
    one = spread_of("dedicated", "self", [analysis.primary["dedicated"], None])
    assert one.spread_pct is None  # one run has no blocks: no spread is stated


def test_a_median_censored_blocks_could_move_gives_no_spread() -> None:
    rng = np.random.default_rng(3)
    clean = list(rng.uniform(20, 30, 8))
    arm = [c * 0.8 for c in clean]
    exact = paired_change(arm, clean)
    censored = paired_change(arm, clean, arm_censored=[True] * 5 + [False] * 3)
    assert censored.median_bound != "exact"
    from compaction_bench.bench.analysis.repeats import Spread

    assert Spread("dedicated", "self", (exact, exact), None).spread_pct == pytest.approx(0.0)
    assert Spread("dedicated", "self", (exact, censored), None).spread_pct is None
