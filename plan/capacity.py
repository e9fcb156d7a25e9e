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
GPUs needed = ceil(A / agents per GPU) x the profile's GPUs per replica. Both caps are
heuristics, and a measurement outranks them (issue 29: the sequence cap read 4 where a search
measured N=5 within the SLO): neither may bind below the largest measured level whose SLO
quantile (the point estimate, failures ranked as misses) meets the SLO, below the smallest level
that missed it (the search's own answer on the same cells, bench/run/boundary.py `capacity`). A
cap so lifted is named in the binding limit.

The SLO bounds, by default, the wall time the agent sees: postfork time plus the rewriting it
waits through inline (`slo_time` wall; postfork: postfork time alone), so an inline rewriter's
waits count against it (issue 22).

Extrapolation has a limit: past `extrapolation` x the largest measured level, N at the SLO is
"beyond measured range: > reach" (inf in the figures, `beyond` set), never a number, and GPUs
needed are an upper bound. Intervals of N and agents include the curve's own error: the
bootstrap's interval widened by, per resample, the band of the top level's leave-one-level-out
residual (plan.curve.ModelError), which grows with the distance past the largest level.

Failed continuations count as SLO misses (issue 22): a failed task gave the agent nothing, so
it ranks above every complete one. So does a censored one (stopped at the arm wall limit,
terminal status TimeExceeded): it took at least the limit, so it ranks above every finished one
and counts with the failures (`failed`, of which `censored`), and plan.md names it (issue 29:
it entered the quantile at the limit, and overstated capacity). A level whose failed share
exceeds 1 - q cannot meet the SLO's q-quantile at all, whatever the complete ones' times: it
leaves the fit and caps N, N meeting the SLO included, below itself (binding "failures at
N=..."), and a level that lost every continuation is named (`lost`). Elsewhere the q-quantile
over all continuations is the q n_all / n_ok quantile of the complete ones. Throughput counts
completed tasks: the cycle per task is every continuation's cycle (failed ones too) over the
completed ones.

Quantiles are Harrell-Davis estimates. Intervals: a joint bootstrap resamples each (arm,
level)'s continuations with replacement (B times, one seeded generator; smoothed for the
quantiles, common.resampling) and refits; a relative SLO is recomputed from each resample's
reference arm. Percentile intervals of N_slo, agents per GPU and GPUs needed come from the same
resamples.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from compaction_bench.common.resampling import interval, smoothed
from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.common.slo import Slo
from compaction_bench.plan.curve import (
    CurveBatch,
    ModelError,
    MonotoneCurve,
    largest_meeting_batch,
    leave_one_level_out,
    model_error,
)
from compaction_bench.plan.observations import SWEEP, Continuation, Engine, Observations
from compaction_bench.plan.settings import PlanConfig, PlanError

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
    failed_cycle_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    censored: int = 0  # of `failed`: stopped at the arm wall limit, so at least that long
    censored_at_s: float | None = None  # the longest censored postfork time (the limit)

    @property
    def n(self) -> int:
        return len(self.postfork_s)

    @property
    def n_all(self) -> int:
        return self.n + self.failed

    def missed(self, quantile: float, failed: float | None = None) -> bool:
        """Whether failures alone put the level's q-quantile beyond any SLO (module docstring)."""
        count = self.failed if failed is None else failed
        return self.n_all > 0 and count > (1.0 - quantile) * self.n_all + 1e-9

    def rank(self, quantile: float, failed: float | None = None) -> float:
        """The quantile of the complete continuations that is the q-quantile of all of them,
        failures ranked above (module docstring)."""
        count = self.failed if failed is None else failed
        # exact up to 1 (the largest complete one); it was clamped to n / (n + 1), so with the
        # failed share near 1 - q the plan read p87.9 for p90 (issue 29: n_all 41, 4 failed)
        return min(1.0, quantile * self.n_all / max(self.n_all - count, 1))

    def times(self, basis: str) -> np.ndarray:
        """The complete continuations' times the SLO bounds: `wall` (postfork plus inline
        rewriting) or `postfork` (plan.settings)."""
        return self.cycle_s if basis == "wall" else self.postfork_s

    @property
    def cycle_per_task_s(self) -> float:
        """Every continuation's cycle over the completed ones (inf: none completed)."""
        total = float(self.cycle_s.sum() + self.failed_cycle_s.sum())
        return total / self.n if self.n else math.inf


@dataclass(frozen=True)
class SloReference:
    """Where a relative SLO's seconds come from: `arm`'s quantile at `level` (its lowest fitted
    level); `substitute` when the run has no clean arm and another arm stood in."""

    arm: str
    level: int
    substitute: bool = False

    def label(self, quantile: float) -> str:
        said = f"{self.arm}'s p{100 * quantile:g} at N={self.level}"
        return said + (f" (no {REFERENCE} arm in this run: {self.arm} stands in)"
                       if self.substitute else "")


@dataclass(frozen=True)
class CapLift:
    """An engine cap (`name`: KV cache or max_num_seqs) whose heuristic value `cap` lay below
    `level`, a measured level within the SLO, so the cap binds at `level` at the lowest."""

    name: str
    cap: int
    level: int

    @property
    def text(self) -> str:
        return (f"{self.name} heuristic {self.cap} lifted: N={self.level} measured within "
                "the SLO")


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
    agents: int | None  # agents per replica, after the caps; None: unbounded (binding says)
    agents_ci: tuple[float, float]  # whole numbers; an end may be inf (unbounded resamples)
    binding: str
    extrapolated: bool  # the planned fleet lies beyond the measured levels
    replicates: np.ndarray = field(repr=False)  # agents per replica, one per resample
    cycle_replicates: np.ndarray = field(repr=False)  # mean cycle at the replicate's agents
    lolo: list[dict[str, float | bool]] = field(default_factory=list)
    gpus_per_replica: int = 1
    excluded: list[Level] = field(default_factory=list)  # missed by failures, or lost
    reach: float = math.inf  # the extrapolation limit: N beyond it is "> reach", never a number
    beyond: float | None = None  # capacity lies past the reach (agents None): the reach
    n_slo_beyond: bool = False  # n_slo is inf because the SLO is met past the reach
    model_error: ModelError = field(default_factory=ModelError)  # plan.curve
    slo_time: str = "wall"  # the time the SLO bounds (plan.settings)
    slo_reference: SloReference | None = None  # a relative SLO's reference (None: absolute)
    held_level: int | None = None  # the largest measured level within the SLO (`within_slo`)
    missed_level: int | None = None  # the smallest measured level that missed it
    lifted: list[CapLift] = field(default_factory=list)  # engine caps a measurement outranked
    sampling_only: bool = False  # fewer than 3 levels: no model-error band, the shape unchecked

    @property
    def unbounded(self) -> bool:
        """No upper limit was measured or could be extrapolated (not: beyond the reach)."""
        return self.agents is None and self.beyond is None

    @property
    def agents_per_gpu(self) -> float | None:
        """Agents per replica over the replica's GPUs (None: unbounded)."""
        return None if self.agents is None else self.agents / self.gpus_per_replica

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
        # a censored continuation (stopped at the arm wall limit) took at least the limit: it
        # ranks above every finished one, as a failure does (issue 29: it entered at the limit)
        ok = [c for c in group if c.complete and not c.censored]
        missed = [c for c in group if not (c.complete and not c.censored)]
        busy = [(c.busy_s, c.cycle_s) for c in ok if c.busy_s is not None and c.cycle_s > 0]
        out.append(Level(
            level=level, postfork_s=np.array([c.postfork_s for c in ok]),
            cycle_s=np.array([c.cycle_s for c in ok]), failed=len(missed),
            duty=min(1.0, sum(b for b, _ in busy) / sum(t for _, t in busy)) if busy else None,
            resident_tokens=[c.resident_tokens for c in ok if c.resident_tokens is not None],
            failed_cycle_s=np.array([c.cycle_s for c in missed]),
            censored=sum(c.censored for c in group),
            censored_at_s=max((c.postfork_s for c in group if c.censored), default=None)))
    return out


UNBOUNDED = "unbounded (the curve never reaches the SLO and no engine limit is known)"


def reflected(point: float | None, ends: tuple[float, float], limit: float = math.inf
              ) -> tuple[float, float]:
    """The percentile interval `ends` of N's resamples joined with the basic (reflected)
    bootstrap interval around the `point` estimate: [2 N - high, 2 N - low].

    The smoothed bootstrap of a p90 from 8-16 continuations a level is too optimistic: its
    resampled curves reach the SLO later than the true curve often enough that, measured on
    synthetic sweeps of known truth (tests/plan/test_shapes.py), the true N fell below the
    percentile interval in 8-13% of seeds, above it in none, against 2.5% a side. Reflected
    around the point, that optimism widens the pessimistic end instead; the union keeps each
    end at least as wide as either interval. An unbounded optimistic end (resamples past the
    reach) is not reflected: the percentile end stands. Neither end passes `limit` (below a
    level its failures missed), which every resample already respects."""
    low, high = ends
    if point is None or not math.isfinite(point):
        return low, high
    if math.isfinite(high):
        low = min(low, max(0.0, 2 * point - high))
    return low, min(max(high, 2 * point - low), max(high, limit))


def _floor(value: float | None) -> float:
    if value is None:
        return 0
    return math.inf if math.isinf(value) else max(0, math.floor(value + 1e-9))


def capped(n_slo: float | None, kv_cap: int | None, seq_cap: int | None,
           failure_cap: tuple[str, int] | None = None) -> tuple[float, str]:
    """Agents per replica (inf: unbounded) and the binding limit."""
    # failures first: N meeting the SLO is kept below a level they missed, so a tie is theirs
    limits: list[tuple[str, float]] = [failure_cap] if failure_cap is not None else []
    limits += [("SLO", _floor(n_slo))]
    limits += [(name, cap) for name, cap in (("KV cache", kv_cap), ("max_num_seqs", seq_cap))
               if cap is not None]
    name, agents = min(limits, key=lambda item: item[1])
    if math.isinf(agents):
        return math.inf, UNBOUNDED
    if agents == 0 and name == "SLO":
        return 0, "SLO not met even by one agent"
    return agents, name


def within_slo(levels: list[Level], excluded: list[Level], quantiles: np.ndarray,
               slo_s: float) -> tuple[int | None, int | None]:
    """(the largest measured level whose SLO quantile meets the SLO below the smallest one that
    missed it, that smallest missed level): the search's answer on the same cells
    (bench/run/boundary.py `capacity`: a level holds when its point is at most the limit; a level
    left out of the fit for its failures misses). None where no level held / none missed."""
    missed = [lv.level for lv, q in zip(levels, quantiles, strict=True) if q > slo_s]
    first = min([*missed, *(lv.level for lv in excluded)], default=None)
    held = [lv.level for lv, q in zip(levels, quantiles, strict=True)
            if q <= slo_s and (first is None or lv.level < first)]
    return max(held, default=None), first


def lift_caps(kv_cap: int | None, seq_cap: int | None, held: int | None
              ) -> tuple[int | None, int | None, list[CapLift]]:
    """The engine caps raised to the largest level measured within the SLO (module docstring),
    and what was lifted."""
    lifts = [CapLift(name, cap, held) for name, cap in (("KV cache", kv_cap),
                                                      ("max_num_seqs", seq_cap))
             if cap is not None and held is not None and cap < held]

    def raised(cap: int | None) -> int | None:
        return cap if cap is None or held is None else max(cap, held)

    return raised(kv_cap), raised(seq_cap), lifts


def _lift_binding(binding: str, lifts: list[CapLift]) -> str:
    """The binding limit naming the caps a measurement lifted (issue 29)."""
    if not lifts:
        return binding
    said = "; ".join(lift.text for lift in lifts)
    for lift in lifts:
        if binding == lift.name:
            return f"{lift.name} at N={lift.level} (heuristic {lift.cap} lifted: N="\
                   f"{lift.level} measured within the SLO)"
    return f"{binding} ({said})"


def failure_cap(excluded: list[Level], quantile: float) -> tuple[str, int] | None:
    """The cap below the lowest level that failures put beyond the SLO (module docstring)."""
    if not excluded:
        return None
    first = min(excluded, key=lambda lv: lv.level)
    what = ("every continuation failed" if first.n == 0 else
            f"{first.failed}/{first.n_all} failed, more than {1 - quantile:.0%}")
    return f"failures at N={first.level} ({what})", first.level - 1


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


def _resample(levels: list[Level], quantile: float, rng: np.random.Generator, b: int,
              basis: str = "wall") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B x levels) resampled quantiles and cycles per completed task, and per resample the cap
    that its own failures put on N (inf: none). Each resample's failure count is the binomial
    draw a resample of the level's continuations would give; the complete times are smoothed."""
    qs, cycles = np.empty((b, len(levels))), np.empty((b, len(levels)))
    caps = np.full(b, np.inf)
    for j, lv in enumerate(levels):
        draws = smoothed(np.maximum(lv.times(basis), 1e-9), b, rng)
        failed = rng.binomial(lv.n_all, lv.failed / lv.n_all, size=b)
        for count in np.unique(failed):
            rows = failed == count
            qs[rows, j] = hd_quantile(draws[rows], lv.rank(quantile, int(count)), axis=1)
            if lv.missed(quantile, int(count)):
                caps[rows] = np.minimum(caps[rows], lv.level - 1)
        every = np.concatenate([lv.cycle_s, lv.failed_cycle_s])
        done = np.concatenate([np.ones(lv.n), np.zeros(lv.failed)])
        index = rng.integers(0, lv.n_all, size=(b, lv.n_all))
        with np.errstate(divide="ignore"):
            per_task = every[index].sum(axis=1) / done[index].sum(axis=1)
        cycles[:, j] = np.where(np.isfinite(per_task), per_task, lv.cycle_per_task_s)
    return qs, cycles, caps


