"""A sweep cell's bookkeeping: continuation numbers (and so seeds), and which continuations a
fleet measures."""

from __future__ import annotations

import threading

from compaction_bench.bench.run.config import continuation_block, continuation_of
from compaction_bench.bench.run.fleet import Fleet


def test_continuation_numbers_are_unique_and_shared_across_arms() -> None:
    numbers = {continuation_block(n, a, k) for n in (1, 2, 64) for a in range(n)
               for k in range(12)}
    assert len(numbers) == sum(n for n in (1, 2, 64)) * 12
    assert continuation_block(8, 3, 2) == 800030003
    assert all(continuation_of(continuation_block(n, a, k)) == (n, a, k)
               for n in (1, 8, 64) for a in range(n) for k in (0, 1, 11))


def test_a_fleets_agents_replay_different_recordings_at_once() -> None:
    """At each continuation index the agents of a level replay different recordings (agent i,
    continuation k: record i + k), and each agent still takes every recording in turn; a block
    regime keeps the records in turn by block. Before, every agent of a level replayed the same
    recording at the same index: a lockstep no real fleet has."""
    from compaction_bench.bench.run.block import BlockSettings
    from compaction_bench.bench.run.config import BenchConfig
    from compaction_bench.bench.run.replay_source import ReplaySource
    from compaction_bench.histories.agent.chat import ChatModelConfig
    from compaction_bench.histories.compaction.ledger import Ledger
    from compaction_bench.transport.wire import ReplayOptions

    records = ("a", "b", "c", "d")

    def settings(regime: str) -> BlockSettings:
        config = BenchConfig(regime=regime)
        return BlockSettings(config=config, run_id="r", source=ReplaySource(
            config, ReplayOptions()), model=ChatModelConfig(api_url="http://x/v1"),
            protocol="lenient", block_size=16, ledger=Ledger(), records=records)

    sweep = settings("sweep")
    at_once = [sweep.record_for(continuation_block(4, agent, 5)) for agent in range(4)]
    assert sorted(at_once) == list(records)  # four agents, four recordings at index 5
    assert [sweep.record_for(continuation_block(4, 2, k)) for k in range(4)] == ["c", "d", "a",
                                                                                 "b"]
    blocks = settings("dedicated")
    assert [blocks.record_for(b) for b in (1, 2, 3, 4, 5)] == ["a", "b", "c", "d", "a"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_agent_warms_up_measures_its_share_then_drains_until_all_are_done() -> None:
    clock = Clock()
    fleet = Fleet(agents=2, quota=2, warmup=1, level_s=0.0, started_s=0.0, clock=clock)
    assert [fleet.next_phase(0) for _ in range(3)] == ["warmup", "measured", "measured"]
    assert fleet.next_phase(0) == "drain"  # agent 1 has not measured yet: keep the load
    assert [fleet.next_phase(1) for _ in range(3)] == ["warmup", "measured", "measured"]
    assert fleet.next_phase(1) is None  # the last measuring agent stops everyone
    assert fleet.next_phase(0) is None


def test_a_minimum_level_time_keeps_agents_measuring() -> None:
    clock = Clock()
    fleet = Fleet(agents=1, quota=1, warmup=0, level_s=10.0, started_s=0.0, clock=clock)
    assert fleet.next_phase(0) == "measured"
    clock.now = 5.0
    assert fleet.next_phase(0) == "measured"  # quota met, but the level has run 5 s of 10
    clock.now = 10.0
    assert fleet.next_phase(0) is None


def test_the_fleet_is_safe_across_agent_threads() -> None:
    fleet = Fleet(agents=8, quota=50, warmup=1, level_s=0.0, started_s=0.0, clock=Clock())
    phases: list[str] = []
    lock = threading.Lock()

    def agent(i: int) -> None:
        while (phase := fleet.next_phase(i)) is not None:
            with lock:
                phases.append(phase)
            if phase == "drain":
                break

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert phases.count("warmup") == 8 and phases.count("measured") == 400
