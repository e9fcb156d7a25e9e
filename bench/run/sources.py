"""The sources a run can take its continuations from, by their SOURCE= name, and how a run's is
resolved. One file per source plugs into the seam of bench/run/source.py; adding one is its
file and a line in `KINDS`."""

from __future__ import annotations

from compaction_bench.bench.run.agent_source import AgentKind
from compaction_bench.bench.run.config import (
    SEARCH,
    SWEEP,
    SWEEP_CONTINUATIONS,
    BenchConfig,
    BenchError,
)
from compaction_bench.bench.run.replay_source import ReplayKind
from compaction_bench.bench.run.source import SourceKind
from compaction_bench.serve.profile import Profile

# Every source the bench offers, by its SOURCE= name.
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