def _inverse(curve: MonotoneCurve, target: float) -> tuple[float | None, bool]:
    found = curve.inverse(target)
    return found.value, found.extrapolated


def plan_capacity(observations: Observations, config: PlanConfig) -> dict[str, ArmCapacity]:
    """Every arm's capacity figures (module docstring)."""
    slo = config.target
    measured = sweep_levels(observations)
    by_arm = {arm: [lv for lv in levels if lv.n > 0 and not lv.missed(slo.quantile)]
              for arm, levels in measured.items()}
    by_arm = {arm: levels for arm, levels in by_arm.items() if levels}
    if not by_arm:
        raise PlanError(f"{observations.path}: no measured sweep level where enough "
                        f"continuations completed to fit (more than {slo.quantile:.0%} of a "
                        "level's); see the sweep's failures in its arms.jsonl")
    rng = np.random.default_rng(config.seed)
    resampled = {arm: _resample(levels, slo.quantile, rng, config.bootstrap, config.slo_time)
                 for arm, levels in by_arm.items()}
    point_q = {arm: np.array([float(hd_quantile(lv.times(config.slo_time),
                                                lv.rank(slo.quantile)))
                              for lv in levels]) for arm, levels in by_arm.items()}
    slo_point, slo_reps, reference = _targets(slo, by_arm, point_q, resampled,
                                              config.bootstrap)
    out = {}
    for arm, levels in by_arm.items():
        excluded = [lv for lv in measured[arm] if lv not in levels]
        out[arm] = dataclasses.replace(
            _arm(arm, levels, excluded, point_q[arm], resampled[arm], slo_point, slo_reps,
                 observations.engine, slo, config), slo_reference=reference)
    return out


