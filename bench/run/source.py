"""Where an arm's continuation comes from: the run's one seam between a block and its source.

A block (bench/run/block.py) asks its run's source two things per attempt of an arm, and knows
nothing else of it:

- `check`: the reasoning-only invariant on the wire, the exact first request the attempt will
  send against clean's (bench/run/arm.py);
- `run`: the continuation itself, with the attempt's policy, its requests recorded as sent.

Two sources exist. `AgentSource`: a live agent continues the history from the fork with real
tools (histories.agent.continuation). `ReplaySource`: the recorded turns of a reasoning model
are re-sent at their recorded lengths (loadgen.replay), one replay source per block in turn. A
third (an imported log replayed live, a recorded compaction) is a class here and a line in
`source_of`; the block does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from compaction_bench.bench.run.arm import (
    Arm,
    AttemptContext,
    WireCheck,
    check_on_the_wire,
    check_replay_on_the_wire,
)
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.common.timing import Clock
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.continuation import ContinuationResult, continue_history
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.tasks.task import Task
from compaction_bench.loadgen.background import ReplayOptions
from compaction_bench.loadgen.replay import ReplayResult, ReplaySettings, replay
from compaction_bench.transport.request import PreparedRequest, RequestRecord

Result = ContinuationResult | ReplayResult


@dataclass(frozen=True)
class Attempt:
    """One attempt of one arm in one block, as the block prepared it."""

    arm: Arm
    config: ChatModelConfig  # the attempt's model settings (its seed and cache salt)
    context: AttemptContext
    session_id: str  # the X-Session-Id of every request of the attempt
    on_request: Callable[[RequestRecord, PreparedRequest], None]
    gate: Callable[[], None]  # waits until the block releases its arms together
    clock: Clock


class Source(Protocol):
    """What a block asks of the run's source (module docstring)."""

    @property
    def name(self) -> str:
        """Recorded in every arm record: "agent" or "replay"."""
        ...

    def check(self, attempt: Attempt, clean: Arm, clean_config: ChatModelConfig) -> WireCheck:
        ...

    def run(self, attempt: Attempt, policy: HistoryPolicy) -> Result:
        ...


@dataclass(frozen=True)
class AgentSource:
    """A live agent continues each arm's history with real tools in the task's workspace."""

    config: BenchConfig
    task: Task
    name: str = "agent"

    def check(self, attempt: Attempt, clean: Arm, clean_config: ChatModelConfig) -> WireCheck:
        return check_on_the_wire(attempt.arm, attempt.config, clean, clean_config, self.task,
                                 attempt.context)

    def run(self, attempt: Attempt, policy: HistoryPolicy) -> Result:
        return continue_history(
            attempt.arm.history, self.task,
            attempt.config.model_copy(update={"session_id": attempt.session_id}),
            step_limit=self.config.step_limit, clock=attempt.clock, policy=policy,
            on_request=attempt.on_request, gate=attempt.gate,
            wall_time_s=self.config.arm_wall_s)


@dataclass(frozen=True)
class ReplaySource:
    """Each arm's recorded turns for the block's replay source, re-sent at their lengths."""

    config: BenchConfig
    wire: ReplayOptions
    name: str = "replay"

    def settings(self, config: ChatModelConfig) -> ReplaySettings:
        return ReplaySettings(api_url=config.api_url, model_name=config.model_name,
                              wire=self.wire, tool_time=self.config.tool_time,
                              extra_body=dict(config.extra_body), api_key=config.api_key,
                              read_timeout_s=config.request_timeout_s)

    def check(self, attempt: Attempt, clean: Arm, clean_config: ChatModelConfig) -> WireCheck:
        return check_replay_on_the_wire(attempt.arm, self.settings(attempt.config), clean,
                                        self.settings(clean_config), attempt.context)

    def run(self, attempt: Attempt, policy: HistoryPolicy) -> Result:
        arm, record = attempt.arm, attempt.context.record
        if arm.replay is None or record is None:
            raise ValueError(f"arm {arm.name} has no recorded turns to replay")
        return replay(arm.replay[record], self.settings(attempt.config), policy=policy,
                      on_request=attempt.on_request, gate=attempt.gate, clock=attempt.clock,
                      wall_time_s=self.config.arm_wall_s, session_id=attempt.session_id)


def source_of(config: BenchConfig, task: Task | None, wire: ReplayOptions | None) -> Source:
    """The run's source, from what its setup prepared: replay's wire options, else the task."""
    if wire is not None:
        return ReplaySource(config, wire)
    if task is None:
        raise ValueError("an agent run needs its task")
    return AgentSource(config, task)
