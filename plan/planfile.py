"""plan.json: the plan's figures in a versioned, documented schema (plan/SCHEMA.md).

Strict JSON: an infinite value (no finite break-even, an interval without an upper end) is
written as null beside a flag that says it is infinite.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compaction_bench.plan.breakeven import BreakEven
from compaction_bench.plan.capacity import ArmCapacity, FleetNeed
from compaction_bench.plan.economics import TaskFigures
from compaction_bench.plan.fleettables import fleet_json
from compaction_bench.plan.planner import Plan
from compaction_bench.plan.settings import PlanConfig

PLAN_SCHEMA = "compbench.plan"
PLAN_SCHEMA_VERSION = 3
FIT_METHOD = ("weighted isotonic regression of the per-level quantile, then scipy "
              "PchipInterpolator; linear beyond the measured levels")


def num(value: float | None) -> float | None:
    if value is None or math.isinf(value) or math.isnan(value):
        return None
    return float(value)


def pair(values: Sequence[float | None] | None) -> list[float | None] | None:
    return None if values is None else [num(v) for v in values]


def _figures(f: TaskFigures | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"condition": f.condition, "agents": num(f.agents), "n": f.n,
            "tasks_per_gpu_hour": num(f.tasks_per_gpu_hour),
            "tasks_per_gpu_hour_ci": pair(f.tasks_per_gpu_hour_ci),
            "gpu_s_per_task": num(f.gpu_s_per_task), "gpu_s_per_task_ci": pair(f.gpu_s_per_task_ci),
            "cost_per_task": num(f.cost_per_task), "cost_unit": f.cost_unit,
            "compressor_tokens_per_task": num(f.compressor_tokens_per_task),
            "joules_per_task": num(f.joules_per_task), "power_w": num(f.power_w),
            "extrapolated": f.extrapolated, "note": f.note, "arm": f.arm}


def _need(need: FleetNeed, gpus_per_replica: int, extrapolated: bool) -> dict[str, Any]:
    return {"agents": need.agents, "gpus": need.gpus, "gpus_ci": list(need.gpus_ci),
            "replicas": need.replicas, "gpus_per_replica": gpus_per_replica,
            "extrapolated": extrapolated, "unbounded": need.unbounded,
            "beyond_measured_range": need.beyond}


def _slo_reference(plan: Plan) -> dict[str, Any] | None:
    """A relative SLO's reference arm and level (None: an absolute SLO, or no sweep)."""
    first = next(iter(plan.capacity.values()), None)
    ref = first.slo_reference if first is not None else None
    return None if ref is None else {"arm": ref.arm, "level": ref.level,
                                     "substitute": ref.substitute}


def _arm(plan: Plan, cap: ArmCapacity) -> dict[str, Any]:
    engine = plan.observations.engine
    figures = {f.condition: f for f in plan.level_figures.get(cap.arm, [])}
    levels = []
    for j, lv in enumerate(cap.levels):
        f = figures.get(f"N={lv.level}")
        levels.append({"level": lv.level, "n": lv.n, "failed": lv.failed,
                       "censored": lv.censored, "censored_at_s": num(lv.censored_at_s),
                       "quantile_s": num(float(cap.quantiles[j])),
                       "quantile_ci": pair(cap.quantile_ci[j]), "quantile_of": cap.slo_time,
                       "median_s": num(float(np.median(lv.postfork_s)) if lv.n else None),
                       "mean_cycle_s": num(float(cap.mean_cycle[j])), "duty": num(lv.duty),
                       **{k: v for k, v in (_figures(f) or {}).items()
                          if k not in ("condition", "agents", "n", "arm", "extrapolated",
                                       "note")}})
    fleets = plan.fleets.get(cap.arm, [])
    at_agents = next((n for n in fleets if n.agents == plan.config.agents), None)
    return {
        "agents_per_gpu": {
            "value": cap.agents, "unbounded": cap.unbounded, "ci": pair(cap.agents_ci),
            "ci_high_infinite": math.isinf(cap.agents_ci[1]),
            "per_gpu": num(cap.agents_per_gpu), "gpus_per_replica": cap.gpus_per_replica,
            "binding": cap.binding, "slo_time": cap.slo_time,
            "beyond_measured_range": cap.beyond, "extrapolation_reach": num(cap.reach),
            "model_error": dataclasses.asdict(cap.model_error),
            "extrapolated": cap.extrapolated, "n_slo": num(cap.n_slo),
            "n_slo_infinite": cap.n_slo is not None and math.isinf(cap.n_slo),
            "n_slo_beyond_reach": cap.n_slo_beyond,
            "n_slo_ci": pair(cap.n_slo_ci), "n_slo_extrapolated": cap.n_slo_extrapolated,
            "slo_s": num(cap.slo_s), "slo_s_ci": pair(cap.slo_ci), "kv_cap": cap.kv_cap,
            "seq_cap": cap.seq_cap, "duty": num(cap.duty),
            "resident_tokens": num(cap.resident_tokens),
            "kv_pool_tokens": engine.kv_pool_tokens, "kv_source": engine.kv_source,
            "max_num_seqs": engine.max_num_seqs,
            "n_continuations": sum(lv.n for lv in cap.levels),
            "n_fit": sum(lv.n_all for lv in cap.levels),
            "caps_lifted": [dataclasses.asdict(lift) for lift in cap.lifted],
            "largest_level_within_slo": cap.held_level,
            "smallest_level_missing_slo": cap.missed_level,
            "interval_sampling_only": cap.sampling_only},
        "levels": levels,
        "excluded_levels": [{"level": lv.level, "n": lv.n, "failed": lv.failed,
                             "censored": lv.censored, "lost": lv.n == 0}
                            for lv in cap.excluded],
        "fit": {"method": FIT_METHOD, "leave_one_level_out": cap.lolo,
                "lolo_mape_interior_pct": num(cap.lolo_mape),
                "lolo_mape_all_pct": num(cap.lolo_mape_all)},
        "gpus_needed": None if at_agents is None else _need(
            at_agents, engine.gpus_per_replica, cap.extrapolated),
        "gpus_curve": [_need(n, engine.gpus_per_replica, cap.extrapolated) for n in fleets],
        "per_task": _figures(plan.operating.get(cap.arm)),
    }


