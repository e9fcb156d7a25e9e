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

Two sources exist. `agent`: a live agent continues the history from the fork with real tools
(histories.agent.continuation). `replay`: the recorded turns of a reasoning model are re-sent at
their recorded lengths (loadgen.replay), one recording per block in turn. A third (an imported
log replayed live, a recorded compaction) is a kind here, a line in `KINDS` and its name in
`BenchConfig.source`'s choices; nothing else changes (tests/bench/run/test_source_seam.py runs a
toy third source through a whole bench run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from compaction_bench.bench.run.arm import (
    Arm,
    AttemptContext,
    WireCheck,
    check_on_the_wire,
    check_replay_on_the_wire,
)
from compaction_bench.bench.run.compressors import Compressors, build_arms
from compaction_bench.bench.run.config import (
    AGENT_ARMS,
    DEFAULT_BLOCKS,
    DEFAULT_REPLAY_BLOCKS,
    REPLAY_ARMS,
    REPLAY_ONLY_ARMS,
    SEARCH,
    SWEEP,
    SWEEP_CONTINUATIONS,
    BenchConfig,
    BenchError,
)
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.replay import (
    Recording,
    compressors_for,
    find_sources,
    fit_sources,
    recorded_figures,
    replay_arms,
    source_hashes,
    wire_options,
)
from compaction_bench.bench.run.resume import history_paths
from compaction_bench.common.timing import Clock
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.continuation import ContinuationResult, continue_history
from compaction_bench.histories.agent.sandbox import Confinement, confinement
from compaction_bench.histories.agent.workspace import workspace_limits
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.tasks.task import Task, load_task
from compaction_bench.loadgen.background import ReplayOptions
from compaction_bench.loadgen.replay import ReplayResult, ReplaySettings, describe_plan, replay
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


class ReplayKind:
    """The recorded turns of reasoning models, re-sent at their recorded lengths."""

    name = "replay"
    arms = REPLAY_ARMS
    # arms sharing the engine's batches share each other's prefill, which hides a shorter
    # history's saving: one after another, each with its own cache
    cache = "isolated"
    side_by_side = False
    # the two recorded branches (clean, and the study's rewritten one), whose fleets price the
    # recorded behaviour of each on this server
    cpu_sweep: tuple[tuple[str, Any], ...] = (("arms", ("clean", "external")),)

    def check_arms(self, arms: tuple[str, ...]) -> None:
        return None

    def blocks(self, regime: str, profile: Profile) -> int:
        if profile.engine != "cuda":
            return DEFAULT_REPLAY_BLOCKS[regime]
        return DEFAULT_BLOCKS[profile.engine][regime]

    def open(self, config: BenchConfig) -> Opened:
        recordings = find_sources(config.records)
        config = config.model_copy(update={"records": tuple(r.name for r in recordings)})
        paths = {name: Path(entry["path"]) for name, entry in source_hashes(recordings).items()}
        return Opened(config, paths, recordings=recordings)

    def fingerprint(self, opened: Opened) -> dict[str, Any]:
        return {}

    def compressors(self, opened: Opened) -> set[str] | None:
        return compressors_for(opened.config, opened.recordings)

    def setup(self, opened: Opened, profile: Profile, url: str, compressors: Compressors,
              phases: PhaseLog) -> Setup:
        config, recordings, wire = opened.config, opened.recordings, wire_options(profile)
        arms = replay_arms(config, recordings, compressors.configs, compressors.hooks)
        with phases.phase("replay_fit"):
            fits = fit_sources(profile, url, recordings, arms, wire)
        kept = tuple(r.name for r in recordings if r.name not in fits.skipped)
        if not kept:
            raise BenchError("no replay source fits the served model: " + "; ".join(
                f"{name}: {why}" for name, why in fits.skipped.items()))
        manifest = {
            "sandbox": {"level": "not needed", "why": "replay runs no agent commands"},
            "replay": {
                "records": list(kept), "skipped": fits.skipped, "tool_time": config.tool_time,
                "wire": wire.model_dump(mode="json"),
                "served_prompt_tokens": fits.served, "served_prompt_counted": fits.counted,
                "max_model_len": fits.max_model_len,
                "plans": {a.name: {name: describe_plan(plan) for name, plan in (
                    a.replay or {}).items()} for a in arms},
                "recorded": recorded_figures(recordings)}}
        return Setup(arms, manifest, ReplaySource(config, wire), kept)

    def banner(self, config: BenchConfig) -> str:
        return f"replay of {', '.join(config.records)}"

    def note(self) -> str:
        return ("cpu-tiny serving recorded reasoning-model turns: the recorded behaviour (its "
                "lengths and histories) is priced on this server; the served model's own "
                "reasoning is not what is measured")


# Every source the bench offers, by its SOURCE= name (the names of `BenchConfig.source`).
KINDS: dict[str, SourceKind] = {k.name: k for k in (AgentKind(), ReplayKind())}


def kind_of(name: str) -> SourceKind:
    """The source kind named `name` (a run's SOURCE=)."""
    try:
        return KINDS[name]
    except KeyError:
        raise BenchError(f"SOURCE={name}: no such source; use one of "
                         f"{', '.join(KINDS)}") from None


def default_blocks(regime: str, profile: Profile, source: str | None = None) -> int:
    """Blocks per run of a block regime by default: the source's (SOURCE= or the profile's
    default source)."""
    if regime in (SWEEP, SEARCH):
        raise ValueError(f"REGIME={regime} runs fleets of agents, not blocks")
    return kind_of(source or default_source(profile)).blocks(regime, profile)


def default_source(profile: Profile) -> str:
    """SOURCE= where not given: live agents where the engine can run a reasoning model (a GPU),
    else the recorded turns of one (CPU and the fake engine)."""
    return "agent" if profile.engine == "cuda" else "replay"


def with_source_defaults(config: BenchConfig, profile: Profile) -> BenchConfig:
    """`config` with its source's and the profile's defaults filled in (the source, arms, cache,
    side by side, the sweep's continuations per level); the manifest stores the result, so a
    run always says what it ran."""
    kind = kind_of(config.source or default_source(profile))
    arms = config.arms or kind.arms
    kind.check_arms(arms)
    sweep = config.sweep
    if sweep.min_continuations is None:
        sweep = sweep.model_copy(update={
            "min_continuations": SWEEP_CONTINUATIONS[profile.engine]})
    return config.model_copy(update={
        "source": kind.name, "arms": arms, "cache": config.cache or kind.cache,
        "side_by_side": (config.side_by_side if config.side_by_side is not None
                         else kind.side_by_side), "sweep": sweep})
