"""The second paper's rules on hand-made steps where the right output is known, with the real
proxy scorer (embedded SmolLM2, in-process on the CPU) and its real tokenizer."""

from __future__ import annotations

import pytest

from compaction_bench.histories.policies.rules import (
    DeleteRule,
    EntropyRule,
    RandomRule,
    Step,
    render_context,
)
from compaction_bench.histories.policies.scorer import ProxyScorer, ProxyTokenizer, ScorerConfig
from compaction_bench.histories.policies.segments import SKIP, ReasoningSpan, split_segments

# every test here scores or tokenizes with the converted proxy model (`proxy_model`): e2e
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("proxy_model")]

# Measured with this scorer: a counting run is predictable (mean entropy about 0.8 nats), made-up
# words are not (about 5 nats), so which one ICLR removes is known.
GIBBERISH = "Qx7 vorpal zint 93 plumb kest? Yarrow 12 fff obloquy."
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14"
PLAIN = "The median of an even list is the mean of the two middle values."
LETTERS = "A, B, C, D, E, F, G, H, I, J, K, L"
FACT = ("The quarterly audit flagged invoice 4471 from Brennan Logistics for a duplicated "
        "freight surcharge of 318 dollars.")
NEXT = "I should open the ledger for March and compare totals."


def step(text: str, before: list[dict[str, str]] | None = None) -> Step:
    return Step(index=len(before or []), span=ReasoningSpan("", text, ""),
                before=before or [{"role": "user", "content": "Fix the median."}],
                reasoning_mode="native", protocol="tool_calls")


def test_lowest_entropy_segments_are_skipped_floor_of_four_fifths(scorer: ProxyScorer) -> None:
    rule = EntropyRule(scorer)
    two = rule.decide(step(f"{GIBBERISH}\n\n{COUNTING}"))
    assert two.outcome == "pruned" and two.removed_segments == [1]  # floor(1.6) = 1
    assert two.text == f"{GIBBERISH}\n\n{SKIP}"
    entropy = [e for e in two.segment_entropy if e is not None]
    assert len(entropy) == 2 and entropy[1] < entropy[0]
    three = rule.decide(step(f"{PLAIN}\n\n{GIBBERISH}\n\n{LETTERS}"))
    assert len(three.removed_segments) == 2 and 1 not in three.removed_segments  # floor(2.4)
    assert three.text.split("\n\n")[1] == GIBBERISH
    five = rule.decide(step("\n\n".join([GIBBERISH, COUNTING, PLAIN, LETTERS, NEXT])))
    assert len(five.removed_segments) == 4  # floor(4.0)
    kept = [i for i in range(5) if i not in five.removed_segments]
    assert all(five.segment_entropy[kept[0]] >= five.segment_entropy[i]  # type: ignore[operator]
               for i in five.removed_segments)
    assert five.scores is not None and five.scores.input_tokens > 0 and five.scores.scorer_s > 0


def test_a_single_segment_is_kept_without_scoring(scorer: ProxyScorer) -> None:
    one = EntropyRule(scorer).decide(step(f"  {GIBBERISH}\nno blank line here  "))
    assert (one.outcome, one.segments, one.scores) == ("single-segment", 1, None)
    assert one.text == f"  {GIBBERISH}\nno blank line here  "
    assert EntropyRule(scorer).decide(step(" \n\n ")).outcome == "empty"


def test_context_conditioning_changes_which_segment_is_skipped(scorer: ProxyScorer) -> None:
    """The step repeats the user's message and adds a plan: with the history in view the copy
    is predictable and goes; on the step alone (the paper's control) the plan goes."""
    before = [{"role": "user", "content": FACT}]
    text = f"{FACT}\n\n{NEXT}"
    full = EntropyRule(scorer).decide(step(text, before))
    alone = EntropyRule(scorer, conditioned=False).decide(step(text, before))
    assert full.removed_segments == [0] and alone.removed_segments == [1]
    assert full.segment_entropy[0] < alone.segment_entropy[0]  # type: ignore[operator]


