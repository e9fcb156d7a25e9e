"""Agents per GPU, its engine caps and the binding limit, GPUs needed, per-task figures."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.plan.capacity import gpus_needed
from compaction_bench.plan.planner import build_plan
from compaction_bench.plan.settings import PlanConfig


def _plan(run: Path, slo: str, **kw: Any) -> Any:
    return build_plan(PlanConfig(run_dir=run, slo=slo, bootstrap=300, plots=False, **kw))


def test_the_sequence_cap_binds_through_the_measured_duty(make_sweep: Callable[..., Path],
                                                          truth: Any) -> None:
    # no level measured between 2 and 8: the cap of 3 is below the SLO's 5.5 and above the
    # largest level measured within the SLO (2), so nothing outranks it (a measured N=4 within
    # the SLO would lift it: tests/plan/test_caps.py)
    run = make_sweep(requests=True, max_num_seqs=2, levels=(1, 2, 8))
    plan = _plan(run, f"p90:{truth.quantile(5.5, 0.9)}s")
    cap = plan.capacity["clean"]
    assert cap.duty == pytest.approx(0.6, abs=1e-6)  # three requests, each 20% of the time
    assert cap.seq_cap == 3  # floor(2 / 0.6)
    assert cap.kv_cap == 6  # floor(100 blocks x 128 / (2000 prompt + 100 completion))
    assert (cap.agents, cap.binding) == (3, "max_num_seqs")
    # the SLO's own interval of N reaches below the cap ([2.9, 5.8] at seed 0: only N = 2 and
    # 8 were measured around it), so the agents interval does too; both read one set of
    # resamples (plan/capacity.py `reflected`)
    assert not cap.extrapolated and cap.agents_ci == (min(3, math.floor(cap.n_slo_ci[0])), 3)
    need = gpus_needed(cap, 100, 1)
    assert (need.gpus, need.replicas) == (34, 34)  # ceil(100 / 3)
    per_task = plan.operating["clean"]
    assert per_task is not None and per_task.agents == 3
    assert per_task.gpu_s_per_task == pytest.approx(3600 / per_task.tasks_per_gpu_hour)


def test_the_kv_cache_cap_binds_when_the_slo_allows_more(make_sweep: Callable[..., Path],
                                                         truth: Any) -> None:
    plan = _plan(make_sweep(requests=True), f"p90:{truth.quantile(7.5, 0.9)}s")
    cap = plan.capacity["clean"]
    assert (cap.agents, cap.binding) == (6, "KV cache")
    assert cap.n_slo is not None and 6.5 < cap.n_slo < 8.5


def test_a_relative_slo_follows_the_reference_alone(make_sweep: Callable[..., Path],
                                                    truth: Any) -> None:
    plan = _plan(make_sweep(), "p90:2x")
    cap = plan.capacity["clean"]
    alone = truth.quantile(1, 0.9)
    assert cap.slo_ci[0] < 2 * alone < cap.slo_ci[1]
    assert cap.n_slo_ci[0] < truth.agents_at(2 * alone, 0.9) < cap.n_slo_ci[1]
    assert cap.binding == "SLO" and cap.agents == math.floor(cap.n_slo or 0)


def test_beyond_the_measured_levels_is_marked_extrapolated(make_sweep: Callable[..., Path],
                                                           truth: Any) -> None:
    plan = _plan(make_sweep(levels=(1, 2, 4)), f"p90:{truth.quantile(6.0, 0.9)}s")
    cap = plan.capacity["clean"]
    assert cap.n_slo_extrapolated and cap.extrapolated and cap.agents >= 5
    assert plan.operating["clean"] is not None and plan.operating["clean"].extrapolated
    assert len(cap.lolo) == 3 and cap.lolo_mape is not None and cap.lolo_mape < 30


def test_energy_per_task_is_the_replicas_power_over_its_task_rate(
        make_sweep: Callable[..., Path], truth: Any) -> None:
    plan = _plan(make_sweep(power_w=700.0), f"p90:{truth.quantile(5.5, 0.9)}s")
    assert plan.observations.gpu_names == ("NVIDIA H200",)
    cap = plan.capacity["clean"]
    for j, figures in enumerate(plan.level_figures["clean"]):
        level = cap.levels[j].level
        assert figures.power_w == pytest.approx(700.0)
        assert figures.joules_per_task == pytest.approx(700.0 * cap.mean_cycle[j] / level)
    assert not any("NVML" in line for line in plan.cannot)
