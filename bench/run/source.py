"""Where an arm's continuation comes from: the run's one seam between its setup and blocks and
the source of its continuations.

A source has two faces. `SourceKind`, the run's: its defaults (arms, cache, side by side, the
CPU sweep's arms and step limit, blocks per regime), what it opens before the run folder exists
(replay's recordings; the agent's task and box), its arms and manifest fields once the server is
up, the banner's words and the CPU default's note. The session (bench/run/session.py), the
runner, the sweep and the manifest ask the kind and never test its name.

`Source`, the block's: per attempt of an arm, a block (bench/run/block.py) asks it two things
and knows nothing else of it:

- `check`: the reasoning-only invariant on the wire, the exact first request the attempt will
  send against clean's (bench/run/arm.py);
- `run`: the continuation itself, with the attempt's policy, its requests recorded as sent.

Two sources exist, one file each: `agent` (bench/run/agent_source.py: a live agent continues
the history from the fork with real tools) and `replay` (bench/run/replay_source.py: the recorded
turns of a reasoning model re-sent at their recorded lengths, one recording per block in turn).
bench/run/sources.py lists them (`KINDS`) and resolves a run's. A third (an imported log
replayed live, a recorded compaction) is a file of its own and a line in `KINDS`; nothing else
changes (tests/bench/run/test_source_seam.py runs a toy third source through a whole bench run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from compaction_bench.bench.run.arm import Arm, AttemptContext, WireCheck
from compaction_bench.bench.run.compressors import Compressors
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.replay import Recording
from compaction_bench.common.timing import Clock
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.continuation import ContinuationResult
from compaction_bench.histories.agent.sandbox import Confinement
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.tasks.task import Task
from compaction_bench.loadgen.replay import ReplayResult
from compaction_bench.serve.profile import Profile
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


class Opened:
    """What a source opens before the run folder exists (bench/run/session.py)."""

    def __init__(self, config: BenchConfig, paths: dict[str, Path], *,
                 task: Task | None = None, sandbox: Confinement | None = None,
                 recordings: list[Recording] | None = None) -> None:
        self.config = config  # with what the source resolved (replay: the recordings found)
        self.paths = paths  # every history file the arms read (fingerprint, manifest)
        self.task = task  # agent: the task its agents work on
        self.sandbox = sandbox  # agent: what confines their commands
        self.recordings = recordings or []  # replay: the recordings blocks take in turn


@dataclass(frozen=True)
class Setup:
    """What a source sets up once the server is up: the arms, the manifest's fields of the
    source, and the block's `Source`."""

    arms: list[Arm]
    manifest: dict[str, Any]
    source: Source
    records: tuple[str, ...] = ()  # replay: the recordings kept, one per block in turn


class SourceKind(Protocol):
    """A source as the run sees it (module docstring)."""

    @property
    def name(self) -> str:
        """Its SOURCE= name, recorded in every arm record."""
        ...

    @property
    def arms(self) -> tuple[str, ...]:
        """The default arms."""
        ...

    @property
    def cache(self) -> str:
        """The default CACHE."""
        ...

    @property
    def side_by_side(self) -> bool:
        """The default: a block's arms at once, or one after another."""
        ...

    @property
    def cpu_sweep(self) -> tuple[tuple[str, Any], ...]:
        """A CPU sweep's settings where not given (arms, step_limit)."""
        ...

    def check_arms(self, arms: tuple[str, ...]) -> None:
        """Refuse, in one line, an arm this source cannot run."""
        ...

    def blocks(self, regime: str, profile: Profile) -> int:
        """Blocks per regime by default."""
        ...

    def open(self, config: BenchConfig) -> Opened:
        ...

    def fingerprint(self, opened: Opened) -> dict[str, Any]:
        """What makes a RESUME the same run beyond the shared fields."""
        ...

    def compressors(self, opened: Opened) -> set[str] | None:
        """The compressors its arms need started (None: every one an arm names)."""
        ...

    def setup(self, opened: Opened, profile: Profile, url: str, compressors: Compressors,
              phases: PhaseLog) -> Setup:
        ...

    def banner(self, config: BenchConfig) -> str:
        """What the run's first line says of it."""
        ...

    def note(self) -> str:
        """What a run of it on the CPU default can show (manifest and report)."""
        ...
