"""The `replay` source: each arm's recorded turns of a reasoning model, re-sent at their recorded
lengths (loadgen.replay), one recording per block in turn (bench/run/replay.py prepares the
recordings and their plans). The seam it plugs into: bench/run/source.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.run.arm import Arm, WireCheck, check_replay_on_the_wire
from compaction_bench.bench.run.compressors import Compressors
from compaction_bench.bench.run.config import (
    DEFAULT_BLOCKS,
    DEFAULT_REPLAY_BLOCKS,
    REPLAY_ARMS,
    BenchConfig,
    BenchError,
)
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.replay import (
    compressors_for,
    find_sources,
    fit_sources,
    recorded_figures,
    replay_arms,
    source_hashes,
    wire_options,
)
from compaction_bench.bench.run.source import Attempt, Opened, Result, Setup
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.policies.registry import parse_arm
from compaction_bench.loadgen.replay import ReplaySettings, describe_plan, replay
from compaction_bench.serve.profile import Profile
from compaction_bench.transport.wire import ReplayOptions


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
        if inline := [a for a in arms if parse_arm(a).kind == "inline"]:
            raise BenchError(f"arm {inline[0]} compacts in context at run time, and a recording "
                             "holds no summary to replay: run it live (source=agent) beside "
                             "clean and self")

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
