"""Every shape of curve and every way a sweep can go wrong gets a whole plan: plan.md, plan.json
and the plots, each arm with a figure or a named reason (issue 29: a plan with no numeric
agents figure crashed in the plots, and the tests planned with plots off, so none saw it).

Synthetic sweeps of known truth (conftest.py): a straight line, a curve that bends up past the
levels (quadratic) and one that saturates (concave: b > 0, c < 0 over the measured levels);
each plain, with failures, with censored continuations, unbounded (an SLO no level reaches),
and past the reach (an SLO the curve crosses only beyond 2x the largest level). Before the
end slopes of the fitted curve followed the pooled levels (plan/curve.py `end_slopes`), the
saturating sweep with an SLO crossed at N = 5.5 planned "beyond measured range: > 16"."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.plan.planner import build_plan
from compaction_bench.plan.settings import PlanConfig
from compaction_bench.plan.write import write_plan

pytestmark = pytest.mark.e2e  # matplotlib draws every plot: seconds per plan

SHAPES = {"linear": {}, "bending": {"c": 0.6}, "saturating": {"b": 9.0, "c": -0.25}}
CONDITIONS = ("plain", "failures", "censored", "unbounded", "past the reach")
# A saturating curve (rising ever more slowly up to N = 18) crosses an SLO past twice its
# largest level only where it is nearly flat (100.0 s at 16, 100.8 s at 17): no sweep tells such
# a crossing from none, so that case is not built; its plain case is the one that failed.
CASES = [(shape, condition) for shape in SHAPES for condition in CONDITIONS
         if (shape, condition) != ("saturating", "past the reach")]


@pytest.mark.parametrize(("shape", "condition"), CASES)
def test_every_shape_and_condition_gets_a_whole_plan(
        truth: Any, make_sweep: Callable[..., Path], shape: str, condition: str) -> None:
    curve = type(truth)(**SHAPES[shape])
    options: dict[str, Any] = {"truth": curve, "per_level": 16}
    slo = curve.quantile(5.5, 0.9)
    if condition == "failures":
        options["fail_share"] = {4: 0.05, 8: 0.2}
    elif condition == "censored":
        options["censor_above_s"] = curve.quantile(6.0, 0.8)
    elif condition == "unbounded":
        slo = 100 * curve.quantile(8.0, 0.99)
        options["max_num_seqs"] = None  # no engine limit either: nothing bounds the fleet
    elif condition == "past the reach":
        slo = curve.quantile(24.0, 0.9)
    run = make_sweep(f"{shape}-{condition}".replace(" ", "-"), **options)
    files = write_plan(PlanConfig(run_dir=run, slo=f"p90:{slo:.3f}s", bootstrap=200,
                                  fleet_replicas=()))
    document = json.loads(files.json.read_text())
    markdown = files.markdown.read_text()
    assert files.plots and all(p.is_file() and p.stat().st_size > 0 for p in files.plots)
    assert set(document["arms"]) == {"clean", "self"}
    for name, arm in document["arms"].items():
        agents = arm["agents_per_gpu"]
        value, (low, high) = agents["value"], agents["ci"]
        assert name in markdown
        if condition in ("unbounded", "past the reach"):
            # no number: the reason is named, in the document and in plan.md
            assert value is None, (name, agents)
            assert agents["unbounded"] or agents["binding"].startswith(
                "beyond measured range"), (name, agents)
            assert "beyond measured range" in markdown or "unbounded" in markdown
        else:  # the SLO is crossed inside the reach: a number inside its own interval
            assert isinstance(value, int | float) and math.isfinite(value) and value >= 1, (
                name, agents)
            assert low is not None and low <= value and (
                agents["ci_high_infinite"] or value <= high), (name, agents)


# Coverage of the N interval on each side, per shape (issue 29: "the interval must cover the
# truth at its stated rate on both sides, or state its measured coverage"). The full measurement
# (docs/measured-figures.md, "Coverage of the plan's intervals"): PLAN_SHAPE_REPETITIONS=400
# PLAN_SHAPE_RESAMPLES=1000 [PLAN_SHAPE_PER_LEVEL=8] pytest tests/plan/test_shapes.py -k covers
# -s. By default 40 repetitions at B = 200 per shape, 16 continuations per level (the CPU
# sweep's default is 8, the GPU's 32): a side that misses more than 2 of 40 (5%) fails. The
# seeds are fixed, so the count is too: 1, 1 and 0 of 40 below the interval now, 4, 2 and 3
# with the percentile interval alone (which fails it). A nominal 2.5% side would exceed 2 of 40
# by chance 12% of the time: a change to the plan that trips it needs the full-size command
# above before its verdict is believed either way. At PLAN_SHAPE_PER_LEVEL=8 it fails by
# design: the pessimistic end misses 6-7.5% there, which plan.md states (plan/writeup.py).
REPETITIONS = int(os.environ.get("PLAN_SHAPE_REPETITIONS", "40"))
RESAMPLES = int(os.environ.get("PLAN_SHAPE_RESAMPLES", "200"))
PER_LEVEL = int(os.environ.get("PLAN_SHAPE_PER_LEVEL", "16"))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_n_interval_covers_the_truth_on_each_side_per_shape(
        truth: Any, make_sweep: Callable[..., Path], shape: str) -> None:
    curve = type(truth)(**SHAPES[shape])
    slo = curve.quantile(5.5, 0.9)
    true_n = curve.agents_at(slo, 0.9)
    below = above = 0  # the truth below the low end: the plan overstated capacity
    for seed in range(REPETITIONS):
        run = make_sweep(f"{shape}-{seed}", seed=seed, truth=curve, per_level=PER_LEVEL)
        plan = build_plan(PlanConfig(run_dir=run, slo=f"p90:{slo:.3f}s", bootstrap=RESAMPLES,
                                     seed=seed, plots=False, fleet_replicas=()))
        low, high = plan.capacity["clean"].n_slo_ci
        below += true_n < low
        above += true_n > high
    print(f"{shape}: true N {true_n:.2f}; {PER_LEVEL} continuations per level; over "
          f"{REPETITIONS} repetitions at B = {RESAMPLES}, "
          f"the truth fell below the interval {below / REPETITIONS:.3f} (capacity overstated) "
          f"and above it {above / REPETITIONS:.3f}")
    assert below <= REPETITIONS / 20 and above <= REPETITIONS / 20, (below, above)
