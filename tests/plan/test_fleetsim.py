"""The SimPy fleet simulator: exact timing on known step costs, and the real CPU cost model."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy

from compaction_bench.kernels.resultfile import kernel_results_dir
from compaction_bench.plan.fleetsim import Step, Trace, simulate

CPU_COSTS = (kernel_results_dir() /
             "cpu-intel-xeon-processor-2c__smollm2-135m-instruct__vllm-0.32.0.json")


class FixedCosts:
    """Step costs known exactly: prefill 0.2 s per request, 0.1 s per decode step."""

    def predict_prefill_s(self, uncached_tokens: float, cached_tokens: float) -> float:
        return 0.2

    def predict_decode_step_s(self, batch: float, mean_context: float) -> float:
        return 0.1


def test_one_agent_takes_gap_plus_prefill_plus_decode_plus_tail() -> None:
    trace = Trace((Step(1.0, 100, 0, 3),), tail_s=0.5, rewrite_s=0.0)
    # 1.0 gap + 0.2 prefill (first token) + 2 decode steps + 0.5 tail
    times = simulate(FixedCosts(), [trace], 1, max_num_seqs=4, samples=3)
    assert times.tolist() == pytest.approx([1.9, 1.9, 1.9])


def test_sequence_slots_batch_or_queue() -> None:
    trace = Trace((Step(0.0, 100, 0, 3),), tail_s=0.5, rewrite_s=0.0)
    batched = simulate(FixedCosts(), [trace], 2, max_num_seqs=2, samples=4)
    assert batched.tolist() == pytest.approx([1.1] * 4)  # 2 prefills, 2 shared steps, tail
    queued = simulate(FixedCosts(), [trace], 2, max_num_seqs=1, samples=4, warmup=0)
    assert max(queued) == pytest.approx(1.3)  # the second agent waited 0.4 s for the slot
    assert min(queued) == pytest.approx(0.9)


def test_rewriting_inside_the_gaps_is_not_postfork_time() -> None:
    trace = Trace((Step(3.0, 100, 0, 1),), tail_s=0.0, rewrite_s=2.0)
    assert simulate(FixedCosts(), [trace], 1, max_num_seqs=1, samples=1).tolist() == (
        pytest.approx([1.2]))


def test_the_cpu_cost_model_predicts_slower_agents_in_a_bigger_fleet() -> None:
    from compaction_bench.kernels.costmodel import load

    assert Path(CPU_COSTS).is_file(), CPU_COSTS
    costs = load(CPU_COSTS)
    trace = Trace(tuple(Step(0.3, 400 + 150 * k, 384 if k else 0, 40) for k in range(3)),
                  tail_s=0.4, rewrite_s=0.0)
    alone = simulate(costs, [trace], 1, max_num_seqs=4, samples=5)
    fleet = simulate(costs, [trace], 8, max_num_seqs=4, samples=16)
    assert float(np.median(fleet)) > 1.3 * float(np.median(alone)) > 0


def test_a_request_arriving_during_a_prefill_joins_at_the_next_step() -> None:
    """It arrives while another is prefilled, when no wake-up is armed: admitted at the next
    step boundary, not held until the running request ends (which simulated a replica of two
    agents at twice its measured time)."""
    from compaction_bench.plan.fleetsim import ModelCosts, SimEngine

    env = simpy.Environment()
    engine = SimEngine(env, ModelCosts(FixedCosts(), slots=2, context_free=True))
    done: dict[str, float] = {}

    def send(name: str, at: float) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at)
        yield engine.submit(Step(0.0, 100, 0, 11))
        done[name] = env.now

    env.process(send("a", 0.0))
    env.process(send("b", 0.1))  # inside a's prefill (0.0-0.2)
    env.run()
    # a: prefill to 0.2, one step to 0.3; b's prefill 0.3-0.5 stalls it; 9 steps to 1.4.
    # b: first token at 0.5, 10 steps to 1.5 (held until a ended: 1.2 + 0.2 + 1.0 = 2.4)
    assert done == pytest.approx({"a": 1.4, "b": 1.5})
