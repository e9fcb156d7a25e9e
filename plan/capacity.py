"""Agents per GPU and GPUs needed, per arm, from a load-response sweep.

For each arm: the SLO's quantile of postfork time at each measured level N, a monotone curve
through them (plan.curve), inverted at the SLO: N_slo, the largest (real-valued) fleet whose
quantile meets the target. Two engine limits cap it:
- the KV cache: the server's KV pool (tokens) over the agent's resident tokens (the SLO's
  quantile, over the arm's measured continuations, of the largest request's prompt +
  completion): beyond it not every agent's history stays cached, so prefixes are evicted and
  recomputed;
- the sequence limit: max_num_seqs over the agent's duty at the lowest level (the share of its
  cycle with one of its requests in flight): the fleet at which the engine's sequence slots are
  full on average, past which more agents add queueing, not throughput (a closed system's
  saturation point). With a duty of 1 it is max_num_seqs itself.
Agents per GPU is floor(min(N_slo, caps)), the binding limit named; with a fleet of A agents,
GPUs needed = ceil(A / agents per GPU) x the profile's GPUs per replica.

Quantiles are Harrell-Davis estimates. Intervals: a joint bootstrap resamples each (arm,
level)'s continuations with replacement (B times, one seeded generator; smoothed for the
quantiles, common.resampling) and refits; a relative SLO is recomputed from each resample's
reference arm. Percentile intervals of N_slo, agents per GPU and GPUs needed come from the same
resamples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from compaction_bench.common.resampling import interval, replicates, smoothed
from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.plan.curve import CurveBatch, MonotoneCurve, leave_one_level_out
from compaction_bench.plan.observations import SWEEP, Continuation, Engine, Observations
from compaction_bench.plan.settings import PlanConfig, PlanError, Slo

REFERENCE = "clean"


@dataclass(frozen=True)
class Level:
    """One arm's measured level: its continuations and the curve's inputs."""

    level: int
    postfork_s: np.ndarray  # complete measured continuations
    cycle_s: np.ndarray
    failed: int
    duty: float | None
    resident_tokens: list[int]

    @property
    def n(self) -> int:
        return len(self.postfork_s)


@dataclass
class ArmCapacity:
    """The capacity figures of one arm (module docstring); intervals are (low, high)."""

    arm: str
    levels: list[Level]
    quantiles: np.ndarray  # the SLO quantile per level
    quantile_ci: list[tuple[float, float]]
    mean_cycle: np.ndarray
    slo_s: float
    slo_ci: tuple[float, float]
    n_slo: float | None  # None: not even one agent meets the SLO; inf: never reached
    n_slo_ci: tuple[float, float]  # an end may be inf
    n_slo_extrapolated: bool
    kv_cap: int | None
    seq_cap: int | None
    duty: float | None
    resident_tokens: float | None
    agents: int  # agents per GPU (per replica), after the caps
    agents_ci: tuple[int, int]
    binding: str
    extrapolated: bool  # the planned fleet lies beyond the measured levels
    replicates: np.ndarray = field(repr=False)  # agents per replica, one per resample
    cycle_replicates: np.ndarray = field(repr=False)  # mean cycle at the replicate's agents
    lolo: list[dict[str, float | bool]] = field(default_factory=list)

    @property
    def lolo_mape(self) -> float | None:
        inside = [e["ape_pct"] for e in self.lolo if not e["extrapolated"]]
        return float(np.median(inside)) if inside else None

    @property
    def lolo_mape_all(self) -> float | None:
        errors = [e["ape_pct"] for e in self.lolo]
        return float(np.median(errors)) if errors else None


def _levels(continuations: list[Continuation]) -> list[Level]:
    by_level: dict[int, list[Continuation]] = {}
    for c in continuations:
        if c.level is not None:
            by_level.setdefault(c.level, []).append(c)
    out = []
    for level in sorted(by_level):
        group = by_level[level]
        ok = [c for c in group if c.complete]
        busy = [(c.busy_s, c.cycle_s) for c in ok if c.busy_s is not None and c.cycle_s > 0]
        out.append(Level(
            level=level, postfork_s=np.array([c.postfork_s for c in ok]),
            cycle_s=np.array([c.cycle_s for c in ok]), failed=len(group) - len(ok),
            duty=min(1.0, sum(b for b, _ in busy) / sum(t for _, t in busy)) if busy else None,
            resident_tokens=[c.resident_tokens for c in ok if c.resident_tokens is not None]))
    return out


def _floor(value: float | None) -> int:
    if value is None:
        return 0
    return 10**9 if math.isinf(value) else max(0, math.floor(value + 1e-9))


def capped(n_slo: float | None, kv_cap: int | None, seq_cap: int | None) -> tuple[int, str]:
    """Agents per replica and the binding limit."""
    limits = [("SLO", _floor(n_slo))]
    limits += [(name, cap) for name, cap in (("KV cache", kv_cap), ("max_num_seqs", seq_cap))
               if cap is not None]
    name, agents = min(limits, key=lambda item: item[1])
    if agents >= 10**9:
        return 0, "unbounded (the curve never reaches the SLO and no engine limit is known)"
    if agents == 0 and name == "SLO":
        return 0, "SLO not met even by one agent"
    return agents, name


def _caps(levels: list[Level], engine: Engine, quantile: float
          ) -> tuple[int | None, int | None, float | None, float | None]:
    """(KV cap, sequence cap, duty at the lowest level, resident tokens)."""
    resident_all = [t for lv in levels for t in lv.resident_tokens]
    resident = float(np.quantile(resident_all, quantile)) if resident_all else None
    kv = (math.floor(engine.kv_pool_tokens / resident)
          if engine.kv_pool_tokens and resident else None)
    duty = next((lv.duty for lv in levels if lv.duty), None)
    seq = math.floor(engine.max_num_seqs / duty + 1e-9) if engine.max_num_seqs and duty else (
        engine.max_num_seqs)
    return kv, seq, duty, resident


def sweep_levels(observations: Observations) -> dict[str, list[Level]]:
    """Each arm's measured levels (complete continuations; failures counted)."""
    out = {}
    for arm in observations.arms:
        found = _levels(observations.of(arm, SWEEP))
        if found:
            out[arm] = found
    return out


