"""Per-task throughput, GPU time, money and energy, and the price of one continuation.

In a sweep at level N, N agents share one replica in a closed loop, each finishing a task every
cycle (postfork time plus its own rewriting; the bench-only setup and replay left out), so by
Little's law the replica completes N / mean(cycle) tasks per second. A failed continuation
spends its cycle and completes nothing, so `mean cycle` is the cycle per completed task: every
continuation's cycle, failed ones too, over the completed ones (plan.capacity.Level):
tasks per GPU-hour = 3600 N / (mean cycle x GPUs per replica), GPU-seconds per task =
GPUs x mean cycle / N, joules per task = the replica's mean NVML power in the cell's measured
window x mean cycle / N (at the planned N, the power interpolated between the measured levels
around it, `power_at`). A second of an agent's time at level N costs GPUs / N GPU-seconds, which
charges the self arm for its compressor's share of the same GPU (its rewriting is in its
cycle, its compressor requests in the measured load). The external arm's compressor runs
elsewhere and is charged per token (prompt + completion) at COMPRESSOR_USD_PER_MTOK.

In a regime run the GPU-seconds per task are the attributed ones (plan.attribution). Costs are
dollars with GPU_HOUR_USD, else GPU-seconds (with external tokens only where they are priced or
zero).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compaction_bench.common.resampling import interval, replicates
from compaction_bench.plan.capacity import ArmCapacity
from compaction_bench.plan.curve import MonotoneCurve
from compaction_bench.plan.observations import Continuation, Observations, Window

EXTERNAL = "external"  # the arm whose compressor is another server, charged per token


@dataclass(frozen=True)
class Prices:
    gpu_hour_usd: float | None
    compressor_usd_per_mtok: float | None

    @property
    def unit(self) -> str:
        return "USD" if self.gpu_hour_usd is not None else "GPU-s"

    def gpu(self, gpu_s: float) -> float:
        return gpu_s * self.gpu_hour_usd / 3600 if self.gpu_hour_usd is not None else gpu_s

    def tokens(self, arm: str, tokens: int | None) -> float | None:
        """The external compressor's charge in the cost unit; None where it cannot be priced
        (tokens spent, no token price, or dollars of tokens against GPU-seconds)."""
        if arm != EXTERNAL or not tokens:
            return 0.0
        if self.compressor_usd_per_mtok is None or self.gpu_hour_usd is None:
            return None
        return tokens * self.compressor_usd_per_mtok / 1e6


@dataclass(frozen=True)
class TaskFigures:
    """Per-task figures of one arm under one condition; intervals (low, high) or None."""

    arm: str
    condition: str
    agents: float | None
    n: int
    tasks_per_gpu_hour: float | None
    tasks_per_gpu_hour_ci: tuple[float, float] | None
    gpu_s_per_task: float | None
    gpu_s_per_task_ci: tuple[float, float] | None
    cost_per_task: float | None  # in `cost_unit`
    cost_unit: str
    compressor_tokens_per_task: float | None
    joules_per_task: float | None
    power_w: float | None
    extrapolated: bool = False
    note: str = ""


def _ci(values: np.ndarray, confidence: float) -> tuple[float, float] | None:
    values = values[np.isfinite(values)]
    return interval(values, confidence) if len(values) else None


def mean_power(observations: Observations, window: Window | None) -> float | None:
    """The replica's mean power (W, summed over its GPUs) inside a window of the run clock."""
    if observations.power is None or window is None:
        return None
    inside = [w for t, w in observations.power if window.start_s <= t <= window.end_s]
    return float(np.mean(inside)) if inside else None


def _tokens(group: list[Continuation]) -> float | None:
    known = [c.rewrite_tokens for c in group if c.rewrite_tokens is not None]
    return float(np.mean(known)) if known else None


