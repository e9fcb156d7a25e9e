"""Recorded histories become background turn plans."""

from __future__ import annotations

import pytest

from compaction_bench.common.paths import histories_root
from compaction_bench.histories.format.history import load_history
from compaction_bench.loadgen.background import default_history_paths
from compaction_bench.loadgen.schedule import (
    load_schedules,
    schedule_history,
)
from compaction_bench.transport.wire import ReplayOptions

ROOT = histories_root()
VACCINE = next(p for p in default_history_paths(ROOT) if "vaccine" in str(p))


def test_plans_follow_the_recorded_turns() -> None:
    history = load_history(VACCINE)
    plan = schedule_history(history, "vaccine", ReplayOptions(), model="target",
                        max_model_len=8192)
    full = history.messages + history.continuation
    assistants = [m for m in full if m["role"] == "assistant"]
    assert len(plan) == len(assistants)
    for turn, message in zip(plan, assistants, strict=True):
        usage = (message.get("extra") or {}).get("usage")
        if usage:
            assert turn.max_tokens == usage["completion_tokens"]
            assert turn.max_tokens_source == "recorded"
            assert turn.planned_s == message["extra"]["wall_seconds"]
        else:
            assert turn.max_tokens_source == "estimated" and turn.max_tokens > 0
        assert turn.payload["ignore_eos"] is True and turn.payload["model"] == "target"
        for wire in turn.payload["messages"]:
            assert "extra" not in wire and "reasoning" not in wire
    # request k holds every message before the k-th assistant turn
    assert [len(t.payload["messages"]) for t in plan] == [
        i for i, m in enumerate(full) if m["role"] == "assistant"]


def test_a_cap_shortens_the_long_turns_only_and_says_so() -> None:
    history = load_history(VACCINE)
    full = schedule_history(history, "vaccine", ReplayOptions(), model="target",
                            max_model_len=8192)
    capped = schedule_history(history, "vaccine", ReplayOptions(max_completion_tokens=128),
                              model="target", max_model_len=8192)
    assert any(t.max_tokens > 128 for t in full)  # the recorded turns include longer ones
    for was, now in zip(full, capped, strict=True):
        assert now.max_tokens == min(was.max_tokens, 128)
        assert now.payload["max_tokens"] == now.max_tokens
        assert now.max_tokens_source == ("cap" if was.max_tokens > 128
                                         else was.max_tokens_source)


def test_inline_mode_puts_reasoning_and_tools_in_text() -> None:
    options = ReplayOptions(reasoning="inline", tool_calls="inline")
    plan = schedule_history(load_history(VACCINE), "v", options, model="target", max_model_len=8192)
    last = plan[-1].payload["messages"]
    assert all(m["role"] in ("system", "user", "assistant") for m in last)
    assistant = next(m for m in last if m["role"] == "assistant")
    assert assistant["content"].startswith("<think>") and "<tool_call>" in assistant["content"]
    assert "tool_calls" not in assistant


def test_truncation_keeps_head_and_tool_pairing() -> None:
    plans = load_schedules(default_history_paths(ROOT), ReplayOptions(), model="target",
                       max_model_len=1800)
    truncated = [t for plan in plans for t in plan if t.dropped_messages]
    assert truncated, "a 1800-token window must truncate some study turn"
    for turn in truncated:
        messages = turn.payload["messages"]
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
        call_ids: set[str] = set()
        for m in messages:
            call_ids.update(c["id"] for c in m.get("tool_calls") or ())
            if m["role"] == "tool":
                assert m["tool_call_id"] in call_ids
        assert turn.prompt_tokens_estimate + turn.max_tokens <= 1800


def test_turns_without_recorded_time_are_paced_by_the_measured_service_time() -> None:
    history = load_history(next(p for p in default_history_paths(ROOT) if "vaccine" in str(p)))
    options = ReplayOptions(measured_ttft_s=0.5, measured_tokens_per_s=50.0)
    turns = schedule_history(history, "h", options, model="target", max_model_len=8192)
    sources = {t.planned_source for t in turns}
    assert sources == {"recorded", "measured"}  # the study recorded only the postfork turns
    for turn in turns:
        if turn.planned_source == "measured":
            assert turn.planned_s == pytest.approx(0.5 + turn.max_tokens / 50.0)
    assert all(p.name == "clean.json" and p.parent.parent.name == "study"
               for p in default_history_paths(ROOT))  # never the experimental task's arms
