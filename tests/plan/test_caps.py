"""The plan's edges of issue 29, item by item, on synthetic sweeps written as real run folders:
an engine cap below a level measured within the SLO (and the search's answer on the same
cells), the `n` column, energy at the planned N, an interval from two levels, and how many
continuations per level the leave-one-level-out figure stands on."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compaction_bench.bench.run.search import ArmSearch, level_measure
from compaction_bench.bench.runfolder import ArmRecord, read_run
from compaction_bench.common.files import JsonlWriter, read_jsonl
from compaction_bench.plan.planfile import plan_json
from compaction_bench.plan.planner import build_plan
from compaction_bench.plan.settings import PlanConfig
from compaction_bench.plan.writeup import plan_markdown


def _plan(run: Path, slo_s: float, *, b: int = 300) -> Any:
    return build_plan(PlanConfig(run_dir=run, slo=f"p90:{slo_s}s", bootstrap=b, seed=0,
                                 plots=False))


def _search_answer(run: Path, arm: str, slo_s: float, max_level: int) -> int:
    """What the search's own decisions (bench/run/search.py) answer on the run's cells."""
    by_level: dict[int, list[ArmRecord]] = {}
    for r in read_run(run).arms:
        if r.arm == arm and r.level is not None:
            by_level.setdefault(r.level, []).append(r)
    state = ArmSearch(arm, {n: level_measure(records, 0.9, 0.95)
                            for n, records in by_level.items()})
    return state.answer(slo_s, "p90", max_level).agents


def test_a_level_measured_within_the_slo_lifts_the_sequence_cap_and_the_plan_agrees_with_the_search(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    """Issue 29: a search measured N=5 within the SLO while the plan of the same cells printed
    4, bound by max_num_seqs / duty. Here the heuristic is floor(2 / 0.6) = 3, and the cells a
    search would run (1, 2, 4, 8, then 6 and 5 bisected) hold up to 5 and miss at 6: the cap
    no longer binds below 5, the binding names the lift, and the plan's agents are the search's
    answer."""
    tight = type(truth)(sigma=0.1)
    run = make_sweep(truth=tight, levels=(1, 2, 4, 5, 6, 8), requests=True, max_num_seqs=2,
                     per_level=40)
    slo = tight.quantile(5.5, 0.9)
    plan = _plan(run, slo)
    cap = plan.capacity["clean"]
    assert cap.seq_cap == 3  # the heuristic, as before
    searched = _search_answer(run, "clean", slo, 8)
    assert searched == 5
    assert (cap.agents, cap.held_level, cap.missed_level) == (searched, 5, 6)
    assert cap.binding == "SLO (max_num_seqs heuristic 3 lifted: N=5 measured within the SLO)"
    assert cap.agents_ci[0] <= 5 <= cap.agents_ci[1]
    document = plan_json(plan, ())
    entry = document["arms"]["clean"]["agents_per_gpu"]
    assert entry["caps_lifted"] == [{"name": "max_num_seqs", "cap": 3, "level": 5}]
    assert entry["binding"] == cap.binding
    markdown = plan_markdown(plan, document, ())
    assert "SLO (max_num_seqs heuristic 3 lifted: N=5 measured within the SLO)" in markdown
    assert "3 (duty 0.60); lifted to 5 (N=5 met the SLO)" in markdown


def test_where_the_plan_reads_between_measured_levels_it_says_why_it_differs_from_a_search(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    """Levels 4 and 8 bracket a crossing at 6: the search's cells answer 4 (it would bisect),
    the plan interpolates 6 and says so."""
    run = make_sweep(levels=(1, 2, 4, 8))
    slo = truth.quantile(6.0, 0.9)
    cap = _plan(run, slo).capacity["clean"]
    assert _search_answer(run, "clean", slo, 8) == cap.held_level == 4
    assert cap.agents is not None and cap.agents > 4
    markdown = plan_markdown(_plan(run, slo), plan_json(_plan(run, slo), ()), ())
    assert ("clean: the largest level measured within the SLO is N=4 and the smallest that "
            f"missed it is N=8: {cap.agents} agents per replica differ from it") in markdown


def test_the_n_column_counts_what_the_fit_used_and_names_the_levels_left_out(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    """Two of N=2's 30 failed (in the fit, as misses); all 32 of N=8 failed (left out). The
    column read "90 (2 failed)": neither what the fit ranked (92) nor the level left out."""
    tight = type(truth)(sigma=0.05)
    run = make_sweep(truth=tight, levels=(1, 2, 4, 8), fail_above_s=45.0, fail_share={2: 0.05})
    plan = _plan(run, tight.quantile(3.0, 0.9), b=100)
    cap = plan.capacity["clean"]
    assert [lv.level for lv in cap.excluded] == [8]
    document = plan_json(plan, ())
    entry = document["arms"]["clean"]["agents_per_gpu"]
    assert (entry["n_fit"], entry["n_continuations"]) == (92, 90)
    row = next(line for line in plan_markdown(plan, document, ()).splitlines()
               if line.startswith("| clean | **"))
    assert row.endswith("| 92 in the fit (2 failed); left out: N=8 (32, all failed) |")


def _power_by_level(run: Path, watts: Callable[[int], float]) -> None:
    """gpu.jsonl with one GPU drawing watts(N) inside every cell of level N, once a second."""
    cells = [(float(o["measured_window_s"][0]), float(o["measured_window_s"][1]), int(o["level"]))
             for o in read_jsonl(run / "sweep.jsonl").objects]
    end = max(c[1] for c in cells)
    with JsonlWriter(run / "gpu.jsonl") as gpu:
        for second in np.arange(0.0, end + 1.0, 0.5):
            level = next((n for a, b, n in cells if a <= second <= b), None)
            if level is not None:
                gpu.write({"t_s": float(second), "gpu": 0, "name": "NVIDIA H200",
                           "power_w": watts(level), "energy_j": None})


def test_energy_at_the_planned_n_interpolates_power_between_the_measured_levels(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    """Power rises with N (100 + 50 N W). At a planned N of 6, between the measured 4 and 8,
    the nearest lower level's 300 W read 25% low against the 400 W between them, unstated."""
    run = make_sweep(levels=(1, 2, 4, 8))
    _power_by_level(run, lambda n: 100.0 + 50.0 * n)
    plan = _plan(run, truth.quantile(6.0, 0.9))
    f = plan.operating["clean"]
    assert f is not None and f.agents is not None and 4 < f.agents < 8
    expected = 300.0 + 200.0 * (f.agents - 4) / 4
    assert f.power_w == pytest.approx(expected, rel=1e-6)
    assert f.joules_per_task is not None
    assert f.joules_per_task * f.agents / f.power_w == pytest.approx(
        f.gpu_s_per_task * f.agents, rel=1e-6)  # power x mean cycle / N, one GPU
    markdown = plan_markdown(plan, plan_json(plan, ()), ())
    assert (f"- clean: energy at N={f.agents:g} from power interpolated between the measured "
            "levels N=4 (300 W) and N=8 (500 W)") in markdown


