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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