def level_figures(capacity: ArmCapacity, observations: Observations, prices: Prices, *,
                  b: int, confidence: float, rng: np.random.Generator) -> list[TaskFigures]:
    """The figures at every measured level of one arm (module docstring)."""
    gpus = observations.engine.gpus_per_replica
    out = []
    for lv in sorted([*capacity.levels, *capacity.excluded], key=lambda lv: lv.level):
        if lv.n == 0:  # lost every continuation: no task completed, named as such
            out.append(TaskFigures(capacity.arm, f"N={lv.level}", lv.level, 0, 0.0, None, None,
                                   None, None, prices.unit, None, None, None,
                                   note=f"every continuation failed ({lv.failed})"))
            continue
        # per completed task: every continuation's cycle, failed ones too, over the completed
        every = np.concatenate([lv.cycle_s, lv.failed_cycle_s])
        done = np.concatenate([np.ones(lv.n), np.zeros(lv.failed)])
        index = rng.integers(0, lv.n_all, size=(b, lv.n_all))
        with np.errstate(divide="ignore", invalid="ignore"):
            reps = every[index].sum(axis=1) / done[index].sum(axis=1)
        mean = lv.cycle_per_task_s
        group = [c for c in observations.of(capacity.arm, "sweep") if c.level == lv.level]
        out.append(_figures(capacity.arm, f"N={lv.level}", lv.level, lv.n, mean, reps, gpus,
                            prices, _tokens(group), mean_power(
                                observations, observations.windows.get((capacity.arm,
                                                                        lv.level))),
                            confidence))
    return out


def operating_point(capacity: ArmCapacity, observations: Observations, prices: Prices, *,
                    confidence: float) -> TaskFigures | None:
    """The figures at the planned fleet (agents per GPU), from the monotone mean-cycle curve;
    intervals from the capacity bootstrap (each resample at its own agents per GPU)."""
    n = capacity.agents
    if n is None or n <= 0:  # unbounded or none attainable: no operating point (its binding)
        return None
    levels = [lv.level for lv in capacity.levels]
    weights = [lv.n for lv in capacity.levels]
    mean = MonotoneCurve(levels, capacity.mean_cycle, weights)(n)
    power, note = power_at(capacity, observations, n)
    group = observations.of(capacity.arm, "sweep")
    reps_n = capacity.replicates.astype(float)
    reps_cycle = capacity.cycle_replicates
    with np.errstate(divide="ignore", invalid="ignore"):
        per_task = np.where((reps_n > 0) & np.isfinite(reps_n), reps_cycle / reps_n, np.nan)
    found = _figures(capacity.arm, f"planned N={n}", n, sum(weights), mean, None,
                     observations.engine.gpus_per_replica, prices, _tokens(group), power,
                     confidence, per_task_reps=per_task)
    return dataclasses.replace(found, extrapolated=capacity.extrapolated, note=note)


def power_at(capacity: ArmCapacity, observations: Observations, n: float
             ) -> tuple[float | None, str]:
    """The replica's power at `n` agents, and how it was had: linear between the two measured
    levels around `n`, that level's own where measured, the nearest end level's beyond them
    (said so). Issue 29: the nearest lower level's power was used unstated, 13% low on the
    issue's synthetic case (25% on tests/plan/test_caps.py's, power rising with N)."""
    known = [(lv.level, watts) for lv in capacity.levels
             if (watts := mean_power(observations, observations.windows.get(
                 (capacity.arm, lv.level)))) is not None]
    if not known:
        return None, ""
    below = [k for k in known if k[0] <= n]
    above = [k for k in known if k[0] >= n]
    if below and above:
        (n0, p0), (n1, p1) = below[-1], above[0]
        if n0 == n1:
            return p0, f"energy at N={n:g} from its measured power ({p0:.0f} W)"
        watts = p0 + (p1 - p0) * (n - n0) / (n1 - n0)
        return watts, (f"energy at N={n:g} from power interpolated between the measured levels "
                       f"N={n0} ({p0:.0f} W) and N={n1} ({p1:.0f} W): {watts:.0f} W")
    n0, p0 = below[-1] if below else above[0]
    return p0, (f"energy at N={n:g} from the power of the nearest measured level N={n0} "
                f"({p0:.0f} W): N={n:g} lies beyond the measured levels, its power unmeasured")


