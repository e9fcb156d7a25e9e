"""Model shapes against the parameter counts their publishers state, and the work of a step
on a hand-sized model."""

from __future__ import annotations

import pytest

from compaction_bench.kernels.shapes import (
    ModelShape,
    ShapeError,
    active_params,
    decode_work,
    gemms,
    kv_bytes_per_token,
    prefill_work,
    shape_for_profile,
    total_params,
)


@pytest.mark.parametrize(("profile", "total", "active", "active_counts_embedding"), [
    ("cpu-tiny", 134.5e6, None, False),  # SmolLM2-135M: 134,515,008 parameters (model card)
    ("cpu-gemma-compressor", 268e6, None, False),  # Gemma 3 270M: 170M embedding + 100M blocks
    # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated (input embedding included)
    ("h100-qwen3-30b-a3b-thinking", 30.5e9, 3.3e9, True),
    # gpt-oss-120b model card: 116.8B total, 5.13B active (unembedding, not the embedding)
    ("h200-gpt-oss-120b", 116.8e9, 5.13e9, False),
])
def test_shapes_reproduce_published_parameter_counts(profile: str, total: float,
                                                     active: float | None,
                                                     active_counts_embedding: bool) -> None:
    shape = shape_for_profile(profile)
    assert total_params(shape) == pytest.approx(total, rel=0.02)
    if active is not None:
        # ours: the LM head once; publishers differ on whether the input embedding counts
        embedding = shape.hidden * shape.vocab if active_counts_embedding else 0
        assert active_params(shape) + embedding == pytest.approx(active, rel=0.03)


def test_smollm2_weight_shapes_are_its_config() -> None:
    shapes = {g.name: (g.k, g.n) for g in gemms(shape_for_profile("cpu-tiny"))}
    assert shapes == {"qkv_proj": (576, 960), "o_proj": (576, 576),
                      "mlp_gate_up": (576, 3072), "mlp_down": (1536, 576),
                      "lm_head": (576, 49152)}


def test_deepseek_v4_has_its_issue_shapes_and_refuses_attention_figures() -> None:
    shape = shape_for_profile("b300-deepseek-v4-flash-nvfp4")
    assert {g.name: (g.k, g.n) for g in gemms(shape)} == {
        "router": (4096, 256), "expert_gate_up": (4096, 4096), "expert_down": (2048, 4096)}
    assert (shape.layers, shape.routed_experts, shape.shared_experts, shape.top_k) == (
        43, 256, 1, 6)
    with pytest.raises(ShapeError, match="attention is 'unknown'"):
        kv_bytes_per_token(shape)
    with pytest.raises(ShapeError, match="no model shape for profile 'nope'"):
        shape_for_profile("nope")


def test_step_work_of_a_hand_sized_model() -> None:
    tiny = ModelShape(name="tiny", source="test", layers=2, hidden=4, vocab=10, heads=2,
                      kv_heads=1, head_dim=2, dense_ffn=8, weight_bytes=2.0, kv_bytes=2.0)
    # per layer: qkv 4x(4+2+2) + o 4x4 + mlp 3x4x8 = 32 + 16 + 96 = 144 weights
    per_token_linear = 2 * 2 * 144
    head = 2 * 4 * 10
    kv_per_token = 2 * 1 * 2 * 2.0 * 2  # K and V, 1 head of 2, 2 bytes, 2 layers = 16 bytes
    assert kv_bytes_per_token(tiny) == kv_per_token
    work = decode_work(tiny, batch=3, mean_context=5)
    attention = 3 * 4 * 2 * 2 * (2 * 5)  # batch x 4 x heads x head_dim x (layers x context)
    assert work.flops == 3 * (per_token_linear + head) + attention
    weights = (2 * 144 + 4 * 10) * 2.0
    assert work.bytes == weights + 3 * 5 * kv_per_token + 3 * kv_per_token
    pre = prefill_work(tiny, uncached=4, cached=6)
    # token i of 4 attends 6 + i keys: 4*6 + 4*5/2 = 34 pairs per layer
    assert pre.flops == 4 * per_token_linear + head + 4 * 2 * 2 * (2 * 34)