def _targets(slo: Slo, by_arm: dict[str, list[Level]], point_q: dict[str, np.ndarray],
             resampled: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], b: int
             ) -> tuple[float, np.ndarray, SloReference | None]:
    """The SLO in seconds, per resample (a relative SLO moves with its reference), and the
    reference a relative SLO was taken from: clean's lowest fitted level, or, in a run without
    clean, the first arm's, named as such (issue 29: it was used silently)."""
    if not slo.relative:
        return slo.value, np.full(b, slo.value), None
    reference = REFERENCE if REFERENCE in by_arm else next(iter(by_arm))
    named = SloReference(reference, by_arm[reference][0].level, reference != REFERENCE)
    return (slo.value * float(point_q[reference][0]),
            slo.value * resampled[reference][0][:, 0], named)


def _within(value: float | None, failures: float, reach: float) -> float | None:
    """N meeting the SLO kept below a level that failures missed, and past the extrapolation
    reach made inf (the curve's own inf, never reaching the SLO, stays inf)."""
    if value is None or math.isnan(value):
        return None
    value = min(value, failures)
    return math.inf if value > reach else value


def _arm(arm: str, levels: list[Level], excluded: list[Level], quantiles: np.ndarray,
         resampled: tuple[np.ndarray, np.ndarray, np.ndarray], slo_s: float,
         slo_reps: np.ndarray, engine: Engine, slo: Slo, config: PlanConfig) -> ArmCapacity:
    x = [lv.level for lv in levels]
    weights = [lv.n for lv in levels]
    qs, cycles, row_caps = resampled
    kv_cap, seq_cap, duty, resident = _caps(levels, engine, slo.quantile)
    held, missed = within_slo(levels, excluded, quantiles, slo_s)
    kv_at, seq_at, lifts = lift_caps(kv_cap, seq_cap, held)
    failures = failure_cap(excluded, slo.quantile)
    below_failures = math.inf if failures is None else float(failures[1])
    reach = config.extrapolation * x[-1]
    curve = MonotoneCurve(x, quantiles, weights)
    lolo = leave_one_level_out(x, list(quantiles), weights)
    raw, n_extra = _inverse(curve, slo_s)
    beyond = reach if raw is not None and math.isfinite(raw) and min(
        raw, below_failures) > reach else None
    n_slo = _within(raw, below_failures, reach)
    agents, binding = capped(n_slo, kv_at, seq_at, failures)
    binding = _lift_binding(binding, lifts)
    if math.isfinite(agents) and agents > reach:  # an engine cap past the reach: unmeasured
        agents, beyond = math.inf, reach
    if beyond is not None and math.isinf(agents):
        binding = f"beyond measured range: > {beyond:g} (extrapolation limit)"
    n_arr = CurveBatch(x, qs, weights).inverse(slo_reps)
    n_arr = np.minimum(n_arr, np.minimum(row_caps, below_failures))
    n_arr = np.where(n_arr > reach, np.inf, n_arr)  # NaN (none attainable) stays NaN
    agents_arr = np.array([capped(None if math.isnan(v) else float(v), kv_at, seq_at,
                                  failures)[0] for v in n_arr])
    agents_arr = np.minimum(agents_arr, row_caps)
    agents_arr = np.where(agents_arr > reach, np.inf, agents_arr)
    usable = np.isfinite(agents_arr) & (agents_arr > 0)
    cycle_arr = np.full(len(agents_arr), np.nan)
    cycle_arr[usable] = CurveBatch(x, cycles[usable], weights).at(agents_arr[usable]) if (
        usable.any()) else cycle_arr[usable]
    # model error: the bootstrap interval widened to the band of the curve's own residuals
    band = model_error(lolo, x)
    # each resample's curve at the pessimistic and the optimistic edge of the band
    batch = CurveBatch(x, qs, weights)
    edges = [np.minimum(largest_meeting_batch(batch, slo_reps, band, sign, reach),
                        np.minimum(row_caps, below_failures)) for sign in (1, -1)]
    edge_agents = [np.array([capped(None if math.isnan(v) else float(v), kv_at, seq_at,
                                    failures)[0] for v in e]) for e in edges]
    edge_agents = [np.where(np.minimum(a, row_caps) > reach, np.inf, np.minimum(a, row_caps))
                   for a in edge_agents]
    n_low, n_high = reflected(None if raw is None else min(raw, below_failures),
                              interval(np.where(np.isnan(n_arr), 0.0, n_arr),
                                       config.confidence), below_failures)
    n_ci = (min(n_low, interval(np.where(np.isnan(edges[0]), 0.0, edges[0]),
                                config.confidence)[0]),
            max(n_high, interval(np.where(np.isnan(edges[1]), 0.0, edges[1]),
                                 config.confidence)[1]))  # none: 0
    low, high = interval(agents_arr, config.confidence)
    # the reflected end of N, as agents: the two intervals read the same resamples
    low = min(low, capped(n_low, kv_at, seq_at, failures)[0])
    low = min(low, interval(edge_agents[0], config.confidence)[0])
    high = max(high, interval(edge_agents[1], config.confidence)[1])
    sampling_only = len(levels) < 3
    if sampling_only and n_slo is not None and math.isfinite(n_slo):
        # no residual, so no model band: widen to the measured levels around the crossing
        lo_b, hi_b = bracket(x, n_slo, reach)
        n_ci = (min(n_ci[0], lo_b), max(n_ci[1], hi_b))
        low = min(low, capped(lo_b, kv_at, seq_at, failures)[0])
        high = max(high, capped(hi_b, kv_at, seq_at, failures)[0])
    whole = None if math.isinf(agents) else int(agents)
    return ArmCapacity(
        arm=arm, levels=levels, quantiles=quantiles,
        quantile_ci=[interval(qs[:, j], config.confidence) for j in range(len(levels))],
        mean_cycle=np.array([lv.cycle_per_task_s for lv in levels]),
        slo_s=slo_s, slo_ci=interval(slo_reps, config.confidence), n_slo=n_slo,
        n_slo_ci=n_ci, n_slo_extrapolated=n_extra,
        kv_cap=kv_cap, seq_cap=seq_cap, duty=duty, resident_tokens=resident, agents=whole,
        agents_ci=(float(math.floor(low)) if math.isfinite(low) else math.inf,
                   float(math.ceil(high)) if math.isfinite(high) else math.inf),
        binding=binding,
        extrapolated=whole is not None and (whole > x[-1] or 0 < whole < x[0]),
        replicates=agents_arr, cycle_replicates=cycle_arr, lolo=lolo,
        gpus_per_replica=engine.gpus_per_replica, excluded=excluded, reach=reach,
        beyond=beyond if whole is None else None, model_error=band, slo_time=config.slo_time,
        n_slo_beyond=raw is not None and math.isfinite(raw) and n_slo is not None
        and math.isinf(n_slo), held_level=held, missed_level=missed, lifted=lifts,
        sampling_only=sampling_only)