def _figures(arm: str, condition: str, agents: float, count: int, mean_cycle: float,
             cycle_reps: np.ndarray | None, gpus: int, prices: Prices, tokens: float | None,
             power: float | None, confidence: float,
             per_task_reps: np.ndarray | None = None) -> TaskFigures:
    gpu_s = gpus * mean_cycle / agents
    if per_task_reps is None and cycle_reps is not None:
        per_task_reps = cycle_reps / agents
    gpu_reps = gpus * per_task_reps if per_task_reps is not None else None
    extra = prices.tokens(arm, None if tokens is None else round(tokens))
    return TaskFigures(
        arm=arm, condition=condition, agents=agents, n=count,
        tasks_per_gpu_hour=3600 / gpu_s,
        tasks_per_gpu_hour_ci=None if gpu_reps is None else _ci(3600 / gpu_reps, confidence),
        gpu_s_per_task=gpu_s,
        gpu_s_per_task_ci=None if gpu_reps is None else _ci(gpu_reps, confidence),
        cost_per_task=None if extra is None else prices.gpu(gpu_s) + extra,
        cost_unit=prices.unit, compressor_tokens_per_task=tokens,
        joules_per_task=None if power is None else power * mean_cycle / agents, power_w=power)


def regime_figures(observations: Observations, arm: str, regime: str, prices: Prices, *,
                   b: int, confidence: float, rng: np.random.Generator) -> TaskFigures:
    """Per-task figures of a regime run from attributed GPU time (plan.attribution)."""
    group = [c for c in observations.of(arm, regime) if c.complete]
    gpus = observations.engine.gpus_per_replica
    shares = np.array([gpus * c.gpu_s for c in group if c.gpu_s is not None])
    if not len(shares):
        why = ("no per-request records: GPU time cannot be attributed"
               if not observations.has_requests else "no attributed requests")
        return TaskFigures(arm, regime, None, len(group), None, None, None, None, None,
                           prices.unit, _tokens(group), None, None, note=why)
    reps = replicates(shares, rng, "mean", b)
    gpu_s = float(shares.mean())
    joules = [c.joules for c in group if c.joules is not None]
    extra = prices.tokens(arm, None if _tokens(group) is None else round(_tokens(group) or 0))
    return TaskFigures(
        arm=arm, condition=regime, agents=None, n=len(shares),
        tasks_per_gpu_hour=3600 / gpu_s if gpu_s else None,
        tasks_per_gpu_hour_ci=_ci(3600 / reps, confidence), gpu_s_per_task=gpu_s,
        gpu_s_per_task_ci=_ci(reps, confidence),
        cost_per_task=None if extra is None else prices.gpu(gpu_s) + extra,
        cost_unit=prices.unit, compressor_tokens_per_task=_tokens(group),
        joules_per_task=float(np.mean(joules)) * gpus if joules else None, power_w=None,
        note="GPU time attributed by processor sharing over the run's requests")


def continuation_cost(observations: Observations, prices: Prices
                      ) -> Callable[[Continuation], float | None]:
    """The price of one continuation (one use), in the cost unit."""
    gpus = observations.engine.gpus_per_replica

    def cost(c: Continuation) -> float | None:
        if c.level is not None:
            gpu_s: float | None = gpus * c.cycle_s / c.level
        else:
            gpu_s = None if c.gpu_s is None else gpus * c.gpu_s
        extra = prices.tokens(c.arm, c.rewrite_tokens)
        if gpu_s is None or extra is None:
            return None
        return prices.gpu(gpu_s) + extra

    return cost


def one_time_cost(compact: list[Continuation], observations: Observations, prices: Prices
                  ) -> float | None:
    """C_R, the fork rewrite's cost: its GPU share at the condition's load for a compressor on
    the same server (T_R x GPUs / N in a sweep; T_R x the arm's attributed GPU-seconds per
    second of cycle in a regime run), its tokens for the external one."""
    rewrites = [c.fork_rewrite_s for c in compact if c.fork_rewrite_s is not None]
    if not rewrites or not compact:
        return None
    t_r = float(np.median(rewrites))
    if compact[0].arm == EXTERNAL:
        tokens = [c.fork_rewrite_tokens for c in compact if c.fork_rewrite_tokens is not None]
        return prices.tokens(EXTERNAL, round(float(np.median(tokens)))) if tokens else 0.0
    gpus = observations.engine.gpus_per_replica
    levels = {c.level for c in compact}
    if None not in levels and len(levels) == 1:
        level = next(iter(levels))
        assert level is not None
        return prices.gpu(gpus * t_r / level)
    rates = [c.gpu_s / c.cycle_s for c in compact if c.gpu_s is not None and c.cycle_s > 0]
    if not rates:
        return None
    return prices.gpu(gpus * t_r * float(np.median(rates)))


def finite(value: float | None) -> float | None:
    """None for a missing or infinite value (JSON has no infinity)."""
    return None if value is None or math.isinf(value) or math.isnan(value) else value
