"""The editable reasoning of one assistant turn, and the paper's blocks inside it.

Two words, kept apart: a *reasoning block* (DESIGN.md) is the reasoning of one assistant turn; the
second paper (ICLR, Appendix C.2) splits that reasoning into "blocks" of its own, the non-empty
segments separated by a blank line. Here those are *segments*, so neither word is overloaded a
third time (an experiment block is the bench's).

Where the reasoning is (Appendix C.2: the native field where the model has one, else a
`<think>…</think>` span, else the tagged-visible thought): `reasoning_span` takes the turn's
reasoning block as `histories.format.reasoning.block_text` defines it, keeps mini-swe-agent's
`THOUGHT:` label out (protocol, not reasoning) and, where the block holds a `<think>…</think>`
span, narrows it to the inside of the tags. Everything outside the span (the label, text around
the tags, the action) is put back byte for byte by `with_reasoning`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from compaction_bench.histories.format.reasoning import block_text, replace_block, thought_label

SKIP = "[SKIP]"  # what a removed segment becomes (ICLR, Appendix C.3)
SEPARATOR = "\n\n"  # how kept and replaced segments are joined again
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@dataclass(frozen=True)
class Segment:
    """One non-empty segment: its text (stripped of surrounding whitespace) and where that
    text starts and ends in the reasoning it was cut from."""

    text: str
    start: int
    end: int


def split_segments(reasoning: str) -> list[Segment]:
    """The paper's blocks: the non-empty segments of `reasoning` separated by a blank line (a
    line holding only spaces or tabs counts as blank), in order."""
    out: list[Segment] = []
    spans, start = [], 0
    for separator in _BLANK_LINE.finditer(reasoning):
        spans.append((start, separator.start()))
        start = separator.end()
    spans.append((start, len(reasoning)))
    for begin, end in spans:
        piece = reasoning[begin:end]
        stripped = piece.strip()
        if stripped:
            lead = begin + len(piece) - len(piece.lstrip())
            out.append(Segment(stripped, lead, lead + len(stripped)))
    return out


def join_segments(segments: list[Segment], removed: set[int]) -> str:
    """The segments joined by blank lines, those in `removed` (indices) replaced by [SKIP]."""
    return SEPARATOR.join(SKIP if i in removed else s.text for i, s in enumerate(segments))


@dataclass(frozen=True)
class ReasoningSpan:
    """A turn's editable reasoning `text`, with what surrounds it inside the reasoning block
    (`before`: the THOUGHT label or the text up to `<think>`; `after`: from `</think>` on)."""

    before: str
    text: str
    after: str

    @property
    def block(self) -> str:
        return self.before + self.text + self.after


def reasoning_span(message: dict[str, Any], reasoning_mode: str, protocol: str) -> ReasoningSpan:
    """The editable reasoning of an assistant message (module docstring)."""
    block = block_text(message, reasoning_mode, protocol)
    label, body = ("", block) if reasoning_mode == "native" else thought_label(block)
    think = _THINK.search(body)
    if think is None:
        return ReasoningSpan(label, body, "")
    return ReasoningSpan(label + body[:think.start(1)], think.group(1), body[think.end(1):])


def with_reasoning(message: dict[str, Any], span: ReasoningSpan, text: str, reasoning_mode: str,
                   protocol: str) -> dict[str, Any]:
    """A copy of `message` whose editable reasoning is `text`; the message itself when nothing
    changes. An emptied tagged-visible thought keeps its label (protocol) without the space."""
    if text == span.text:
        return message
    before = span.before
    if not text and not span.after:
        before = before.rstrip()  # "THOUGHT: " with nothing after it -> "THOUGHT:"
    return replace_block(message, before + text + span.after, reasoning_mode, protocol)
