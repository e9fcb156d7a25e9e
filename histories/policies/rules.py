"""The second paper's rules for one completed agent step (ICLR, Section 3.2 and Appendix C):
given the step's editable reasoning and the history before it, the reasoning to keep.

- `EntropyRule` (ICLR, and its `step-entropy` control with `conditioned=False`): split into
  segments (non-empty, separated by a blank line); for N >= 2 segments replace the lowest
  floor(0.8 N) by mean predictive entropy with [SKIP] (ties: the earlier segment first); N = 1:
  nothing removed, and nothing is scored. Conditioned: each segment is scored on the full
  history before it, rendered with the proxy model's chat template, then the segments before it
  in the same step; step-only: on the current step's reasoning alone. A scorer input over the
  limit leaves the step as it was (`skipped-scorer-limit`), never truncated; one within the
  limit but past the scorer model's context fails the step (`failed`, the sizes and the fix in
  its error): the arm would otherwise go out unpruned and pass as the paper's policy.
- `DeleteRule` (`delete-all-thinking`, and `keep-latest` for every step but the latest): the
  reasoning removed.
- `RandomRule` (`random-r`): r% of the reasoning's tokens (the proxy model's tokenizer),
  floor(r n / 100) of n, removed at positions drawn without replacement from a generator seeded
  with (seed, message index), so a step's removal is reproducible and recorded.

A rule never sees the step's action, tool result or any later turn: those are not reasoning, and
the rules keep them out of what they edit (`histories.policies.segments`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from compaction_bench.histories.policies.edits import EditOutcome
from compaction_bench.histories.policies.scorer import ProxyScorer, ProxyTokenizer, SegmentScores
from compaction_bench.histories.policies.segments import (
    ReasoningSpan,
    join_segments,
    split_segments,
)

ICLR_RATIO = Fraction(4, 5)  # floor(0.8 N) of N segments, in exact arithmetic
FENCE = "```"


@dataclass(frozen=True)
class Step:
    """One completed step as a rule sees it: its message index, its editable reasoning, and the
    history before it as the policy sends it (earlier steps already edited)."""

    index: int
    span: ReasoningSpan
    before: list[dict[str, Any]]
    reasoning_mode: str
    protocol: str


@dataclass(frozen=True)
class Decision:
    """What a rule decided for one step: the reasoning to keep and what it recorded."""

    text: str
    outcome: EditOutcome
    segments: int | None = None
    removed_segments: list[int] = field(default_factory=list)
    segment_entropy: list[float | None] = field(default_factory=list)
    removed_tokens: int | None = None
    seed: int | None = None
    scores: SegmentScores | None = None
    error: str | None = None


def _tool_text(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ""
    return json.dumps({"name": function.get("name"), "arguments": function.get("arguments")},
                      ensure_ascii=False)


def scorer_messages(before: list[dict[str, Any]], reasoning_mode: str) -> list[dict[str, str]]:
    """The history before a step as plain chat messages for any chat template: native
    reasoning inlined as a `<think>` span in front of the content, tool calls as JSON lines."""
    out = []
    for message in before:
        role = str(message.get("role"))
        if role == "exit":
            continue
        content = str(message.get("content") or "")
        if role == "assistant":
            if reasoning_mode == "native" and message.get("reasoning"):
                content = f"<think>\n{message['reasoning']}\n</think>\n\n{content}"
            calls = [_tool_text(c) for c in message.get("tool_calls") or []]
            content = "\n".join([content, *[c for c in calls if c]]).strip("\n")
        out.append({"role": role, "content": content})
    return out


def render_context(tokenizer: Any, before: list[dict[str, Any]], span: ReasoningSpan,
                   reasoning_mode: str) -> str:
    """The text the conditioned scorer reads before a step's reasoning: the history through
    the proxy's chat template with the assistant turn opened, then what opens the reasoning
    (`<think>` in native mode, the THOUGHT label or the text before `<think>` otherwise). A
    template that refuses the `tool` role gets it as `user`; a tokenizer without a template
    gets plain `role: content` paragraphs."""
    messages = scorer_messages(before, reasoning_mode)
    opener = "<think>\n" if reasoning_mode == "native" else span.before
    attempts = [messages, [{**m, "role": "user" if m["role"] == "tool" else m["role"]}
                           for m in messages]]
    if getattr(tokenizer, "chat_template", None):
        for attempt in attempts:
            try:
                text = tokenizer.apply_chat_template(attempt, tokenize=False,
                                                     add_generation_prompt=True)
            except Exception:  # a template's own refusal (role order, unknown role): next form
                continue
            if isinstance(text, str):
                return text + opener
    plain = "".join(f"{m['role']}: {m['content']}\n\n" for m in messages)
    return f"{plain}assistant: {opener}"


class EntropyRule:
    """ICLR's pruning (conditioned) or its step-only control (module docstring)."""

    def __init__(self, scorer: ProxyScorer, *, conditioned: bool = True,
                 ratio: Fraction = ICLR_RATIO) -> None:
        self.scorer = scorer
        self.conditioned = conditioned
        self.ratio = ratio
        self.rule = "entropy" if conditioned else "step-entropy"

    def decide(self, step: Step) -> Decision:
        segments = split_segments(step.span.text)
        if not segments:
            return Decision(step.span.text, "empty", segments=0)
        if len(segments) == 1:
            return Decision(step.span.text, "single-segment", segments=1)
        if self.conditioned:
            prefix = render_context(self.scorer.tokenizer.tokenizer, step.before, step.span,
                                    step.reasoning_mode)
            scores = self.scorer.score(prefix, step.span.text, segments)
        else:  # the current step alone: its reasoning after the tokenizer's own BOS, if any
            scores = self.scorer.score("", step.span.text, segments, special=True)
        if scores.skipped is not None:
            return Decision(step.span.text, "failed" if scores.over_context else
                            "skipped-scorer-limit", segments=len(segments), scores=scores,
                            error=scores.skipped)
        count = len(segments) * self.ratio.numerator // self.ratio.denominator
        ranked = sorted(range(len(segments)), key=lambda i: (
            scores.entropy[i] is None, scores.entropy[i] or 0.0, i))
        removed = sorted(ranked[:count])
        return Decision(join_segments(segments, set(removed)), "pruned",
                        segments=len(segments), removed_segments=removed,
                        segment_entropy=list(scores.entropy), scores=scores)


