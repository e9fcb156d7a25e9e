"""The fleet model (plan/fleetmodel.py): its engine's exact timing, the router's split and the
per-replica prefix cache, on traces of known cost."""

from __future__ import annotations

import numpy as np
import pytest

from compaction_bench.common.settings import build, layered
from compaction_bench.plan.fleetmodel import (
    EngineFit,
    fit_engine,
    session_id,
    simulate_fleet,
)
from compaction_bench.plan.fleetsim import Step, Trace
from compaction_bench.plan.settings import PlanConfig
from compaction_bench.serve.routerhash import HashRing, layout_urls
from compaction_bench.transport.request import RequestRecord

FIT = EngineFit(slots=2, prefill_base_s=0.0, prefill_s_per_token=0.001, cached_s_per_token=0.0,
                step_base_s=0.01, step_s_per_seq=0.0, block_tokens=16, n_prefill=0, n_levels=0)


def _trace(turns: int = 4) -> Trace:
    prompts = [1000 + 400 * k for k in range(turns)]
    return Trace(tuple(Step(0.5, p, prompts[k - 1] // 16 * 16 if k else 0, 11)
                       for k, p in enumerate(prompts)), tail_s=0.25, rewrite_s=0.0)


def test_one_agent_alone_takes_its_gaps_prefills_and_steps_exactly() -> None:
    trace = _trace()
    run = simulate_fleet(FIT, [trace], 1, replicas=1, policy="round_robin", arm="clean",
                         samples=3)
    expected = sum(s.gap_s + 0.001 * (s.prompt_tokens - s.cached_tokens) + 10 * 0.01
                   for s in trace.steps) + trace.tail_s
    assert run.times.tolist() == pytest.approx([expected] * 3)
    assert run.hit_rate == pytest.approx(sum(s.cached_tokens for s in trace.steps[1:])
                                         / sum(s.prompt_tokens for s in trace.steps[1:]))


def test_slots_queue_and_decode_steps_grow_with_the_batch() -> None:
    trace = Trace((Step(0.0, 100, 0, 3),), tail_s=0.0, rewrite_s=0.0)
    one_slot = EngineFit(1, 0.0, 0.001, 0.0, 0.01, 0.0, 16, 0, 0)
    queued = simulate_fleet(one_slot, [trace], 2, replicas=1, policy="round_robin",
                            arm="clean", samples=4, warmup=0)
    assert min(queued.times) == pytest.approx(0.12)  # 0.1 prefill + 2 steps
    assert max(queued.times) == pytest.approx(0.24)  # waited for the slot
    batched = EngineFit(2, 0.0, 0.001, 0.0, 0.01, 0.005, 16, 0, 0)
    both = simulate_fleet(batched, [trace], 2, replicas=1, policy="round_robin", arm="clean",
                          samples=2, warmup=0)
    # two prefills one after another, then 2 steps of batch 2 at 0.02 s
    assert sorted(both.times.tolist()) == pytest.approx([0.24, 0.24])


def test_consistent_hash_sends_each_session_where_the_routers_ring_does() -> None:
    run = simulate_fleet(FIT, [_trace(2)], 6, replicas=3, policy="consistent_hash",
                         arm="clean", samples=12)
    ring = HashRing.of(layout_urls(3))
    assert len(run.routes) >= 2 * 12
    assert all(replica == ring.replica(session) for session, replica in run.routes)
    assert run.routes[0][0] == session_id(6, 0, 0, "clean") == "sweep-b600000001-clean-original"
    assert len({r for _, r in run.routes}) == 3


def test_round_robin_loses_the_cached_prefix_that_a_session_affine_policy_keeps() -> None:
    rng = np.random.default_rng(5)  # continuations of different lengths and pace, as measured
    pool = [Trace(tuple(Step(float(rng.uniform(0.2, 0.8)), 1000 + 400 * k,
                             (1000 + 400 * (k - 1)) // 16 * 16 if k else 0,
                             int(rng.integers(5, 30))) for k in range(6)),
                  tail_s=0.25, rewrite_s=0.0) for _ in range(8)]
    rr = simulate_fleet(FIT, pool, 4, replicas=2, policy="round_robin", arm="clean", seed=3)
    sticky = simulate_fleet(FIT, pool, 4, replicas=2, policy="sticky_least_loaded",
                            arm="clean", seed=3)
    alone = simulate_fleet(FIT, pool, 2, replicas=1, policy="round_robin", arm="clean", seed=3)
    assert sticky.hit_rate == pytest.approx(alone.hit_rate, rel=0.01)  # all it measured
    assert rr.hit_rate is not None and sticky.hit_rate is not None
    assert rr.hit_rate < 0.8 * sticky.hit_rate  # two replicas: about half the turns move
    assert np.quantile(rr.times, 0.9) > np.quantile(sticky.times, 0.9)


def test_the_engine_fit_recovers_known_costs() -> None:
    """Groups of B requests decoding side by side (level B), none prefilling inside another's
    decode: the fit finds the prefill's and the step's known costs."""
    records = []
    t = 0.0
    for level in (1, 2, 4):
        for g in range(12):
            uncached, cached, k = 200 + 37 * g, 64 * (g % 3), 21
            ttft = 0.05 + 0.002 * uncached + 0.0005 * cached
            itl = 0.01 + 0.004 * level
            for i in range(level):
                records.append(RequestRecord(
                    request_id=f"r{level}-{g}-{i}", sent_s=t, status="ok", regime="sweep",
                    first_token_s=t + ttft, end_s=t + ttft + (k - 1) * itl,
                    prompt_tokens=uncached + cached, cached_tokens=cached, completion_tokens=k,
                    labels={"level": level}))
            t += ttft + (k - 1) * itl + 1.0
    fit = fit_engine(records, slots=4, block_tokens=16)
    assert fit.prefill_base_s == pytest.approx(0.05, abs=1e-6)
    assert fit.prefill_s_per_token == pytest.approx(0.002, rel=1e-6)
    assert fit.cached_s_per_token == pytest.approx(0.0005, rel=1e-5)
    assert fit.step_base_s == pytest.approx(0.01, rel=1e-6)
    assert fit.step_s_per_seq == pytest.approx(0.004, rel=1e-6)
    assert fit.step_s_per_context_token == pytest.approx(0.0, abs=1e-9)  # none in these costs


def test_the_engine_fit_finds_a_step_that_reads_the_batchs_context() -> None:
    """Steps that cost 5 ms + 20 us per token of every running sequence's context (a CPU's
    attention): long and short prompts alone and side by side give the known costs back, and
    a step of two long contexts costs what the fit says."""
    records = []
    t = 0.0
    for level in (1, 2):
        for g in range(10):
            prompt, k = 600 + 500 * g, 21
            context = level * (prompt + k / 2)  # the others decode beside it the whole time
            itl = 0.005 + 0.00002 * context
            for i in range(level):
                records.append(RequestRecord(
                    request_id=f"r{level}-{g}-{i}", sent_s=t, status="ok", regime="sweep",
                    first_token_s=t + 0.1, end_s=t + 0.1 + (k - 1) * itl,
                    prompt_tokens=prompt, cached_tokens=0, completion_tokens=k,
                    labels={"level": level}))
            t += 0.1 + (k - 1) * itl + 1.0
    fit = fit_engine(records, slots=4, block_tokens=16)
    assert fit.step_base_s == pytest.approx(0.005, rel=1e-4)
    assert fit.step_s_per_context_token == pytest.approx(0.00002, rel=1e-4)
    assert fit.step_s_per_seq == pytest.approx(0.0, abs=1e-6)
    assert fit.step_s(2, 3000.0) == pytest.approx(0.005 + 0.00002 * 6000, rel=1e-4)


def test_fleet_settings_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="FLEET_REPLICAS: 0 replicas"):
        PlanConfig(run_dir=".", fleet_replicas=(0,))
    with pytest.raises(ValueError, match="kv-event-source"):
        PlanConfig(run_dir=".", fleet_policies=("kv_aware",))


def test_plan_settings_read_as_the_bench_does_and_none_plans_no_fleet() -> None:
    words = ["fleet_replicas=none", "SLO=p90:120s", "fleet_policies=round_robin"]
    config = build(PlanConfig, layered(PlanConfig, words=["run_dir=.", *words]), "plan settings")
    assert config.fleet_replicas == () and config.slo == "p90:120s"
    assert config.fleet_policies == ("round_robin",)
    # an empty variable means the default, not "none"
    default = build(PlanConfig, layered(PlanConfig, words=["run_dir=.", "fleet_replicas="]),
                    "plan settings")
    assert default.fleet_replicas == (2,)
