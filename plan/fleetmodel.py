"""The fleet model: R replicas of one measured replica behind a routing policy (issue 29).

The one-replica plan assumed that a router spreads N agents evenly and that each replica then
behaves as the measured one at N / R. Two things that decide a fleet are not in that: how the
policy splits agents (the hottest replica's load is what counts), and how often an agent's later
turns find their prefix cached on the replica they land on. This model simulates both, on SimPy:

- **the engine**, fitted on the one-replica sweep's own request records (`fit_engine`): sequence
  slots (max_num_seqs); a prefill that costs a + b x uncached + c x cached prompt tokens, the
  engine doing nothing else meanwhile (least squares on the lowest level's time to first token,
  where nothing queues); decode steps of s0 + s1 x B + s2 x C for B running sequences whose
  contexts sum to C tokens (least squares, over every request of every level, of its inter-token
  time, less the others' prefills that fell inside its decode, against the mean number of
  sequences decoding beside it and their summed context; s2 is 0 where the contexts do not
  vary). It is vLLM's continuous batching in its plainest form, as in plan.fleetsim, and with
  s2 = 0 exactly the fake engine's capacity model (loadgen/fakeengine.py), which is how
  `make fleet-truth` checks it;
- **the agents**: N closed-loop agents replaying the sweep's measured continuations (requests,
  token counts, the gaps between them), warm-up, measured share and drain as in the sweep
  (bench.run.fleet), each continuation one session with the sweep's own session id;
- **the router**: the policy as vllm-router 0.1.17 applies it (serve.routerhash.ROUTING_KEYS):
  consistent_hash by the router's own ring over the fleet's replica URLs (bit for bit), round
  robin by a counter, random, power of two choices and least-loaded (cache_aware, which is
  least-loaded for chat) by each replica's requests in flight, sticky_least_loaded by session;
- **the prefix cache per replica**: a later turn is cached up to what its own earlier turns left
  on that replica (block-rounded; at most what was measured at one replica); a turn sent
  elsewhere prefills its history again, priced by the fitted prefill cost.

The prediction is the simulated fleet's SLO quantile. Its own error is stated: the simulated
one replica against every measured level; the band of a capacity is the same search with the
simulated quantiles times (1 + e) and (1 - e), e that median error. Capacity is the largest N
whose predicted quantile meets the SLO. The simulator uses common random numbers (one seed)
across N, so the predicted curve is smooth in N.

Anchoring was tried and set aside: the measured one-replica curve at N / R times
the simulated fleet over the simulated one replica. On `make fleet-truth` (fake engine, R = 2
and 4, three policies, 2026-12-06) it carried the one-replica curve's sampling noise (a p90 of
16 continuations) into every fleet and overstated capacity in 4 of 6 fleets (by 1 to 3
agents); the simulated fleet alone overstated 1 of 6.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.plan.fleetsim import SimEngine, Trace
from compaction_bench.plan.settings import PlanError
from compaction_bench.serve.routerhash import HashRing

POLICIES = ("round_robin", "random", "power_of_two", "consistent_hash", "sticky_least_loaded",
            "cache_aware")
SAMPLES = 160  # simulated measured continuations per prediction


@dataclass(frozen=True)
class EngineFit:
    """The engine's fitted costs (module docstring), seconds."""

    slots: int
    prefill_base_s: float
    prefill_s_per_token: float
    cached_s_per_token: float
    step_base_s: float
    step_s_per_seq: float
    block_tokens: int
    n_prefill: int  # requests the prefill fit used
    n_levels: int  # levels the step fit used
    # a step also reads every running sequence's context (its KV cache): per token of context
    # summed over the batch. On the 2-core CPU a 3,000-token clean context stepped at 84 ms and
    # an 1,800-token external one at 48 ms alone (2026-12-07): a step of the batch alone
    # (s0 + s1 B) simulated external 25-129% slow.
    step_s_per_context_token: float = 0.0

    def prefill_s(self, uncached: float, cached: float) -> float:
        return (self.prefill_base_s + self.prefill_s_per_token * uncached
                + self.cached_s_per_token * cached)

    def step_s(self, batch: int, mean_context: float = 0.0) -> float:
        return max(1e-6, self.step_base_s + self.step_s_per_seq * batch
                   + self.step_s_per_context_token * batch * mean_context)

    @property
    def context_free(self) -> bool:
        """Steps between two events cost the same (plan.fleetsim.EngineCosts): the batch's
        context, which grows by one token per sequence and step, is taken as it stood when the
        run of steps began (a request's output is a few percent of its context)."""
        return True


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with the coefficients kept >= 0 (a negative cost is noise): refit without
    each negative one until none is left."""
    keep = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while keep:
        found, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (found >= 0).all():
            coef[keep] = found
            return coef
        keep.pop(int(np.argmin(found)))
    return coef


def fit_engine(requests: Sequence[Any], slots: int, block_tokens: int) -> EngineFit:
    """The engine's costs from one replica's sweep requests (`transport.request.RequestRecord`
    with labels `level`; module docstring)."""
    usable = [r for r in requests if r.status == "ok" and r.first_token_s is not None
              and r.end_s is not None and r.prompt_tokens is not None
              and isinstance(r.labels.get("level"), int)]
    if not usable:
        raise PlanError("the fleet model needs the sweep's request records with their first "
                        "token times (requests.jsonl); this run has none")
    low = min(r.labels["level"] for r in usable)
    first = [r for r in usable if r.labels["level"] == low]
    x = np.array([[1.0, r.prompt_tokens - (r.cached_tokens or 0), r.cached_tokens or 0]
                  for r in first])
    y = np.array([r.first_token_s - r.sent_s for r in first])
    a, b, c = _nonneg_lstsq(x, y)
    prefill = {id(r): a + b * (r.prompt_tokens - (r.cached_tokens or 0)) + c * (
        r.cached_tokens or 0) for r in usable}
    def context(r: Any) -> float:  # a request's context while it decodes, on average
        return float(r.prompt_tokens or 0) + (r.completion_tokens or 0) / 2

    rows: list[tuple[float, float, float]] = []  # (batch, its summed context, inter-token s)
    for level in sorted({r.labels["level"] for r in usable}):
        cell = [r for r in usable if r.labels["level"] == level]
        for r in cell:
            k = r.completion_tokens or 0
            span = r.end_s - r.first_token_s
            if k < 2 or span <= 0:
                continue
            # the others' prefills inside its decode stopped it (the engine does one thing at a
            # time), and the others decoding beside it made its batch and its context
            stalled = sum(prefill[id(o)] for o in cell
                          if o is not r and r.first_token_s < o.first_token_s < r.end_s)
            share = {id(o): max(0.0, min(o.end_s, r.end_s) - max(o.first_token_s,
                                                                   r.first_token_s)) / span
                     for o in cell if o is not r}
            beside = sum(share.values())
            batch = min(float(slots), 1.0 + beside)
            summed = context(r) + sum(share[id(o)] * context(o) for o in cell if o is not r)
            if beside > batch - 1.0:  # more beside than slots: scale to the slots' share
                summed = context(r) + (summed - context(r)) * (batch - 1.0) / beside
            rows.append((batch, summed, max(0.0, span - stalled) / (k - 1)))
    s2 = 0.0
    batches = {round(bt, 2) for bt, _, _ in rows}
    contexts = {round(ct, -1) for _, ct, _ in rows}
    itls = np.array([itl for *_, itl in rows])
    if len(batches) >= 2 and len(contexts) >= 2:
        s0, s1, s2 = _nonneg_lstsq(np.array([[1.0, bt, ct] for bt, ct, _ in rows]), itls)
    elif len(batches) >= 2:
        s0, s1 = _nonneg_lstsq(np.array([[1.0, bt] for bt, _, _ in rows]), itls)
    else:
        s0, s1 = (float(np.median(itls)), 0.0) if rows else (1e-3, 0.0)
    return EngineFit(slots=max(1, slots), prefill_base_s=float(a), prefill_s_per_token=float(b),
                     cached_s_per_token=float(c), step_base_s=float(s0), step_s_per_seq=float(s1),
                     block_tokens=max(1, block_tokens), n_prefill=len(first),
                     n_levels=len({r.labels["level"] for r in usable}),
                     step_s_per_context_token=float(s2))


class SimRouter:
    """The policy's choice of replica per request (module docstring)."""

    def __init__(self, policy: str, engines: list[SimEngine], ring: HashRing | None,
                 rng: np.random.Generator) -> None:
        if policy not in POLICIES:
            raise PlanError(f"fleet model: no routing policy '{policy}'; use one of "
                            f"{', '.join(POLICIES)}")
        self.policy, self.engines, self.ring, self.rng = policy, engines, ring, rng
        self.turn = 0
        self.sticky: dict[str, int] = {}

    def _least(self) -> int:
        loads = [e.in_flight for e in self.engines]
        return loads.index(min(loads))

    def pick(self, session: str) -> int:
        n = len(self.engines)
        if self.policy == "round_robin":
            self.turn += 1
            return (self.turn - 1) % n
        if self.policy == "random":
            return int(self.rng.integers(n))
        if self.policy == "power_of_two":
            if n == 1:
                return 0
            i, j = (int(v) for v in self.rng.choice(n, size=2, replace=False))
            return i if self.engines[i].in_flight <= self.engines[j].in_flight else j
        if self.policy == "consistent_hash":
            assert self.ring is not None
            return self.ring.replica(session)
        if self.policy == "sticky_least_loaded":
            if session not in self.sticky:
                self.sticky[session] = self._least()
            return self.sticky[session]
        return self._least()  # cache_aware: least loaded for chat on 0.1.17