class DeleteRule:
    """The reasoning removed (delete-all-thinking; keep-latest for all but the latest step)."""

    def __init__(self, rule: str = "delete-all-thinking") -> None:
        self.rule = rule

    def decide(self, step: Step) -> Decision:
        if not step.span.text.strip():
            return Decision(step.span.text, "empty")
        return Decision("", "deleted")


class RandomRule:
    """r% of the reasoning's tokens removed at seeded random positions (module docstring)."""

    def __init__(self, percent: int, tokenizer: ProxyTokenizer, *, seed: int) -> None:
        if not 0 < percent <= 100:
            raise ValueError(f"random-r removes r% of tokens: r must be 1..100, got {percent}")
        self.percent = percent
        self.tokenizer = tokenizer
        self.seed = seed
        self.rule = "random"

    def decide(self, step: Step) -> Decision:
        text = step.span.text
        if not text.strip():
            return Decision(text, "empty", seed=self.seed)
        _, spans = self.tokenizer.offsets(text)
        count = len(spans) * self.percent // 100
        if count == 0:
            return Decision(text, "too-short", removed_tokens=0, seed=self.seed)
        rng = np.random.default_rng([self.seed, step.index])
        drop = {int(i) for i in rng.choice(len(spans), size=count, replace=False)}
        kept, cursor = [], 0
        for index, (start, end) in enumerate(spans):
            if index in drop:
                kept.append(text[cursor:start])
                cursor = max(cursor, end)
        kept.append(text[cursor:])
        new = "".join(kept)
        if FENCE in new and FENCE not in text:  # joined backticks would become a second action
            return Decision(text, "failed", removed_tokens=0, seed=self.seed,
                            error="removing these tokens would create a code fence")
        return Decision(new, "tokens-removed", removed_tokens=count, seed=self.seed)
