"""The paper's blocks (segments) and where the editable reasoning of a turn is."""

from __future__ import annotations

from compaction_bench.histories.policies.segments import (
    SKIP,
    join_segments,
    reasoning_span,
    split_segments,
    with_reasoning,
)


def test_segments_are_non_empty_pieces_between_blank_lines() -> None:
    text = "\n\nFirst idea.\nstill first.\n\n  \n\nSecond.\n \t\nThird  \n\n\n"
    segments = split_segments(text)
    assert [s.text for s in segments] == ["First idea.\nstill first.", "Second.", "Third"]
    assert all(text[s.start:s.end] == s.text for s in segments)
    assert split_segments("one line only") == split_segments("one line only\n")[:1]
    assert len(split_segments("one line only")) == 1
    assert split_segments("   \n\n \n") == []


def test_removed_segments_become_skip_and_the_rest_stay_in_order() -> None:
    segments = split_segments("a\n\nb\n\nc\n\nd")
    assert join_segments(segments, {0, 2}) == f"{SKIP}\n\nb\n\n{SKIP}\n\nd"
    assert join_segments(segments, set()) == "a\n\nb\n\nc\n\nd"


def test_native_reasoning_is_the_field_and_the_rest_is_kept() -> None:
    message = {"role": "assistant", "content": "", "reasoning": "r1\n\nr2",
               "tool_calls": [{"id": "c", "type": "function",
                               "function": {"name": "bash", "arguments": "{}"}}]}
    span = reasoning_span(message, "native", "tool_calls")
    assert (span.before, span.text, span.after) == ("", "r1\n\nr2", "")
    sent = with_reasoning(message, span, "r2", "native", "tool_calls")
    assert sent["reasoning"] == "r2" and sent["tool_calls"] == message["tool_calls"]
    assert message["reasoning"] == "r1\n\nr2"  # not mutated
    assert with_reasoning(message, span, span.text, "native", "tool_calls") is message


def test_tagged_visible_thought_keeps_its_label_and_action() -> None:
    message = {"role": "assistant",
               "content": "THOUGHT: look first\n\nthen fix\n\n```bash\nls\n```"}
    span = reasoning_span(message, "tagged-visible", "text")
    assert (span.before, span.text) == ("THOUGHT: ", "look first\n\nthen fix")
    pruned = with_reasoning(message, span, f"{SKIP}\n\nthen fix", "tagged-visible", "text")
    assert pruned["content"] == f"THOUGHT: {SKIP}\n\nthen fix\n\n```bash\nls\n```"
    emptied = with_reasoning(message, span, "", "tagged-visible", "text")
    assert emptied["content"] == "THOUGHT:\n\n```bash\nls\n```"


def test_a_think_span_is_the_reasoning_and_the_visible_rest_stays() -> None:
    message = {"role": "assistant", "content": "<think>plan a\n\nplan b</think>I will list.",
               "tool_calls": [{"id": "c", "type": "function",
                               "function": {"name": "bash", "arguments": "{}"}}]}
    span = reasoning_span(message, "tagged-visible", "tool_calls")
    assert (span.before, span.text, span.after) == ("<think>", "plan a\n\nplan b",
                                                    "</think>I will list.")
    sent = with_reasoning(message, span, "", "tagged-visible", "tool_calls")
    assert sent["content"] == "<think></think>I will list."
