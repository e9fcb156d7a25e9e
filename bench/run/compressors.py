"""Each compaction arm's compressor for a run, and the arms built from their history files:
`self` on the target's own server, `external` at EXTERNAL_URL or the embedded Gemma server,
started lazily."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from compaction_bench.bench.run.arm import Arm, arm_for
from compaction_bench.bench.run.config import (
    BenchConfig,
    BenchError,
)
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.common.paths import histories_root
from compaction_bench.histories.compaction.compactor import (
    CompactionCache,
    CompressorConfig,
    external_compressor,
    profile_compressor,
)
from compaction_bench.histories.compaction.prompts import REWRITE_PROMPTS
from compaction_bench.histories.format.history import load_history
from compaction_bench.serve.launcher import LazyServer, ServerConfig, server_for
from compaction_bench.serve.profile import EXTERNAL_COMPRESSOR_PROFILE, Profile, load_profile


def build_arms(config: BenchConfig, paths: dict[str, Path], compressors: Compressors
               ) -> list[Arm]:
    """Each arm's history and policy; with `rewrite_cache=reuse`, the task's rewrite cache."""
    cache = None
    if config.rewrite_cache == "reuse":
        cache = CompactionCache(histories_root() / config.task / "compaction" / "cache.jsonl")
    from compaction_bench.histories.policies.registry import parse_arm

    return [arm_for(arm, load_history(paths[arm]), compressors=compressors.configs, cache=cache,
                    before_request=compressors.hooks.get(parse_arm(arm).compressor or ""))
            for arm in config.arms]


@dataclass
class Compressors:
    """Each compaction arm's compressor, and what runs before its requests (a lazy start)."""

    configs: dict[str, CompressorConfig]
    hooks: dict[str, Callable[[], None]]


@contextmanager
def open_compressors(config: BenchConfig, profile: Profile, target_url: str, run_dir: Path,
                     origin: float, phases: PhaseLog, *, needed: set[str] | None = None
                     ) -> Iterator[Compressors]:
    """`self`: the target's own `compressor` name. `external`: EXTERNAL_URL, or on CPU the
    embedded Gemma server on port + 1, started only when a block first needs a rewrite (on
    cpu-tiny none does: every block stays under the identity rule)."""
    if config.prompt not in REWRITE_PROMPTS:
        raise BenchError(f"unknown prompt {config.prompt!r}; use one of "
                         f"{', '.join(REWRITE_PROMPTS)}")
    # cache_tag: which model answers, so the rewrite cache's identity does not hang on a port
    # (EXTERNAL_URL names no model: its URL stands for it)
    found = Compressors({"self": deadline(profile_compressor(
        "self", target_url, profile, prompt=config.prompt), config)}, {})
    from compaction_bench.histories.policies.registry import compressors_needed

    wanted = compressors_needed(config.arms) if needed is None else needed
    if "external" not in wanted:  # external, external-every-<n>; none for recorded branches
        yield found
        return
    if config.external_url is not None:
        with server_for(ServerConfig(profile=profile), config.external_url) as url:
            found.configs["external"] = deadline(external_compressor(url, prompt=config.prompt),
                                                  config)
            yield found
        return
    if profile.engine != "cpu":
        raise BenchError("the external arm needs another model's endpoint on a GPU profile: "
                         "pass EXTERNAL_URL=<OpenAI-compatible URL> (key in "
                         "$COMPRESSOR_API_KEY), or ARMS=clean,self")
    embedded = load_profile(EXTERNAL_COMPRESSOR_PROFILE)
    lazy = LazyServer(ServerConfig(profile=embedded,
                                   port=config.port + 1, fast_start=config.fast_start),
                      name="external-compressor",
                      events=run_dir / "helpers.jsonl", origin=origin)
    try:
        found.configs["external"] = deadline(profile_compressor(
            "external", lazy.config.api_url, embedded, prompt=config.prompt), config)

        def ensure() -> None:
            started = time.monotonic()
            fresh = not lazy.used
            lazy.ensure()
            if fresh and lazy.server is not None:  # started now, not reused
                phases.add("compressor_start", started, time.monotonic())

        found.hooks["external"] = ensure
        yield found
    finally:
        lazy.stop()


def deadline(compressor: CompressorConfig, config: BenchConfig) -> CompressorConfig:
    """The compressor with the run's stream deadline (COMPRESSOR_DEADLINE)."""
    endpoint = compressor.endpoint.model_copy(
        update={"request_timeout_s": config.compressor_deadline_s})
    return compressor.model_copy(update={"endpoint": endpoint})