def _breakeven(be: BreakEven) -> dict[str, Any]:
    data = {k: v for k, v in dataclasses.asdict(be).items() if k != "curve"}
    data["uses_infinite"] = be.uses is not None and math.isinf(be.uses)
    data["uses"] = num(be.uses)
    data["uses_ci"] = pair(be.uses_ci)
    data["uses_ci_high_infinite"] = be.uses_ci is not None and be.uses_ci[1] is None
    data["saving_ci"] = pair(be.saving_ci)
    data["uses_per_unit_one_time"] = num(be.uses_per_unit)
    data["amortized"] = {str(k): num(v) for k, v in be.amortized.items()}
    data["net_saving_by_uses"] = [{"uses": k, "net": num(v), "ci": [num(lo), num(hi)]}
                                  for k, v, lo, hi in be.curve]
    return data


def _config(config: PlanConfig) -> dict[str, Any]:
    data: dict[str, Any] = config.model_dump(mode="json")
    data["run_dir"] = str(config.run_dir)
    return data


def plan_json(plan: Plan, plots: Sequence[Path]) -> dict[str, Any]:
    """The plan.json object (plan/SCHEMA.md)."""
    obs, slo = plan.observations, plan.config.target
    engine = obs.engine
    sim = plan.simulation
    return {
        "schema": PLAN_SCHEMA,
        "schema_version": PLAN_SCHEMA_VERSION,
        "run_id": obs.run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scope": "sweep" if plan.sweep else "regimes",
        "config": _config(plan.config),
        "slo": {"quantile": slo.quantile, "value": slo.value, "relative": slo.relative,
                "label": slo.label, "reference": _slo_reference(plan)},
        "bootstrap": {"resamples": plan.config.bootstrap, "confidence": plan.config.confidence,
                      "seed": plan.config.seed},
        "engine": {"profile": engine.profile, "engine": engine.engine,
                   "max_num_seqs": engine.max_num_seqs, "kv_pool_tokens": engine.kv_pool_tokens,
                   "kv_source": engine.kv_source, "gpus_per_replica": engine.gpus_per_replica,
                   "device": engine.device, "model_reasons": engine.reasons,
                   "replayed": list(engine.replayed)},
        "notes": plan.notes,
        "cannot": plan.cannot,
        "excluded": obs.excluded,
        "arms": {arm: _arm(plan, cap) for arm, cap in plan.capacity.items()},
        "regimes": [_figures(f) for f in plan.regime_figures],
        "breakeven_headline": plan.headline_condition,
        "breakeven": [_breakeven(be) for be in plan.breakeven],
        "simulation": None if sim is None else {
            "costmodel": sim.source, "device": sim.device,
            "costmodel_heldout_mape_pct": sim.heldout_mape,
            "transfer_device": sim.transfer_device, "notes": sim.notes,
            "arms": {arm: {"mape_pct": num(sim.mape(arm)),
                           "levels": [dataclasses.asdict(lv) for lv in levels],
                           "transferred": [dataclasses.asdict(lv)
                                           for lv in sim.transferred.get(arm, [])]}
                     for arm, levels in sim.levels.items()}},
        "fleet": fleet_json(plan.fleet),
        "plots": [str(p.relative_to(obs.path)) if p.is_relative_to(obs.path) else str(p)
                  for p in plots],
        "issues": obs.issues,
    }
