"""The proxy scorer's entropy is the predictive entropy of the full next-token distribution at
each token of a segment, averaged: checked against the model's full logits computed directly,
in float64, without the scorer's slicing (`logits_to_keep`) or the kernels' entropy."""

from __future__ import annotations

import torch

from histories.policies.scorer import ProxyScorer, ProxyTokenizer, ScorerConfig
from histories.policies.segments import split_segments


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