def _resample(levels: list[Level], quantile: float, rng: np.random.Generator, b: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(B x levels) resampled quantiles and mean cycles."""
    qs, cycles = np.empty((b, len(levels))), np.empty((b, len(levels)))
    for j, lv in enumerate(levels):
        qs[:, j] = hd_quantile(smoothed(np.maximum(lv.postfork_s, 1e-9), b, rng), quantile,
                               axis=1)
        cycles[:, j] = replicates(lv.cycle_s, rng, "mean", b)
    return qs, cycles


def _inverse(curve: MonotoneCurve, target: float) -> tuple[float | None, bool]:
    found = curve.inverse(target)
    return found.value, found.extrapolated


def plan_capacity(observations: Observations, config: PlanConfig) -> dict[str, ArmCapacity]:
    """Every arm's capacity figures (module docstring)."""
    slo = config.target
    by_arm = {arm: [lv for lv in levels if lv.n > 0]
              for arm, levels in sweep_levels(observations).items()}
    by_arm = {arm: levels for arm, levels in by_arm.items() if levels}
    if not by_arm:
        raise PlanError(f"{observations.path}: no complete measured sweep continuations to fit")
    rng = np.random.default_rng(config.seed)
    resampled = {arm: _resample(levels, slo.quantile, rng, config.bootstrap)
                 for arm, levels in by_arm.items()}
    point_q = {arm: np.array([float(hd_quantile(lv.postfork_s, slo.quantile)) for lv in levels])
               for arm, levels in by_arm.items()}
    slo_point, slo_reps = _targets(slo, by_arm, point_q, resampled, config.bootstrap)
    out = {}
    for arm, levels in by_arm.items():
        out[arm] = _arm(arm, levels, point_q[arm], resampled[arm], slo_point, slo_reps,
                        observations.engine, slo, config)
    return out


def _targets(slo: Slo, by_arm: dict[str, list[Level]], point_q: dict[str, np.ndarray],
             resampled: dict[str, tuple[np.ndarray, np.ndarray]], b: int
             ) -> tuple[float, np.ndarray]:
    """The SLO in seconds, and per resample (a relative SLO moves with its reference)."""
    if not slo.relative:
        return slo.value, np.full(b, slo.value)
    reference = REFERENCE if REFERENCE in by_arm else next(iter(by_arm))
    return (slo.value * float(point_q[reference][0]),
            slo.value * resampled[reference][0][:, 0])


def _arm(arm: str, levels: list[Level], quantiles: np.ndarray,
         resampled: tuple[np.ndarray, np.ndarray], slo_s: float, slo_reps: np.ndarray,
         engine: Engine, slo: Slo, config: PlanConfig) -> ArmCapacity:
    x = [lv.level for lv in levels]
    weights = [lv.n for lv in levels]
    qs, cycles = resampled
    kv_cap, seq_cap, duty, resident = _caps(levels, engine, slo.quantile)
    n_slo, n_extra = _inverse(MonotoneCurve(x, quantiles, weights), slo_s)
    agents, binding = capped(n_slo, kv_cap, seq_cap)
    n_arr = CurveBatch(x, qs, weights).inverse(slo_reps)
    agents_arr = np.array([capped(None if math.isnan(v) else float(v), kv_cap, seq_cap)[0]
                           for v in n_arr])
    cycle_arr = np.where(agents_arr > 0, CurveBatch(x, cycles, weights).at(agents_arr), np.nan)
    n_ci = interval(np.where(np.isnan(n_arr), 0.0, n_arr), config.confidence)  # none: 0
    low, high = interval(agents_arr, config.confidence)
    return ArmCapacity(
        arm=arm, levels=levels, quantiles=quantiles,
        quantile_ci=[interval(qs[:, j], config.confidence) for j in range(len(levels))],
        mean_cycle=np.array([lv.cycle_s.mean() for lv in levels]),
        slo_s=slo_s, slo_ci=interval(slo_reps, config.confidence), n_slo=n_slo,
        n_slo_ci=n_ci, n_slo_extrapolated=n_extra,
        kv_cap=kv_cap, seq_cap=seq_cap, duty=duty, resident_tokens=resident, agents=agents,
        agents_ci=(math.floor(low), math.ceil(high)), binding=binding,
        extrapolated=agents > x[-1] or (agents < x[0] and agents > 0),
        replicates=agents_arr, cycle_replicates=cycle_arr,
        lolo=leave_one_level_out(x, list(quantiles), weights))


@dataclass(frozen=True)
class FleetNeed:
    """Replicas and GPUs for a fleet of `agents` agents of one arm."""

    agents: int
    gpus: int | None
    gpus_ci: tuple[int | None, int | None]
    replicas: int | None


def gpus_needed(capacity: ArmCapacity, fleet: int, gpus_per_replica: int,
                confidence: float) -> FleetNeed:
    """ceil(fleet / agents per replica) replicas of the profile's GPUs, with the interval
    from the bootstrap's agents per replica (a resample with none attainable: unbounded)."""
    if capacity.agents <= 0:
        return FleetNeed(fleet, None, (None, None), None)
    replicas = math.ceil(fleet / capacity.agents)
    reps = capacity.replicates
    need = np.where(reps > 0, np.ceil(fleet / np.maximum(reps, 1)), np.inf) * gpus_per_replica
    low, high = interval(need, confidence)
    return FleetNeed(fleet, replicas * gpus_per_replica,
                     (int(low), None if math.isinf(high) else math.ceil(high)), replicas)