def test_two_levels_say_the_interval_is_sampling_error_only_and_widen_it(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    """A bending truth measured at two levels: the straight line between them crosses the SLO
    early (5.24 for a true 6), and the bootstrap's interval, sampling error only, held
    [5.14, 5.38]. It is widened to the measured levels around the crossing, and plan.md says
    the curve's shape is unchecked."""
    bent = type(truth)(a=20.0, b=1.0, c=0.5, sigma=0.05)
    run = make_sweep(truth=bent, levels=(2, 8))
    slo = bent.quantile(6.0, 0.9)
    true_n = bent.agents_at(slo, 0.9)
    plan = _plan(run, slo)
    cap = plan.capacity["clean"]
    assert cap.sampling_only and cap.n_slo is not None and cap.n_slo < true_n
    low, high = cap.n_slo_ci
    assert low <= 2.0 and high >= 8.0 and low <= true_n <= high
    assert cap.agents_ci[0] <= math.floor(true_n) <= cap.agents_ci[1]
    markdown = plan_markdown(plan, plan_json(plan, ()), ())
    assert ("clean: only 2 measured level(s): the interval of N holds sampling error only"
            in markdown)
    assert "shape between and past them is unchecked" in markdown


@pytest.mark.parametrize(("per_level", "warned"), [(30, True), (32, False)])
def test_the_lolo_figure_states_its_continuations_per_level_and_what_it_needs(
        truth: Any, make_sweep: Callable[..., Path], per_level: int, warned: bool) -> None:
    run = make_sweep(levels=(1, 2, 4, 8), per_level=per_level)
    plan = _plan(run, truth.quantile(6.0, 0.9), b=100)
    markdown = plan_markdown(plan, plan_json(plan, ()), ())
    line = next(line for line in markdown.splitlines()
                if line.startswith("- clean: leave-one-level-out error"))
    counts = sorted({lv.n_all for lv in plan.capacity["clean"].levels})
    assert f"Continuations per level: {counts[0]}" in line
    assert ("LOLO at n < 32 per level: interior error <= 6% in only ~70-80% of seeds on "
            "synthetic truth" in line) is warned
    assert ("SWEEP_MIN_CONTINUATIONS=32 for a checked figure" in line) is warned