def bracket(levels: list[int], n: float, reach: float) -> tuple[float, float]:
    """The measured levels around a crossing at `n` (0 below the first; the reach past the
    last). With fewer than 3 levels no residual measures the curve's shape, and a monotone
    truth only promises that the crossing lies between the level that met the SLO and the one
    that missed it: N's interval is widened to them (issue 29: two levels gave [6.8, 8.1]
    against a true 9.04)."""
    below = [float(v) for v in levels if v <= n]
    above = [float(v) for v in levels if v > n]
    return max(below, default=0.0), min(above, default=reach)


@dataclass(frozen=True)
class FleetNeed:
    """Replicas and GPUs for a fleet of `agents` agents of one arm. Unbounded capacity: `gpus`
    None and the interval's low end one replica's GPUs (no upper limit was measured)."""

    agents: int
    gpus: int | None
    gpus_ci: tuple[int | None, int | None]
    replicas: int | None
    unbounded: bool = False
    beyond: float | None = None  # capacity past the extrapolation reach: gpus_ci[1] = at most


def gpus_needed(capacity: ArmCapacity, fleet: int, gpus_per_replica: int) -> FleetNeed:
    """ceil(fleet / agents per replica) replicas of the profile's GPUs. The interval is the
    agents interval mapped through the same function (fewest GPUs at its high end, most at its
    low end), so the two intervals cannot disagree (issue 29: GPUs were read off the sampling
    resamples alone while agents also held the model-error band, and a plan printed agents
    [7, 12] beside GPUs [112, 143] for 1,000 agents). A low end of 0 agents needs infinitely
    many GPUs (None); an infinite high end needs one replica (what is known: at least that)."""
    if capacity.beyond is not None:  # more than `reach` agents per replica: at most this many
        most = max(1, math.ceil(fleet / max(1, math.floor(capacity.beyond))))
        return FleetNeed(fleet, None, (gpus_per_replica, most * gpus_per_replica), None,
                         beyond=capacity.beyond)
    if capacity.agents is None:
        return FleetNeed(fleet, None, (gpus_per_replica, None), None, unbounded=True)
    if capacity.agents <= 0:
        return FleetNeed(fleet, None, (None, None), None)
    replicas = math.ceil(fleet / capacity.agents)
    fewest, largest = capacity.agents_ci

    def gpus_for(agents: float) -> int:
        return max(1, math.ceil(fleet / agents)) * gpus_per_replica

    return FleetNeed(fleet, replicas * gpus_per_replica,
                     (gpus_per_replica if math.isinf(largest) else gpus_for(max(largest, 1.0)),
                      None if fewest < 1 else gpus_for(fewest)), replicas)
