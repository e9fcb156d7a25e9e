"""`make plan`: a run folder's records in, `plan.md`, `plan.json` and plots out.

A pure function of the run folder's records and the config (`build_plan`), rendered afterwards
(`plan.write.write_plan`): the same figures land in plan.json (plan/SCHEMA.md), plan.md and the
plots.
A sweep run gets the whole plan; any other run (the three regimes, the study's imported B300
records) gets what its records support, and one line for each thing it cannot derive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compaction_bench.plan.breakeven import BreakEven, time_and_cost
from compaction_bench.plan.capacity import ArmCapacity, FleetNeed, gpus_needed, plan_capacity
from compaction_bench.plan.economics import (
    EXTERNAL,
    Prices,
    TaskFigures,
    continuation_cost,
    level_figures,
    one_time_cost,
    operating_point,
    regime_figures,
)
from compaction_bench.plan.fleetmodel import FleetPlan, plan_fleet
from compaction_bench.plan.fleetsim import SimulatedLevel, predict_levels, traces
from compaction_bench.plan.observations import SWEEP, Observations, contended_note, observe
from compaction_bench.plan.settings import PlanConfig, PlanError

REFERENCE = "clean"
SIMULATED_SAMPLES = 200
NO_SWEEP = ("agents per GPU and GPUs needed need a load-response sweep (make bench "
            "REGIME=sweep): the regimes' continuations perform different work, so they do not "
            "identify a load-response curve")


@dataclass
class Simulation:
    """The fleet simulator's predictions per arm (plan.fleetsim)."""

    source: str
    device: str
    heldout_mape: dict[str, float | None]
    levels: dict[str, list[SimulatedLevel]]
    transferred: dict[str, list[SimulatedLevel]] = field(default_factory=dict)
    transfer_device: str | None = None
    notes: list[str] = field(default_factory=list)

    def mape(self, arm: str) -> float | None:
        errors = [lv.ape_pct for lv in self.levels.get(arm, []) if lv.ape_pct is not None]
        return float(np.median(errors)) if errors else None


@dataclass
class Plan:
    config: PlanConfig
    observations: Observations
    prices: Prices
    capacity: dict[str, ArmCapacity]
    fleets: dict[str, list[FleetNeed]]
    level_figures: dict[str, list[TaskFigures]]
    operating: dict[str, TaskFigures | None]
    regime_figures: list[TaskFigures]
    breakeven: list[BreakEven]
    headline_condition: str | None
    simulation: Simulation | None
    cannot: list[str]
    notes: list[str]
    fleet: FleetPlan | None = None  # plan.fleetmodel: fleets under each routing policy

    @property
    def sweep(self) -> bool:
        return bool(self.capacity)


