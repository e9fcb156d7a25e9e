"""Online write-back: each completed step decided once, before the next request, conditioned on
the history as already edited, the decision kept for every later request; nothing but the
reasoning changes and the agent's own list is never touched."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.histories.compaction.ledger import Ledger, read_ledger
from compaction_bench.histories.format.history import History
from compaction_bench.histories.format.invariant import compare_bodies
from compaction_bench.histories.policies.rules import (
    Decision,
    DeleteRule,
    EntropyRule,
    Step,
    render_context,
)
from compaction_bench.histories.policies.scorer import ProxyScorer
from compaction_bench.histories.policies.segments import SKIP, reasoning_span
from compaction_bench.histories.policies.stepwise import StepwisePolicy

GIBBERISH = "Qx7 vorpal zint 93 plumb kest? Yarrow 12 fff obloquy."
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14"


def with_pending(history: History) -> list[dict[str, Any]]:
    assert history.fork is not None
    return [*history.messages, {"role": "tool", "tool_call_id": history.fork.action[
        "tool_call_id"], "content": history.fork.pending_result}]


@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_each_step_is_decided_once_on_the_edited_history(
        scorer: ProxyScorer, make_native: Callable[..., History], tmp_path: Path) -> None:
    history = make_native(f"{GIBBERISH}\n\n{COUNTING}", f"{COUNTING}\n\n{GIBBERISH}")
    ledger = Ledger(tmp_path / "ledger.jsonl")
    policy = StepwisePolicy(EntropyRule(scorer), name="entropy", reasoning_mode="native",
                            protocol="tool_calls", ledger=ledger, context={"phase": "test"},
                            tokenizer=scorer.tokenizer)
    messages = with_pending(history)
    snapshot = copy.deepcopy(messages)
    sent = policy.prepare(messages)
    assert messages == snapshot  # the agent's list is untouched
    assert [m.get("reasoning") for m in sent if m["role"] == "assistant"] == [
        f"{GIBBERISH}\n\n{SKIP}", f"{SKIP}\n\n{GIBBERISH}"]
    compare_bodies({"messages": messages}, {"messages": sent}, arm_name="entropy", task="t",
                   reasoning_mode="native", protocol="tool_calls")  # only reasoning differs
    # the second step was scored on the history with the first already pruned
    first, second = policy.edits
    span = reasoning_span(messages[4], "native", "tool_calls")
    edited = render_context(scorer.tokenizer.tokenizer, sent[:4], span, "native")
    raw = render_context(scorer.tokenizer.tokenizer, messages[:4], span, "native")
    assert second.scorer_tokens == scorer.tokenizer.count(edited + span.text)
    assert second.scorer_tokens < scorer.tokenizer.count(raw + span.text)
    # a later request: only the new step is decided, earlier decisions are the same objects
    messages += [{"role": "assistant", "content": "", "reasoning": "one more segment only",
                  "tool_calls": [{"id": "c9", "type": "function",
                                  "function": {"name": "bash", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c9", "content": "OBS"}]
    again = policy.prepare(messages)
    assert len(policy.edits) == 3 and again[2] is sent[2] and again[4] is sent[4]
    assert [c["new_steps"] for c in policy.calls] == [2, 1]
    assert [e.outcome for e in policy.edits] == ["pruned", "pruned", "single-segment"]
    lines = read_ledger(tmp_path / "ledger.jsonl")
    assert [line["kind"] for line in lines] == ["policy"] * 3
    assert lines[0]["removed_segments"] == [1] and lines[0]["scorer_s"] > 0
    assert lines[0]["device"] == "cpu" and lines[0]["context"]["phase"] == "test"
    assert first.words_in > first.words_out and first.tokens_in > first.tokens_out  # type: ignore[operator]
    assert policy.not_applied() is None


def test_keep_latest_defers_the_latest_step_then_deletes_it(
        make_native: Callable[..., History]) -> None:
    history = make_native("first thoughts", "second thoughts")
    policy = StepwisePolicy(DeleteRule("keep-latest"), name="keep-latest",
                            reasoning_mode="native", protocol="tool_calls", defer_latest=True)
    messages = with_pending(history)
    sent = policy.prepare(messages)
    assert [m.get("reasoning") for m in sent if m["role"] == "assistant"] == [
        "", "second thoughts"]
    assert policy.decided == [2]
    messages += [{"role": "assistant", "content": "", "reasoning": "third",
                  "tool_calls": [{"id": "c9", "type": "function",
                                  "function": {"name": "bash", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c9", "content": "OBS"}]
    later = policy.prepare(messages)
    assert [m.get("reasoning") for m in later if m["role"] == "assistant"] == [
        "", "", "third"]
    assert [e.outcome for e in policy.edits] == ["deleted", "deleted"]


def test_keep_latest_waits_through_a_format_error_turn(
        make_native: Callable[..., History]) -> None:
    # mini-swe-agent answers an off-protocol reply with a user message and keeps no assistant
    # step, so the latest step stays the latest and is not decided yet (the live policy test
    # counts decisions by this rule)
    history = make_native("first thoughts", "second thoughts")
    policy = StepwisePolicy(DeleteRule("keep-latest"), name="keep-latest",
                            reasoning_mode="native", protocol="tool_calls", defer_latest=True)
    messages = with_pending(history)
    policy.prepare(messages)
    messages.append({"role": "user", "content": "Format error: call exactly one tool."})
    sent = policy.prepare(messages)
    assert [m.get("reasoning") for m in sent if m["role"] == "assistant"] == [
        "", "second thoughts"]
    assert policy.decided == [2] and [c["new_steps"] for c in policy.calls] == [1, 0]


def test_settled_steps_pass_through(make_native: Callable[..., History]) -> None:
    history = make_native("first thoughts", "second thoughts")
    policy = StepwisePolicy(DeleteRule(), name="delete-all-thinking", reasoning_mode="native",
                            protocol="tool_calls", settled=[2, 4])
    messages = with_pending(history)
    assert policy.prepare(messages) == messages and policy.edits == []


class Raising:
    """A rule whose decision raises (what a broken scorer does), to see the step kept."""

    rule = "entropy"

    def decide(self, step: Step) -> Decision:
        raise RuntimeError("scorer went away")


def test_a_failing_rule_keeps_the_step_and_the_policy_reports_it(
        make_native: Callable[..., History]) -> None:
    history = make_native("a\n\nb")
    policy = StepwisePolicy(Raising(), name="entropy", reasoning_mode="native",
                            protocol="tool_calls")
    messages = with_pending(history)
    assert json.dumps(policy.prepare(messages)) == json.dumps(messages)
    assert policy.edits[0].outcome == "failed"
    assert policy.not_applied() == ("policy entropy could not apply: its entropy rule failed "
                                    "on 1 of 1 steps (first: RuntimeError: scorer went away)")
