"""`make plan` and `plan-check` name the sweep cells whose host was contended (issue 30: a sweep
made while the machine was busy measured clean alone at 98.9 s against 23.1 s quiet). On
synthetic sweep run folders (conftest.py) whose cells' lines carry the bench's host verdict."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compaction_bench.plan.check import check_plan, write_check
from compaction_bench.plan.observations import HOST_NOTE, observe
from compaction_bench.plan.planner import build_plan
from compaction_bench.plan.settings import PlanConfig

FIGURE = "other processes used 1.6 of 2 cores on average (threshold 0.25 cores)"


def contend(run: Path, arm: str, level: int) -> Path:
    """Mark one cell's line contended, as the bench writes it (bench/run/sweep.py with_host)."""
    path = run / "sweep.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for line in lines:
        hot = line["arm"] == arm and line["level"] == level
        line["host"] = {"verdict": "contended" if hot else "quiet",
                        "figure": FIGURE if hot else "other processes used 0.01 of 2 cores"}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_the_plan_names_its_contended_cells(truth: Any,
                                            make_sweep: Callable[..., Path]) -> None:
    run = contend(make_sweep("busy", seed=1), "clean", 2)
    assert observe(run).contended == (f"clean N=2: {FIGURE}",)
    config = PlanConfig(run_dir=run, slo=f"p90:{truth.quantile(5.5, 0.9)}s", bootstrap=200,
                        plots=False)
    notes = [n for n in build_plan(config).notes if n.startswith(HOST_NOTE)]
    assert notes == [f"{HOST_NOTE} in busy while 1 cell(s) ran: clean N=2: {FIGURE}. Other "
                     "processes on this machine took CPU, so these cells' times are longer "
                     "than the server alone gives: measure them again on a quiet machine "
                     "(make bench RESUME=busy QUIET_ONLY=1)"]
    quiet = contend(make_sweep("calm", seed=1), "nobody", 1)
    assert observe(quiet).contended == ()
    assert not [n for n in build_plan(PlanConfig(
        run_dir=quiet, slo=config.slo, bootstrap=200, plots=False)).notes
        if n.startswith(HOST_NOTE)]


def test_plan_check_names_a_check_runs_contended_cells(
        plan_and_check: Callable[..., tuple[PlanConfig, Path]]) -> None:
    config, check = plan_and_check()
    agents = build_plan(config).capacity["clean"].agents
    assert agents is not None
    contend(check, "clean", 2 * agents)
    plan, rows = check_plan(config, [check], replicas=2)
    assert rows and [n for n in plan.notes if n.startswith(f"{HOST_NOTE} in fleet-round_robin")]
    markdown, _, _ = write_check(config, [check], replicas=2)
    assert f"{HOST_NOTE} in fleet-round_robin while 1 cell(s) ran: clean N={2 * agents}" \
        in markdown.read_text()