def fleet_sizes(agents: int) -> list[int]:
    """Fleet sizes for the GPUs-needed curve: up to twice the planned fleet."""
    top = 2 * agents
    step = max(1, top // 60)
    return sorted({*range(step, top + 1, step), agents})


def build_plan(config: PlanConfig) -> Plan:
    """Every figure of the plan (module docstring)."""
    obs = observe(config.run_dir)
    if not obs.continuations:
        raise PlanError(f"{config.run_dir}: no usable arm records to plan from "
                        f"({sum(obs.excluded.values())} excluded: "
                        f"{', '.join(f'{k} {v}' for k, v in obs.excluded.items()) or 'none'}); "
                        "run `make bench REGIME=sweep` first")
    prices = Prices(config.gpu_hour_usd, config.compressor_usd_per_mtok)
    rng = np.random.default_rng(config.seed + 1)
    b, conf = config.bootstrap, config.confidence
    capacity = plan_capacity(obs, config) if obs.is_sweep else {}
    gpus = obs.engine.gpus_per_replica
    fleets = {arm: [gpus_needed(cap, n, gpus) for n in fleet_sizes(config.agents)]
              for arm, cap in capacity.items()}
    levels = {arm: level_figures(cap, obs, prices, b=b, confidence=conf, rng=rng)
              for arm, cap in capacity.items()}
    operating = {arm: operating_point(cap, obs, prices, confidence=conf)
                 for arm, cap in capacity.items()}
    regimes = sorted({c.condition for c in obs.continuations if c.condition != SWEEP})
    per_regime = [regime_figures(obs, arm, regime, prices, b=b, confidence=conf, rng=rng)
                  for regime in regimes for arm in obs.arms if obs.of(arm, regime)]
    breakeven, headline = _breakeven(obs, capacity, prices, config, rng)
    cannot, notes = _reach(obs, capacity, prices)
    simulation = _simulate(obs, capacity, config) if config.costmodel else None
    fleet = plan_fleet(obs, capacity, config)
    return Plan(config, obs, prices, capacity, fleets, levels, operating, per_regime,
                breakeven, headline, simulation, cannot, notes, fleet)


def _conditions(obs: Observations) -> list[tuple[str, str, int | None]]:
    """(label, condition, level) for every set of matched continuations."""
    out: list[tuple[str, str, int | None]] = []
    sweep_levels = sorted({c.level for c in obs.continuations
                           if c.condition == SWEEP and c.level is not None})
    out += [(f"sweep N={n}", SWEEP, n) for n in sweep_levels]
    out += [(regime, regime, None) for regime in
            sorted({c.condition for c in obs.continuations if c.condition != SWEEP})]
    return out


def _breakeven(obs: Observations, capacity: dict[str, ArmCapacity], prices: Prices,
               config: PlanConfig, rng: np.random.Generator
               ) -> tuple[list[BreakEven], str | None]:
    out: list[BreakEven] = []
    cost = continuation_cost(obs, prices)
    for label, condition, level in _conditions(obs):
        reference = [c for c in obs.of(REFERENCE, condition) if c.level == level]
        for arm in obs.arms:
            compact = [c for c in obs.of(arm, condition) if c.level == level]
            if arm == REFERENCE or not compact or not reference:
                continue
            out += time_and_cost(arm, label, reference, compact, cost=cost,
                                 one_time_cost=one_time_cost(compact, obs, prices),
                                 cost_unit=prices.unit, cost_note=_cost_note(obs, arm, prices),
                                 b=config.bootstrap, confidence=config.confidence, rng=rng)
    headline = None
    if capacity:
        found = capacity[REFERENCE].agents if REFERENCE in capacity else 1
        planned = found if found is not None else max(  # unbounded: the largest measured
            (c.level for c in obs.continuations if c.level is not None), default=1)
        measured = sorted({c.level for c in obs.continuations if c.level is not None})
        below = [n for n in measured if n <= max(planned, 1)]
        headline = f"sweep N={below[-1] if below else measured[0]}"
    elif out:
        headline = out[0].condition
    return out, headline


def _cost_note(obs: Observations, arm: str, prices: Prices) -> str:
    notes = []
    if not obs.is_sweep and not obs.has_requests:
        notes.append("no per-request records: a use's GPU time cannot be attributed")
    if arm == EXTERNAL and (prices.compressor_usd_per_mtok is None or prices.gpu_hour_usd is None
                            ) and any(c.rewrite_tokens or c.fork_rewrite_tokens
                                      for c in obs.of(arm)):
        notes.append("the external compressor's tokens need GPU_HOUR_USD and "
                     "COMPRESSOR_USD_PER_MTOK to be priced with GPU time")
    return "; ".join(notes)


def _reach(obs: Observations, capacity: dict[str, ArmCapacity], prices: Prices
           ) -> tuple[list[str], list[str]]:
    """(what these records cannot tell, notes every reader needs)."""
    cannot, notes = [], []
    if obs.engine.replayed:
        notes.append(f"replay: the recorded turns of {', '.join(obs.engine.replayed)} priced "
                     f"on {obs.engine.profile} ({obs.engine.device}); the served model's own "
                     "reasoning is not what is measured")
    elif not obs.engine.reasons:
        notes.append(f"{obs.engine.profile}: the model is far too small to reason, so this plan "
                     "demonstrates the method, not the effect of compaction")
    if not capacity:
        cannot.append(NO_SWEEP)
    if not obs.has_requests:
        cannot.append("per-task GPU-seconds and energy need per-request records "
                      "(requests.jsonl), which this run does not have")
    if obs.power is None:
        cannot.append("energy per task needs NVML GPU telemetry; gpu.jsonl has none "
                      f"({obs.engine.device})")
    if capacity and obs.engine.kv_pool_tokens is None:
        cannot.append("the KV-cache cap needs the server's KV pool (vllm:cache_config_info), "
                      "which the manifest does not record")
    if any(c.fork_rewrite_s is None for c in obs.continuations if c.arm != REFERENCE):
        cannot.append("break-even uses need the one-time rewrite time (fork_rewrite_s), which "
                      "some records lack: their break-even is given per second of rewriting")
    if REFERENCE not in obs.arms:
        cannot.append(f"break-even uses and every saving need the {REFERENCE} arm, which this "
                      f"run lacks (arms: {', '.join(obs.arms) or 'none'}): run it with "
                      f"ARMS={REFERENCE},...")
    if prices.gpu_hour_usd is None:
        notes.append("costs are in GPU-seconds: pass GPU_HOUR_USD for dollars")
    if (host := contended_note(obs)) is not None:
        notes.append(host)
    return cannot, notes


def _simulate(obs: Observations, capacity: dict[str, ArmCapacity], config: PlanConfig
              ) -> Simulation | None:
    from compaction_bench.kernels.costmodel import load
    from compaction_bench.kernels.limits import limits_for

    assert config.costmodel is not None
    costs = load(config.costmodel)
    seqs = obs.engine.max_num_seqs or int((costs.engine or {}).get("max_num_seqs") or 1)
    sim = Simulation(source=str(config.costmodel), device=str(costs.device.get("name")),
                     heldout_mape=costs.heldout_mape, levels={})
    if not capacity:
        sim.notes.append("the simulator replays a sweep's continuations; this run has none")
        return sim
    q = config.target.quantile
    transfer = None
    if config.predict_device:
        limits = limits_for(config.predict_device)
        if limits is None:
            raise PlanError(f"PREDICT_DEVICE={config.predict_device!r} has no row in "
                            "kernels/limits.toml; use one of its GPU names")
        transfer = costs.on_device(limits)
        sim.transfer_device = limits.name
        sim.notes.append(f"on {limits.name}: the engine's step costs move by the roofline's "
                         "efficiencies; this run's gaps (tools, rewriting), token counts and "
                         "max_num_seqs stay as measured; no measurement checks it")
    for arm, cap in capacity.items():
        pool = traces(obs, arm, cap.levels[0].level, same_server_compressor=arm != EXTERNAL)
        if not pool:
            sim.notes.append(f"{arm}: no measured continuation with request records")
            continue
        measured = {lv.level: float(v) for lv, v in zip(cap.levels, cap.quantiles, strict=True)}
        top = max(measured)
        wanted = sorted({*measured, 2 * top, 4 * top})
        sim.levels[arm] = predict_levels(costs, pool, wanted, measured, quantile=q,
                                         max_num_seqs=seqs, samples=SIMULATED_SAMPLES,
                                         seed=config.seed)
        if transfer is not None:
            sim.transferred[arm] = predict_levels(transfer, pool, wanted, {}, quantile=q,
                                                  max_num_seqs=seqs,
                                                  samples=SIMULATED_SAMPLES, seed=config.seed)
    return sim
