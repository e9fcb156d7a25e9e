"""The proxy scorer's entropy is the predictive entropy of the full next-token distribution at
each token of a segment, averaged: checked against the model's full logits computed directly,
in float64, without the scorer's slicing (`logits_to_keep`) or the kernels' entropy. A local
model folder (a GPU profile's kind of scorer) scores the same on CPU and, with the fused Triton
kernel, on CUDA where a GPU is present."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compaction_bench.histories.policies.scorer import ProxyScorer, ProxyTokenizer, ScorerConfig
from compaction_bench.histories.policies.segments import split_segments

# every test here scores or tokenizes with the converted proxy model (`proxy_model`): e2e
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("proxy_model")]


def test_segment_means_match_full_logits_in_float64(scorer: ProxyScorer) -> None:
    prefix = "<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n"
    text = "I will run ls first.\n\nThen I read stats_utils.py and its test."
    segments = split_segments(text)
    got = scorer.score(prefix, text, segments)
    ids, spans = scorer.tokenizer.offsets(prefix + text)
    with torch.inference_mode():
        logits = scorer.model(input_ids=torch.tensor([ids])).logits[0].double()
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    for index, segment in enumerate(segments):
        # token t belongs to the segment holding its last character; position t - 1 predicts it
        mine = [entropy[t - 1].item() for t, (a, b) in enumerate(spans)
                if b > a and segment.start <= b - 1 - len(prefix) < segment.end]
        assert got.tokens[index] == len(mine) > 0
        assert abs(got.entropy[index] - sum(mine) / len(mine)) < 1e-3  # type: ignore[operator]
    assert got.input_tokens == len(ids) and got.device == "cpu" and got.skipped is None


def test_one_scorer_per_configuration_and_what_it_records(scorer: ProxyScorer) -> None:
    assert ProxyScorer.shared(ScorerConfig(model="embedded:smollm2-135m-instruct")) is scorer
    described = scorer.describe()
    assert described["device"] == "cpu" and described["dtype"] == "float32"
    assert described["entropy"] == "torch-reference"  # the fused kernel runs on CUDA only
    assert described["limit_tokens"] == 8192 and described["config_sha256"]
    assert ProxyTokenizer.shared("embedded:smollm2-135m-instruct") is scorer.tokenizer


def tiny_model(folder: Path) -> Path:
    """A two-layer Llama with random weights and SmolLM2's tokenizer, saved as a local folder:
    the shape of a GPU profile's scorer (a Hugging Face folder), built here without a download."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    source = ProxyTokenizer.shared("embedded:smollm2-135m-instruct")
    config = LlamaConfig(vocab_size=len(source.tokenizer), hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(folder)
    source.tokenizer.save_pretrained(folder)
    return folder


TEXT = "first segment here\n\nsecond one, a little longer than the first"


def test_a_local_model_folder_scores_on_cpu(tmp_path: Path) -> None:
    folder = tiny_model(tmp_path / "tiny")
    cpu = ProxyScorer.shared(ScorerConfig(model=str(folder), device="cpu"))
    assert cpu.limit == 512 and cpu.entropy_implementation() == "torch-reference"
    on_cpu = cpu.score("", TEXT, split_segments(TEXT), special=True)
    assert on_cpu.device == "cpu" and len(on_cpu.entropy) == 2
    assert all(e is not None and e > 0 for e in on_cpu.entropy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused Triton kernel needs CUDA")
def test_a_local_model_folder_scores_on_cuda_as_on_cpu(tmp_path: Path) -> None:
    folder = tiny_model(tmp_path / "tiny")
    segments = split_segments(TEXT)
    on_cpu = ProxyScorer.shared(ScorerConfig(model=str(folder), device="cpu")).score(
        "", TEXT, segments, special=True)
    cuda = ProxyScorer.shared(ScorerConfig(model=str(folder), device="cuda", dtype="float32"))
    assert cuda.entropy_implementation() == "fused-triton"
    on_cuda = cuda.score("", TEXT, segments, special=True)
    assert on_cuda.device == "cuda" and on_cuda.tokens == on_cpu.tokens
    for a, b in zip(on_cpu.entropy, on_cuda.entropy, strict=True):
        assert a is not None and b is not None and abs(a - b) < 1e-3
