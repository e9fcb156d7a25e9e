"""vLLM's names on the wire, in one place: what a request asks of the engine beyond OpenAI's
chat API, and the `/metrics` names the suite reads. Every request body the suite builds takes
its extras from here (`from compaction_bench.serve.engines import vllm_wire as dialect`); the
fake engine speaks the same dialect and exports the same metric names. No imports: request
builders and metric readers load nothing else (serve/engines/vllm.py is the engine itself).

- `cache_salt`: requests with different salts share no prefix-cache blocks (each arm, block
  and background user gets its own, so caches are isolated exactly as the run says);
- a forced length: `max_tokens` with `ignore_eos` (and `min_tokens` to the same count where the
  count must be exact: a replayed turn at its recorded length);
- `return_token_ids`: the prompt's and completion's token ids come back (cache-break
  accounting);
- `skip_special_tokens` off: a generated special token still arrives as text, so every token
  is stamped (the device probes);
- `top_k`: a model card's sampling (Qwen3's top_k 20), which OpenAI's API lacks.
"""

from __future__ import annotations

from typing import Any

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