@dataclass
class FleetRun:
    """One simulated fleet: the measured continuations' times and what routing did."""

    times: np.ndarray
    requests_per_replica: list[int]
    later_prompt_tokens: int = 0
    later_cached_tokens: int = 0
    routes: list[tuple[str, int]] = field(default_factory=list)  # (session, replica) per request

    @property
    def hit_rate(self) -> float | None:
        """Cached share of the later turns' prompt tokens."""
        return (self.later_cached_tokens / self.later_prompt_tokens
                if self.later_prompt_tokens else None)

    @property
    def hottest_share(self) -> float:
        total = sum(self.requests_per_replica)
        return max(self.requests_per_replica) / total if total else 0.0


def session_id(level: int, agent: int, index: int, arm: str) -> str:
    """The X-Session-Id the sweep sends for this continuation (bench.run.block.arm_session of
    bench.run.config.continuation_block), so the ring hashes exactly what the router will."""
    from compaction_bench.bench.run.block import arm_session
    from compaction_bench.bench.run.config import continuation_block

    return arm_session("sweep", continuation_block(level, agent, index), arm, "original")


def simulate_fleet(fit: EngineFit, pool: Sequence[Trace], agents: int, *, replicas: int,
                   policy: str, arm: str, urls: Sequence[str] | None = None,
                   samples: int = SAMPLES, warmup: int = 1, seed: int = 0,
                   wall: bool = True) -> FleetRun:
    """`agents` agents on `replicas` simulated replicas behind `policy` (module docstring)."""
    if not pool:
        raise PlanError("the fleet model needs measured continuations with request records")
    env = simpy.Environment()
    engines = [SimEngine(env, fit) for _ in range(replicas)]
    ring = None
    if policy == "consistent_hash":
        from compaction_bench.serve.routerhash import layout_urls

        ring = HashRing.of(tuple(urls) if urls else layout_urls(replicas))
        if len(ring.urls) != replicas:
            raise PlanError(f"fleet model: {len(ring.urls)} replica URLs for {replicas} "
                            "replicas (REPLICA_URLS must name one per replica)")
    rng = np.random.default_rng(seed)
    router = SimRouter(policy, engines, ring, np.random.default_rng(seed + 1))
    held: list[dict[str, int]] = [{} for _ in range(replicas)]
    run = FleetRun(np.zeros(0), [0] * replicas)
    quota = max(1, math.ceil(samples / agents))
    measured: list[float] = []
    left = [agents]
    all_done = env.event()
    block = fit.block_tokens

    def agent(i: int) -> Generator[simpy.Event, Any, None]:
        k = 0
        while not all_done.triggered:
            trace = pool[int(rng.integers(len(pool)))]
            session = session_id(agents, i, k, arm)
            start = env.now
            for j, step in enumerate(trace.steps):
                yield env.timeout(step.gap_s)
                r = router.pick(session)
                cached = step.cached_tokens if j == 0 else min(step.cached_tokens,
                                                               held[r].get(session, 0))
                if j > 0 and warmup <= k < warmup + quota:
                    run.later_prompt_tokens += step.prompt_tokens
                    run.later_cached_tokens += cached
                run.requests_per_replica[r] += 1
                run.routes.append((session, r))
                yield engines[r].submit(step, cached)
                held[r][session] = max(held[r].get(session, 0),
                                       step.prompt_tokens // block * block)
            yield env.timeout(trace.tail_s)
            if warmup <= k < warmup + quota:
                measured.append(env.now - start - (0.0 if wall else trace.rewrite_s))
                if k == warmup + quota - 1:
                    left[0] -= 1
                    if left[0] == 0:
                        all_done.succeed()
            for cache in held:  # a finished session's prefix is never asked for again
                cache.pop(session, None)
            k += 1

    for i in range(agents):
        env.process(agent(i))
    env.run(until=all_done)
    run.times = np.asarray(measured)
    return run


@dataclass
class FleetRow:
    """One arm's fleet under one policy and R replicas (plan.md's fleet table)."""

    arm: str
    policy: str
    replicas: int
    agents: int | None  # the largest fleet meeting the SLO; None: beyond `most`
    band: tuple[int | None, int | None]  # from the measured curve's pointwise interval
    most: int  # the largest fleet looked at (R x the plan's reach)
    predicted_s: float | None  # the predicted SLO quantile at `agents`
    slo_s: float
    even_split_s: float | None  # the one-replica curve at agents / R (the old assumption)
    hit_rate: float | None  # later turns' cached share of prompt tokens, at `agents`
    hottest_share: float | None  # the busiest replica's share of the requests, at `agents`
    gpus: int | None = None  # GPUs for the plan's fleet of AGENTS agents under this policy
    gpus_replicas: int | None = None


@dataclass
class FleetPlan:
    """Every fleet row, the fit, and the model's own error at one replica."""

    fit: EngineFit
    rows: list[FleetRow]
    one_replica_error: dict[str, list[dict[str, float]]]  # arm -> per level: measured, simulated
    urls: tuple[str, ...] | None
    notes: list[str] = field(default_factory=list)

    def median_error_pct(self, arm: str) -> float | None:
        errors = [e["ape_pct"] for e in self.one_replica_error.get(arm, [])]
        return float(np.median(errors)) if errors else None


class _Predictor:
    """Predicted SLO quantiles of one arm's fleets (module docstring), simulations cached."""

    def __init__(self, fit: EngineFit, pool: Sequence[Trace], arm: str, quantile: float,
                 levels: Sequence[int], values: Sequence[float], weights: Sequence[int], *,
                 urls: Sequence[str] | None, seed: int, wall: bool, samples: int) -> None:
        from compaction_bench.plan.curve import MonotoneCurve

        self.fit, self.pool, self.arm, self.q = fit, pool, arm, quantile
        self.curve = MonotoneCurve(levels, values, weights)  # the measured one replica
        self.urls, self.seed, self.wall, self.samples = urls, seed, wall, samples
        self.runs: dict[tuple[str, int, int], FleetRun] = {}

    def run(self, policy: str, replicas: int, agents: int) -> FleetRun:
        key = (policy if replicas > 1 else "one", replicas, agents)
        if key not in self.runs:
            urls = self.urls if self.urls is not None and len(self.urls) == replicas else None
            self.runs[key] = simulate_fleet(
                self.fit, self.pool, agents, replicas=replicas, policy=policy, arm=self.arm,
                urls=urls, samples=self.samples, seed=self.seed, wall=self.wall)
        return self.runs[key]

    def sim_q(self, policy: str, replicas: int, agents: int) -> float:
        return float(hd_quantile(self.run(policy, replicas, agents).times, self.q))

    @property
    def one_replica_error(self) -> list[dict[str, float]]:
        """The simulated one replica against every measured level (the model's own error)."""
        out = []
        for n, measured in zip(self.curve.levels, self.curve.measured,
                               strict=True):
            if measured > 0:
                simulated = self.sim_q("round_robin", 1, int(n))
                out.append({"level": float(n), "measured_s": float(measured),
                            "simulated_s": simulated,
                            "ape_pct": abs(simulated - measured) / measured * 100})
        return out

    @property
    def error(self) -> float:
        """The median relative error at one replica: the band's half-width."""
        errors = [e["ape_pct"] for e in self.one_replica_error]
        return float(np.median(errors)) / 100 if errors else 0.0

    def predicted(self, policy: str, replicas: int, agents: int, curve: str = "point") -> float:
        """The simulated fleet's SLO quantile; `high` and `low`: times (1 + e) and (1 - e), e
        the model's median error at one replica (module docstring)."""
        factor = {"point": 1.0, "high": 1.0 + self.error, "low": max(0.0, 1.0 - self.error)}
        return factor[curve] * self.sim_q(policy, replicas, agents)

    def largest(self, policy: str, replicas: int, slo_s: float, start: int, most: int,
                curve: str = "point") -> int | None:
        """The largest N in [1, most] whose prediction meets `slo_s` (None: past `most`; 0:
        not even one agent), assuming it grows with N: probe from `start`, then bisect."""
        def ok(n: int) -> bool:
            return self.predicted(policy, replicas, n, curve) <= slo_s

        n = min(max(1, start), most)
        if ok(n):
            good, step = n, 1
            while True:
                nxt = min(most, good + step)
                if nxt == good:
                    return None  # meets the SLO up to `most`
                if not ok(nxt):
                    bad = nxt
                    break
                good, step = nxt, step * 2
        else:
            bad, step = n, 1
            while True:
                nxt = max(0, bad - step)
                if nxt == 0:
                    good = 0
                    break
                if ok(nxt):
                    good = nxt
                    break
                bad, step = nxt, step * 2
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if ok(mid) else (good, mid)
        return good


def plan_fleet(obs: Any, capacity: dict[str, Any], config: Any) -> FleetPlan | None:
    """The fleet rows of a one-replica sweep's plan (module docstring): per arm, per policy in
    `config.fleet_policies` and R in `config.fleet_replicas`; None where the plan has no sweep
    or no fleet was asked for."""
    if not capacity or not config.fleet_replicas or not config.fleet_policies:
        return None
    notes = []
    if obs.engine.max_num_seqs is None:
        notes.append("the run records no max_num_seqs: the fleet model's engine has 1 slot")
    try:
        fit = engine_fit(obs)
    except PlanError as error:
        return FleetPlan(EngineFit(1, 0, 0, 0, 0, 0, 16, 0, 0), [], {}, None,
                         notes=[str(error)])
    urls = tuple(config.replica_urls) if config.replica_urls else None
    rows: list[FleetRow] = []
    errors: dict[str, list[dict[str, float]]] = {}
    for arm, cap in capacity.items():
        predictor = arm_predictor(obs, fit, arm, cap, config, urls)
        if predictor is None:
            notes.append(f"{arm}: no measured continuation with request records to simulate")
            continue
        levels = [lv.level for lv in cap.levels]
        errors[arm] = predictor.one_replica_error
        per_replica = cap.n_slo if cap.n_slo is not None and math.isfinite(cap.n_slo) else (
            levels[-1])
        for replicas in config.fleet_replicas:
            most = max(1, math.floor(replicas * cap.reach)) if math.isfinite(cap.reach) else (
                replicas * 4 * levels[-1])
            start = max(1, round(replicas * per_replica))
            for policy in config.fleet_policies:
                found = predictor.largest(policy, replicas, cap.slo_s, start, most)
                band = (predictor.largest(policy, replicas, cap.slo_s, start, most, "high"),
                        predictor.largest(policy, replicas, cap.slo_s, start, most, "low"))
                at = found if found else None
                run = predictor.run(policy, replicas, at) if at else None
                row = FleetRow(
                    arm=arm, policy=policy, replicas=replicas, agents=found, band=band,
                    most=most, predicted_s=predictor.predicted(policy, replicas, at)
                    if at else None, slo_s=cap.slo_s,
                    even_split_s=float(predictor.curve(max(1.0, at / replicas)))
                    if at else None,
                    hit_rate=run.hit_rate if run else None,
                    hottest_share=run.hottest_share if run else None)
                rows.append(row)
        _gpus(predictor, rows, arm, cap, config)
    return FleetPlan(fit, rows, errors, urls, notes)


def engine_fit(obs: Any) -> EngineFit:
    """The engine fitted on a one-replica sweep (raises PlanError naming what is missing)."""
    return fit_engine([r for r in obs.records.requests if r.regime == "sweep"],
                      obs.engine.max_num_seqs or 1, _block_tokens(obs.manifest))


def arm_predictor(obs: Any, fit: EngineFit, arm: str, cap: Any, config: Any,
                  urls: Sequence[str] | None) -> _Predictor | None:
    """The fleet predictor of one arm of a one-replica plan (None: no trace to replay)."""
    from compaction_bench.plan.economics import EXTERNAL
    from compaction_bench.plan.fleetsim import traces

    pool = traces(obs, arm, cap.levels[0].level, same_server_compressor=arm != EXTERNAL)
    if not pool:
        return None
    return _Predictor(fit, pool, arm, config.target.quantile, [lv.level for lv in cap.levels],
                      list(cap.quantiles), [lv.n for lv in cap.levels],
                      urls=urls, seed=config.seed, wall=config.slo_time == "wall",
                      samples=SAMPLES)


def _gpus(predictor: _Predictor, rows: list[FleetRow], arm: str, cap: Any, config: Any) -> None:
    """GPUs for the plan's fleet of AGENTS agents under each policy: the fewest replicas whose
    predicted quantile at AGENTS meets the SLO, from the policy's agents per replica, checked
    by simulation (at most 6 steps either way)."""
    fleet = config.agents
    for policy in config.fleet_policies:
        own = [r for r in rows if r.arm == arm and r.policy == policy and r.agents]
        if not own:
            continue
        per_replica = max((r.agents or 0) / r.replicas for r in own)
        replicas = max(1, math.ceil(fleet / per_replica))
        if fleet / replicas > cap.reach:
            continue

        def ok(r: int, policy: str = policy) -> bool:
            return bool(fleet / r <= cap.reach and predictor.predicted(
                policy, r, fleet) <= cap.slo_s)

        steps = 0
        while not ok(replicas) and steps < 6:
            replicas, steps = replicas + 1, steps + 1
        if not ok(replicas):
            continue
        while replicas > 1 and ok(replicas - 1) and steps < 12:
            replicas, steps = replicas - 1, steps + 1
        for row in own:
            row.gpus_replicas = replicas
            row.gpus = replicas * cap.gpus_per_replica


def _block_tokens(manifest: Any) -> int:
    """The prefix cache's block size the run's server hashed with (16 where none is stated)."""
    sweep = manifest.get("sweep") if isinstance(manifest, dict) else None
    config = sweep.get("server_cache_config") if isinstance(sweep, dict) else None
    if isinstance(config, dict) and str(config.get("block_size", "")).isdigit():
        return int(config["block_size"])
    profile = ((manifest.get("server") or {}).get("profile") or {}) if isinstance(
        manifest, dict) else {}
    size = (profile.get("engine_args") or {}).get("block_size")
    return int(size) if isinstance(size, int) else 16
