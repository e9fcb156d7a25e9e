"""A fleet simulator: predict the load-response curve from a device cost model.

The extrapolation hook of the plan. N agents replay measured continuations (traces) against a
simulated engine whose step times come from the kernels issue's fitted cost model
(`kernels.costmodel`: `predict_prefill_s`, `predict_decode_step_s`); events run on SimPy, a
maintained discrete-event library, not a hand-written event loop.

A trace is one measured continuation at the sweep's lowest level: its requests in order, each
with its prompt, cached and completion tokens, and the gap before it (tools, orchestration,
rewriting: everything between two requests of the agent, as measured), plus the tail after the
last request (patch capture, validation). Same-server compressor requests (the self arm's) are
requests of the trace; an external compressor's are gaps.

The engine is continuous batching in its plainest form: requests wait in FIFO order; whenever
sequence slots are free (max_num_seqs) the waiting ones are admitted and prefilled (their
uncached tokens, one after another), each yielding its first token; then every running sequence
decodes one token per step, a step costing the cost model's time for that batch and mean
context. Not modelled: chunked prefill mixed into decode steps, preemption, cache eviction
(the measured cached-token counts are replayed), and tools competing with the engine for a
CPU's cores. The simulator's error on the measured levels says how much that matters.

Agents start together; each agent's first `warmup` continuations are dropped and it keeps
running until every agent has its measured share (as in the sweep), so every measured
continuation runs under N agents.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import simpy

from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.plan.observations import Observations
from compaction_bench.plan.settings import PlanError


class StepCosts(Protocol):
    """What the simulator needs of a cost model (kernels.costmodel.CostModel has it)."""

    def predict_prefill_s(self, uncached_tokens: float, cached_tokens: float) -> float: ...

    def predict_decode_step_s(self, batch: float, mean_context: float) -> float: ...


@dataclass(frozen=True)
class Step:
    gap_s: float  # before the request, since the previous one ended (or the start)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Trace:
    steps: tuple[Step, ...]
    tail_s: float
    rewrite_s: float  # inside the gaps; subtracted to give postfork time


def traces(observations: Observations, arm: str, level: int, *,
           same_server_compressor: bool) -> list[Trace]:
    """The measured continuations of `arm` at `level` as traces (module docstring)."""
    records = observations.records
    wanted = {(a.block, a.block_pass or 1): a for a in records.arms
              if a.arm == arm and a.level == level and a.sweep_phase == "measured"
              and a.complete and a.started_s is not None and a.ended_s is not None}
    by_block: dict[tuple[int, int], list[Any]] = {}
    for r in records.requests:
        if r.block is None or r.end_s is None:
            continue
        own = r.source == arm or (same_server_compressor and r.source == f"{arm}/compressor")
        key = (r.block, int(r.labels.get("block_pass") or 1))
        if own and key in wanted and r.regime == "sweep":
            by_block.setdefault(key, []).append(r)
    out = []
    for key, record in wanted.items():
        requests = sorted(by_block.get(key, []), key=lambda r: r.sent_s)
        if not requests or any(r.prompt_tokens is None for r in requests):
            continue
        assert record.started_s is not None and record.ended_s is not None
        steps, edge = [], record.started_s
        for r in requests:
            steps.append(Step(max(0.0, r.sent_s - edge), int(r.prompt_tokens or 0),
                              int(r.cached_tokens or 0), max(1, int(r.completion_tokens or 1))))
            edge = max(edge, r.end_s)
        out.append(Trace(tuple(steps), max(0.0, record.ended_s - edge), record.rewrite_s or 0.0))
    return out


class EngineCosts(Protocol):
    """What one simulated engine costs: its sequence slots, a prefill of uncached and cached
    prompt tokens, and one decode step of `batch` sequences at their mean context, in seconds.
    `context_free`: a step's cost does not depend on the context, so a run of steps with the
    same batch is one event (the fleet model's fit); else every step is one (a cost model)."""

    @property
    def slots(self) -> int: ...

    @property
    def context_free(self) -> bool: ...

    def prefill_s(self, uncached: float, cached: float) -> float: ...

    def step_s(self, batch: int, mean_context: float = 0.0) -> float: ...


@dataclass(frozen=True)
class ModelCosts:
    """A device cost model (`StepCosts`) as an engine's costs, with the profile's slots."""

    costs: StepCosts
    slots: int
    context_free: bool = False

    def prefill_s(self, uncached: float, cached: float) -> float:
        return self.costs.predict_prefill_s(max(1.0, uncached), cached)

    def step_s(self, batch: int, mean_context: float = 0.0) -> float:
        return self.costs.predict_decode_step_s(batch, mean_context)


class _Request:
    def __init__(self, env: simpy.Environment, step: Step, cached: int) -> None:
        self.step = step
        self.cached = cached
        self.remaining = step.completion_tokens
        self.context = float(step.prompt_tokens)
        self.done = env.event()


class SimEngine:
    """One simulated engine, vLLM's continuous batching in its plainest form (module docstring),
    the one engine of this simulator and of the fleet model (plan.fleetmodel): FIFO admission
    into `slots`, prefills one after another, then decode steps of every running sequence. An
    arrival that can be admitted is admitted at the next step boundary; with context-free costs
    a run of steps between two events is one timeout."""

    def __init__(self, env: simpy.Environment, costs: EngineCosts) -> None:
        self.env, self.costs = env, costs
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.wake = env.event()
        self.in_flight = 0  # as a router counts it: sent and not yet answered
        env.process(self._run())

    def submit(self, step: Step, cached: int | None = None) -> simpy.Event:
        """Queue one request; `cached`: its cached prompt tokens (default: as measured)."""
        request = _Request(self.env, step, step.cached_tokens if cached is None else cached)
        self.waiting.append(request)
        self.in_flight += 1
        if not self.wake.triggered:
            self.wake.succeed()
        return request.done

    def _finish(self) -> None:
        for r in [r for r in self.running if r.remaining <= 0]:
            self.running.remove(r)
            self.in_flight -= 1
            r.done.succeed()

    def _run(self) -> Generator[simpy.Event, Any, None]:
        costs = self.costs
        while True:
            if not self.waiting and not self.running:
                self.wake = self.env.event()
                yield self.wake
            admitted: list[_Request] = []
            while self.waiting and len(self.running) + len(admitted) < costs.slots:
                admitted.append(self.waiting.popleft())
            if admitted:
                self.running += admitted
                yield self.env.timeout(sum(costs.prefill_s(
                    max(0, r.step.prompt_tokens - r.cached), r.cached) for r in admitted))
                for r in admitted:
                    r.remaining -= 1  # the prefill yields the first token
                self._finish()
            if not self.running:
                continue
            step = max(1e-9, costs.step_s(len(self.running), float(
                np.mean([r.context for r in self.running]))))
            steps = min(r.remaining for r in self.running) if costs.context_free else 1
            start = self.env.now
            if len(self.running) < costs.slots:  # an arrival may be admitted at a step boundary
                self.wake = self.env.event()
                if self.waiting:  # it arrived during a prefill, before this wake-up was armed
                    self.wake.succeed()
                yield self.env.timeout(steps * step) | self.wake
                done = min(steps, int((self.env.now - start) / step + 1e-9))
                if done < steps:
                    done += 1
                    yield self.env.timeout(max(0.0, start + done * step - self.env.now))
            else:
                yield self.env.timeout(steps * step)
                done = steps
            for r in self.running:
                r.remaining -= done
                r.context += done
            self._finish()


def simulate(costs: StepCosts, pool: Sequence[Trace], agents: int, *, max_num_seqs: int,
             samples: int, warmup: int = 1, seed: int = 0) -> np.ndarray:
    """Postfork times of `samples` (at least) measured continuations of a fleet of `agents`."""
    if not pool:
        raise PlanError("the simulator needs at least one measured continuation with its "
                        "request records (requests.jsonl)")
    env = simpy.Environment()
    engine = SimEngine(env, ModelCosts(costs, max_num_seqs))
    rng = np.random.default_rng(seed)
    quota = max(1, math.ceil(samples / agents))
    measured: list[float] = []
    remaining = [agents]
    all_done = env.event()

    def agent() -> Generator[simpy.Event, Any, None]:
        k = 0
        while not all_done.triggered:
            trace = pool[int(rng.integers(len(pool)))]
            start = env.now
            for step in trace.steps:
                yield env.timeout(step.gap_s)
                yield engine.submit(step)
            yield env.timeout(trace.tail_s)
            if warmup <= k < warmup + quota:
                measured.append(env.now - start - trace.rewrite_s)
                if k == warmup + quota - 1:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        all_done.succeed()
            k += 1

    for _ in range(agents):
        env.process(agent())
    env.run(until=all_done)
    return np.asarray(measured)


@dataclass(frozen=True)
class SimulatedLevel:
    level: int
    predicted_s: float  # the SLO quantile of simulated postfork time
    measured_s: float | None
    ape_pct: float | None
    in_measured_range: bool


def predict_levels(costs: StepCosts, pool: Sequence[Trace], levels: Sequence[int],
                   measured: dict[int, float], *, quantile: float, max_num_seqs: int,
                   samples: int, seed: int) -> list[SimulatedLevel]:
    """The simulated SLO quantile at each level, against the measured one where there is one."""
    out = []
    top = max(measured) if measured else 0
    for level in levels:
        times = simulate(costs, pool, level, max_num_seqs=max_num_seqs, samples=samples,
                         seed=seed + level)
        predicted = float(hd_quantile(times, quantile))
        found = measured.get(level)
        out.append(SimulatedLevel(level, predicted, found,
                                  abs(predicted - found) / found * 100 if found else None,
                                  level <= top))
    return out
