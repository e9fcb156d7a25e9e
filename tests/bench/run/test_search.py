"""The capacity search's decisions on synthetic outcomes: probe, bisect, confirm; noise that makes
the measured curve non-monotone; failures as misses; the guard against a search that never
fails; the quantile's interval; what a resumed search finds on record."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.stats import binom

from compaction_bench.bench.run.boundary import (
    Verdict,
    capacity,
    measure,
    next_step,
    order_ranks,
    verdict,
)
from compaction_bench.bench.run.config import BenchConfig, continuation_block, regime_users
from compaction_bench.bench.run.search import SEARCH_FILE, OnRecord, level_measure
from compaction_bench.bench.run.sources import default_blocks
from compaction_bench.bench.run.sweep import SWEEP_FILE
from compaction_bench.bench.runfolder import ArmRecord, write_records
from compaction_bench.common.files import JsonlWriter
from compaction_bench.common.slo import SloError, parse_slo
from compaction_bench.serve.profile import load_profile

Oracle = Callable[[int], bool]


def search(probe: Oracle, confirm: Oracle, max_level: int
           ) -> tuple[dict[int, bool], set[int], list[tuple[str, int]]]:
    """Drive `next_step` to its end: (latest verdict per level, confirmed, cells run)."""
    held: dict[int, bool] = {}
    confirmed: set[int] = set()
    cells: list[tuple[str, int]] = []
    for _ in range(4 * max_level + 4):
        step = next_step(held, confirmed, max_level)
        if step.kind == "done":
            return held, confirmed, cells
        cells.append((step.kind, step.level))
        if step.kind == "confirm":
            held[step.level] = confirm(step.level)
            confirmed.add(step.level)
        else:
            held[step.level] = probe(step.level)
    raise AssertionError(f"the search did not end: {cells}")


def answer(held: dict[int, bool], max_level: int) -> int:
    clear = {n: Verdict(held=ok, clear=True, why="") for n, ok in held.items()}
    return capacity(clear, max_level).agents


@pytest.mark.parametrize("truth", range(0, 17))
def test_a_monotone_server_gives_its_capacity_in_few_cells(truth: int) -> None:
    def holds(n: int) -> bool:
        return n <= truth

    held, confirmed, cells = search(holds, holds, 16)
    assert answer(held, 16) == truth
    probed = [n for kind, n in cells if kind != "confirm"]
    assert len(probed) == len(set(probed)) and len(cells) <= 2 * math.log2(16) + 3
    if 0 < truth < 16:  # the boundary's two levels ran again with more continuations
        assert {truth, truth + 1} <= confirmed
    assert probed[:2] == [1, 2][:len(probed)]  # probing starts alone and doubles


def test_probing_doubles_then_bisects_then_confirms_the_boundary() -> None:
    def holds(n: int) -> bool:
        return n <= 5

    _, _, cells = search(holds, holds, 64)
    assert cells == [("probe", 1), ("probe", 2), ("probe", 4), ("probe", 8), ("bisect", 6),
                     ("bisect", 5), ("confirm", 5), ("confirm", 6)]


def test_a_noisy_failure_below_the_capacity_is_overturned_by_its_confirmation() -> None:
    # level 2's probe failed by noise; its confirmation holds, so the search goes on upward
    def probe(n: int) -> bool:
        return n != 2 and n <= 6

    def confirm(n: int) -> bool:
        return n <= 6

    held, confirmed, cells = search(probe, confirm, 32)
    assert answer(held, 32) == 6 and {6, 7} <= confirmed
    assert ("confirm", 2) in cells


def test_a_noisy_hold_above_the_capacity_cannot_inflate_the_answer() -> None:
    # level 4 held by noise (truth: 3); its confirmation fails and the boundary moves down
    def probe(n: int) -> bool:
        return n <= 4

    def confirm(n: int) -> bool:
        return n <= 3

    held, confirmed, _cells = search(probe, confirm, 32)
    assert answer(held, 32) == 3 and {3, 4} <= confirmed
    # and a level that held above the smallest failed one does not count
    assert answer({1: True, 2: False, 3: True, 4: True}, 8) == 1


@pytest.mark.parametrize("seed", range(40))
def test_any_noise_ends_within_two_cells_per_level_and_never_above_a_confirmed_failure(
        seed: int) -> None:
    rng = np.random.default_rng(seed)
    top = int(rng.integers(4, 40))
    truth = int(rng.integers(0, top + 1))
    flips = rng.random(top + 2) < 0.3  # probes lie 30% of the time, confirmations never

    def probe(n: int) -> bool:
        return (n <= truth) != bool(flips[n])

    def confirm(n: int) -> bool:
        return n <= truth

    held, confirmed, cells = search(probe, confirm, top)
    assert len(cells) <= 2 * top
    assert answer(held, top) == truth
    # and with lying confirmations too it still ends, at a level that held next to one that
    # failed (or at 0 / the top), both confirmed
    lies = rng.random(top + 2) < 0.2
    held, confirmed, cells = search(probe, lambda n: (n <= truth) != bool(lies[n]), top)
    got = answer(held, top)
    assert len(cells) <= 2 * top
    assert (got == 0 or (held[got] and got in confirmed))
    assert got == top or (not held[got + 1] and got + 1 in confirmed)


def test_a_search_that_never_fails_is_unbounded_up_to_the_maximum_level_not_a_number() -> None:
    held, confirmed, cells = search(lambda n: True, lambda n: True, 12)
    assert [n for _, n in cells] == [1, 2, 4, 8, 12, 12] and confirmed == {12}
    found = capacity({n: Verdict(True, False, "") for n in held}, 12)
    assert found.unbounded and found.to_json()["agents"] is None
    assert found.to_json()["unbounded_up_to"] == 12 and "unbounded up to 12" in found.text


def test_one_agent_missing_the_slo_is_capacity_zero() -> None:
    held, _confirmed, cells = search(lambda n: False, lambda n: False, 16)
    assert cells == [("probe", 1), ("confirm", 1)] and answer(held, 16) == 0


def test_the_interval_spans_the_levels_whose_quantile_interval_straddles_the_limit() -> None:
    verdicts = {1: Verdict(True, True, ""), 2: Verdict(True, True, ""),
                4: Verdict(True, False, ""), 5: Verdict(True, False, ""),
                6: Verdict(False, False, ""), 8: Verdict(False, True, "")}
    found = capacity(verdicts, 16)
    assert (found.agents, found.low, found.high) == (5, 2, 7) and not found.unbounded
    assert found.text == "5 agents (interval 2-7)"
    assert capacity({1: Verdict(True, False, ""), 2: Verdict(False, False, "")}, 8).high is None


def test_order_statistic_ranks_cover_the_quantile_exactly() -> None:
    assert order_ranks(100, 0.5, 0.95) == (40, 61)  # the textbook median interval
    for n in (5, 8, 20, 40, 100):
        for q in (0.5, 0.9, 0.99):
            low, high = order_ranks(n, q, 0.95)
            # P(X_(l) <= xi_q <= X_(u)) = P(l <= B <= u - 1), B ~ Binomial(n, q)
            coverage = binom.cdf(high - 1, n, q) - binom.cdf(low - 1, n, q)
            assert coverage >= 0.95 - 1e-12, (n, q, low, high)
    assert order_ranks(8, 0.9, 0.95)[1] == 9  # no upper end from 8 values: an honest inf
    assert order_ranks(36, 0.9, 0.95)[1] <= 36


def test_failed_continuations_are_misses_so_a_failing_level_never_looks_better() -> None:
    slow = measure([10.0] * 8, 0, 0.9, 0.95)
    fast_but_failing = measure([1.0] * 6, 2, 0.9, 0.95)  # 25% failed > 10%
    assert math.isfinite(slow.point_s) and math.isinf(fast_but_failing.point_s)
    assert verdict(slow, 12.0, "p90").held
    bad = verdict(fast_but_failing, 12.0, "p90")
    assert not bad.held and "2 of 8 continuations failed" in bad.why
    # one failure in 20 stays below the 10% share: ranked above every complete time
    one = measure(list(np.linspace(1, 19, 19)), 1, 0.9, 0.95)
    assert one.point_s > float(np.quantile(np.linspace(1, 19, 19), 0.9))
    assert math.isinf(one.high_s)
    # a level's records: only measured continuations count, failed ones as misses
    records = [_record(1, i, "measured", "complete" if i else "failed", 2.0) for i in range(4)]
    records.append(_record(1, 9, "warmup", "complete", 99.0))
    got = level_measure(records, 0.5, 0.95)
    assert (got.n, got.failed) == (3, 1)


def _record(level: int, index: int, phase: str, status: str, seconds: float,
            arm: str = "clean", block_pass: int = 1) -> ArmRecord:
    return ArmRecord("sweep", continuation_block(level, 0, index), arm, "original", status,
                     seconds, rewrite_s=0.5, level=level, sweep_agent=0, sweep_index=index,
                     sweep_phase=phase, block_pass=block_pass if block_pass > 1 else None)


def test_the_slo_is_read_as_the_plans_and_refused_in_one_line() -> None:
    assert parse_slo("p90:2x").relative and parse_slo("p99:120").value == 120
    for bad in ("p90", "p100:2x", "p90:0.5x"):
        with pytest.raises(SloError, match="SLO="):
            parse_slo(bad)
    with pytest.raises(ValidationError, match="SLO='p90' is not a latency target"):
        BenchConfig(regime="search", slo="p90")
    config = BenchConfig(regime="search", slo="p90:120s", search={"max_level": 8})
    assert config.search.max_for(32) == 8 and BenchConfig().search.max_for(32) == 64
    profile = load_profile("cpu-tiny")
    assert regime_users("search", profile) == 0
    with pytest.raises(ValueError, match="fleets of agents, not blocks"):
        default_blocks("search", profile)


def test_a_resumed_search_finds_its_finished_cells_and_runs_a_cut_one_as_its_next_pass(
        tmp_path: Path) -> None:
    with JsonlWriter(tmp_path / SWEEP_FILE) as cells:
        cells.write({"arm": "clean", "level": 1, "status": "done", "cell_pass": 1,
                     "search_step": "probe"})
        cells.write({"arm": "clean", "level": 1, "status": "done", "cell_pass": 2,
                     "search_step": "confirm"})
    with JsonlWriter(tmp_path / SEARCH_FILE) as decisions:
        decisions.write({"kind": "decision", "arm": "clean", "level": 1, "cell_pass": 1})
    write_records(tmp_path / "arms.jsonl", [
        _record(1, 0, "measured", "complete", 3.0),
        _record(1, 0, "measured", "complete", 3.0, block_pass=2),
        _record(2, 0, "measured", "complete", 3.0)])  # N=2 was cut: no line
    found = OnRecord.read(tmp_path)
    assert set(found.lines) == {("clean", 1, False), ("clean", 1, True)}
    assert found.passes == {("clean", 1): 2, ("clean", 2): 1}
    assert len(found.records[("clean", 1, 2)]) == 1 and found.decided == {("clean", 1, 1)}


def test_the_search_ranks_a_level_with_failures_exactly_as_the_plan_does() -> None:
    from compaction_bench.bench.run.boundary import measure as boundary_measure
    from compaction_bench.common.resampling import quantile as hd_quantile
    from compaction_bench.plan.capacity import Level

    times = np.linspace(10.0, 20.0, 37)
    level = Level(level=5, postfork_s=times, cycle_s=times, failed=4, duty=None,
                  resident_tokens=[])
    # 4 of 41 failed: the p90 of all is the complete ones' q 41 / 37 = 0.997 quantile (the old
    # clamp n / (n + 1) = 0.974 read it lower than the plan did)
    expected = float(hd_quantile(times, level.rank(0.9)))
    assert boundary_measure(times, 4, 0.9, 0.95).point_s == pytest.approx(expected)
    assert level.rank(0.9) == pytest.approx(0.9 * 41 / 37)
