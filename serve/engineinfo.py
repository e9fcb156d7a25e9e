"""What a running engine says about itself, and whether that agrees with the profile: the
`server` check of the self-check (`serve.selfcheck`).

vLLM states its effective cache arguments as the labels of the `vllm:cache_config_info` gauge on
`/metrics` (block size, prefix caching, retention interval, KV blocks), and registers its
`vllm:spec_decode_*` counters only when speculative decoding is configured
(vllm/v1/spec_decode/metrics.py, `SpecDecodingProm`), so `/metrics` alone tells both. Both are
read through the server endpoints' client (`serve.endpoints`).
"""

from __future__ import annotations

from compaction_bench.serve.checkreport import CheckResult
from compaction_bench.serve.profile import Profile, version_tuple


def int_label(config: dict[str, str], key: str) -> int | None:
    value = config.get(key)
    return int(value) if value is not None and value.isdigit() else None


def check_server(profile: Profile, version: str | None, config: dict[str, str],
                 metrics_text: str | None) -> CheckResult:
    """The `server` check: what the engine says about itself against the profile."""
    p = profile
    problems, fixes = [], []
    if version is not None:
        try:
            if version_tuple(version) < version_tuple(p.vllm.minimum):
                problems.append(f"vLLM {version} is older than the profile's minimum "
                                f"{p.vllm.minimum}")
                fixes.append(f"install vLLM {p.vllm.pinned} ({p.vllm.minimum_reason})")
        except ValueError:
            pass  # not a vLLM version string (another server); recorded as it is
    if config.get("enable_prefix_caching") == "False":
        problems.append("prefix caching is off (enable_prefix_caching=False)")
        fixes.append("serve with --enable-prefix-caching (`make serve` does)")
    server_block = int_label(config, "block_size")
    if p.block_size and server_block and server_block != p.block_size:
        problems.append(f"the server hashes in {server_block}-token blocks, the profile says "
                        f"{p.block_size}")
        fixes.append("set engine_args.block_size to the server's")
    want = p.engine_args.prefix_cache_retention_interval
    have = config.get("prefix_cache_retention_interval")
    if want is not None and have is not None and have != str(want):
        problems.append(f"the server retains prefix checkpoints every {have} tokens, the "
                        f"profile says {want}")
        fixes.append("see the retention setting (engine_args.prefix_cache_retention_interval)")
    speculative = bool(metrics_text) and "vllm:spec_decode" in (metrics_text or "")
    if speculative and not p.features.speculative_on:
        problems.append("the server runs speculative decoding (vllm:spec_decode_* metrics) but "
                        "the profile has it off")
        fixes.append("serve with the profile's features, or pass SPEC=1 so it is recorded")
    if config and not speculative and p.features.speculative_on:
        # vLLM registers the spec_decode counters only when a speculative config is set
        # (vllm/v1/spec_decode/metrics.py, SpecDecodingProm)
        problems.append("the profile turns speculative decoding on but the server exports no "
                        "vllm:spec_decode_* metrics")
        fixes.append("start the server with the profile (`make serve SPEC=1`)")
    data = {"version": version, "speculative_metrics": speculative, "cache_config": config}
    summary = (f"vLLM {version or 'unknown'}, block size {config.get('block_size', '?')}, "
               f"prefix caching {config.get('enable_prefix_caching', '?')}, retention "
               f"{config.get('prefix_cache_retention_interval', '?')}, speculative decoding "
               f"{'on' if speculative else 'off'}")
    if problems:
        return CheckResult("server", "fail", "; ".join(problems), "; ".join(fixes), data)
    return CheckResult("server", "pass", summary, data=data)