def test_a_scorer_input_over_the_limit_skips_the_step_untruncated() -> None:
    tight = ProxyScorer.shared(ScorerConfig(model="embedded:smollm2-135m-instruct",
                                            max_input_tokens=40))
    assert tight.limit == 40
    long_history = [{"role": "user", "content": FACT * 3}]
    text = f"{GIBBERISH}\n\n{COUNTING}"
    got = EntropyRule(tight).decide(step(text, long_history))
    assert got.outcome == "skipped-scorer-limit" and got.text == text
    assert got.error is not None and "exceeds the limit of 40" in got.error
    assert got.scores is not None and got.scores.input_tokens > 40


def test_a_history_past_the_scorer_context_fails_the_step_naming_sizes_and_fix(
        scorer: ProxyScorer) -> None:
    """Within the paper's 42K limit but past SmolLM2's 8,192-token context: the paper's scorer
    would have scored this step, this one cannot. It used to be skipped like a step over the
    paper's limit, so the arm went out unpruned and passed."""
    long_history = [{"role": "user", "content": f"{FACT} " * 400}]  # about 10K tokens
    text = f"{GIBBERISH}\n\n{COUNTING}"
    got = EntropyRule(scorer).decide(step(text, long_history))
    assert got.scores is not None and 8192 < got.scores.input_tokens <= 42_000
    assert got.outcome == "failed" and got.text == text
    assert got.error is not None and "\n" not in got.error
    assert f"scorer input of {got.scores.input_tokens} tokens" in got.error
    assert "context of 8192 tokens" in got.error and "SCORER=" in got.error
    # past the arm's own limit as well: the paper's skip, not a failure
    tight = ProxyScorer.shared(ScorerConfig(model="embedded:smollm2-135m-instruct",
                                            max_input_tokens=9000))
    assert EntropyRule(tight).decide(step(text, long_history)).outcome == "skipped-scorer-limit"


def test_the_scorer_limit_never_exceeds_the_model_context(scorer: ProxyScorer) -> None:
    assert scorer.config.max_input_tokens == 42_000  # the paper's limit
    assert scorer.limit == scorer.model_limit == 8192  # SmolLM2's max_position_embeddings


def test_random_removal_takes_r_percent_of_tokens_with_a_fixed_seed(scorer: ProxyScorer) -> None:
    tokenizer = ProxyTokenizer.shared(scorer.config.model)
    text = "I need to see which files the dataset contains before I change median."
    n = tokenizer.count(text)
    got = RandomRule(30, tokenizer, seed=7).decide(step(text))
    assert got.outcome == "tokens-removed" and got.removed_tokens == n * 30 // 100 == 4
    # seed 7, message index 1: " dataset", " contains", " I" and " median" go
    assert got.text == "I need to see which files the before change."
    assert RandomRule(30, tokenizer, seed=7).decide(step(text)).text == got.text
    assert RandomRule(30, tokenizer, seed=8).decide(step(text)).text != got.text
    assert RandomRule(30, tokenizer, seed=7).decide(step("Hi")).outcome == "too-short"
    assert RandomRule(100, tokenizer, seed=0).decide(step(text)).text.strip() == ""


def test_delete_removes_the_reasoning() -> None:
    assert DeleteRule().decide(step("a\n\nb")).text == ""
    assert DeleteRule().decide(step("  ")).outcome == "empty"


def test_the_history_is_rendered_with_the_proxy_chat_template(scorer: ProxyScorer) -> None:
    before = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
              {"role": "assistant", "content": "", "reasoning": "R",
               "tool_calls": [{"id": "c", "type": "function",
                               "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
              {"role": "tool", "tool_call_id": "c", "content": "T"}]
    text = render_context(scorer.tokenizer.tokenizer, before, ReasoningSpan("", "x", ""),
                          "native")
    assert text.startswith("<|im_start|>system\nS<|im_end|>")
    assert "<think>\nR\n</think>" in text and '"arguments": "{\\"command\\": \\"ls\\"}"' in text
    assert "<|im_start|>tool\nT<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    assert split_segments(text)  # plain text, nothing lost to the template
