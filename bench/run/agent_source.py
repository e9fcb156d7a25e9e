"""The `agent` source: a live agent continues each arm's history from the fork with real tools
in the task's workspace, in the run's box (histories.agent.continuation). The seam it plugs
into: bench/run/source.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compaction_bench.bench.run.arm import Arm, WireCheck, check_on_the_wire
from compaction_bench.bench.run.compressors import Compressors, build_arms
from compaction_bench.bench.run.config import (
    AGENT_ARMS,
    DEFAULT_BLOCKS,
    REPLAY_ONLY_ARMS,
    BenchConfig,
    BenchError,
)
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.resume import history_paths
from compaction_bench.bench.run.source import Attempt, Opened, Result, Setup
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.continuation import continue_history
from compaction_bench.histories.agent.sandbox import confinement
from compaction_bench.histories.agent.workspace import workspace_limits
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.policies.registry import RECORDED_ARM
from compaction_bench.histories.tasks.task import Task, load_task
from compaction_bench.serve.profile import Profile


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


class AgentKind:
    """Live agents with real tools in the task's workspace, in the run's box."""

    name = "agent"
    arms = AGENT_ARMS
    cache = "shared"
    side_by_side = True
    # two model calls per continuation and the two arms on the one server keep a CPU sweep
    # (levels 1..8) to minutes (with the task's step limit and three arms it took 20 min on
    # 2 cores)
    cpu_sweep: tuple[tuple[str, Any], ...] = (("arms", ("clean", "self")), ("step_limit", 2))

    def check_arms(self, arms: tuple[str, ...]) -> None:
        if bad := [a for a in arms if a in REPLAY_ONLY_ARMS]:
            raise BenchError(f"arm {bad[0]} exists only for replay (source=replay): its "
                             "history-only continuation reuses clean's recorded turns")
        if RECORDED_ARM in arms:
            raise BenchError(f"arm {RECORDED_ARM} is the agent's own compaction as its log "
                             "recorded it, and replays the log's turns: run it with "
                             "source=replay records=<the folder of the imported pair>")

    def blocks(self, regime: str, profile: Profile) -> int:
        return DEFAULT_BLOCKS[profile.engine][regime]

    def open(self, config: BenchConfig) -> Opened:
        task = load_task(config.task)
        task.check_runnable()
        sandbox = confinement()  # before anything starts: no unconfined agent unless asked
        return Opened(config, history_paths(config.task, config.arms), task=task,
                      sandbox=sandbox)

    def fingerprint(self, opened: Opened) -> dict[str, Any]:
        assert opened.task is not None and opened.sandbox is not None
        # a RESUME under a weaker box is another run
        return {"sandbox": opened.sandbox.record(workspace_limits(opened.task))}

    def compressors(self, opened: Opened) -> set[str] | None:
        return None

    def setup(self, opened: Opened, profile: Profile, url: str, compressors: Compressors,
              phases: PhaseLog) -> Setup:
        assert opened.task is not None
        return Setup(build_arms(opened.config, opened.paths, compressors),
                     self.fingerprint(opened), AgentSource(opened.config, opened.task))

    def banner(self, config: BenchConfig) -> str:
        return "agent"

    def note(self) -> str:
        return ("cpu-tiny: a 135M model that cannot reason; live agents test the machinery, "
                "not the effect of compaction")
