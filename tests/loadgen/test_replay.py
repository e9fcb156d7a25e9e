"""Replay of recorded continuations (loadgen/replay.py): plans from the shipped study histories,
the reasoning-only invariant on wire bodies, and a replay against the fake engine in a thread
(its replies are exactly `max_tokens` long, so forced lengths are known)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from compaction_bench.common.paths import histories_root
from compaction_bench.histories.format.history import History, load_history
from compaction_bench.histories.format.invariant import InvariantError
from compaction_bench.loadgen.fakeserver import FakeConfig
from compaction_bench.loadgen.replay import (
    REPLAYED,
    ReplayError,
    ReplaySettings,
    compare_wire,
    first_body,
    history_only_plan,
    recorded_plan,
    replay,
    turn_body,
)
from compaction_bench.transport.wire import ReplayOptions

RECORD = "deepseek-v4-flash__atcoder-abc400_b__rep-01__seed-412000"
INLINE = ReplayOptions(reasoning="inline", tool_calls="inline")


def branch(arm: str) -> History:
    return load_history(histories_root() / "study" / RECORD / f"{arm}.json")


@pytest.fixture
def fake_api(fake_in_thread: Callable[[FakeConfig], AbstractContextManager[str]]) -> Iterator[str]:
    """The fake engine in a thread (its replies are `max_tokens` tokens long)."""
    with fake_in_thread(FakeConfig(ttft_ms=5, itl_ms=0.2)) as url:
        yield url


def test_a_recorded_plan_forces_every_turns_recorded_length() -> None:
    clean = branch("clean")
    plan = recorded_plan(clean, RECORD, "clean")
    usages = [m["extra"]["usage"] for m in clean.continuation if m.get("role") == "assistant"]
    assert [t.completion_tokens for t in plan.turns] == [u["completion_tokens"] for u in usages]
    assert [t.recorded_prompt_tokens for t in plan.turns] == [u["prompt_tokens"] for u in usages]
    # turn k sends everything the recorded agent had before its k-th postfork turn
    full = [*clean.messages, *clean.continuation]
    assert list(plan.turns[0].history) == full[:len(clean.messages) + 1]
    assert plan.continuation == "recorded" and plan.model == "deepseek/deepseek-v4-flash"


def test_a_history_only_plan_is_the_compacted_history_with_cleans_turns() -> None:
    clean, external = branch("clean"), branch("external")
    plan = history_only_plan(external, clean, RECORD, "external-history")
    own = recorded_plan(clean, RECORD, "clean")
    assert [t.completion_tokens for t in plan.turns] == [t.completion_tokens for t in own.turns]
    for mine, reference in zip(plan.turns, own.turns, strict=True):
        # the prefork part is the compacted one, the postfork part clean's own
        assert list(mine.history[:len(external.messages)]) == list(external.messages)
        assert mine.history[len(external.messages):] == reference.history[len(clean.messages):]
        assert mine.recorded_prompt_tokens is None  # never recorded: the recording sent clean's
    assert plan.continuation == "history-only"


def test_a_history_without_recorded_usage_is_refused_naming_the_turn() -> None:
    clean = branch("clean")
    stripped = [dict(m, extra={}) if m.get("role") == "assistant" else m
                for m in clean.continuation]
    broken = dataclasses.replace(clean, continuation=stripped)
    with pytest.raises(ReplayError, match=r"continuation message 1 has no recorded "
                       r"extra.usage.completion_tokens"):
        recorded_plan(broken, RECORD, "clean")


def test_the_wire_check_takes_reasoning_and_refuses_anything_else() -> None:
    settings = ReplaySettings(api_url="http://x.invalid/v1", model_name="target", wire=INLINE)
    clean = recorded_plan(branch("clean"), RECORD, "clean")
    history = history_only_plan(branch("external"), branch("clean"), RECORD, "external-history")
    body_clean = json.loads(first_body(clean, settings, None))
    body_arm = json.loads(first_body(history, settings, None))
    fields = compare_wire(body_clean, body_arm, arm_name="external-history", source=RECORD)
    assert fields and all(f.endswith(".content") for f in fields)  # the inlined thoughts
    assert compare_wire(body_clean, body_clean, arm_name="clean", source=RECORD) == []
    # no thought at all (delete-all-thinking) is still a reasoning-only change
    bare = json.loads(json.dumps(body_clean))
    for message in bare["messages"]:
        if message["role"] == "assistant" and message["content"].startswith("<think>\n"):
            message["content"] = message["content"].split("\n</think>\n", 1)[1].lstrip("\n")
    assert compare_wire(body_clean, bare, arm_name="bare", source=RECORD)
    tampered = json.loads(json.dumps(body_arm))
    tampered["messages"][1]["content"] += " (edited)"
    with pytest.raises(InvariantError, match=r"first at field 'messages\[1\]\.content'"):
        compare_wire(body_clean, tampered, arm_name="x", source=RECORD)


def test_turn_bodies_force_the_length_greedily_and_carry_the_runs_fields() -> None:
    settings = ReplaySettings(api_url="http://x.invalid/v1", model_name="target", wire=INLINE,
                              extra_body={"cache_salt": "s", "return_token_ids": True})
    plan = recorded_plan(branch("clean"), RECORD, "clean")
    body = turn_body(plan, plan.turns[1], settings, list(plan.turns[1].history))
    assert body["max_tokens"] == body["min_tokens"] == plan.turns[1].completion_tokens
    assert body["ignore_eos"] is True and body["temperature"] == 0.0 and "seed" not in body
    assert body["cache_salt"] == "s" and "tools" not in body  # tools only where the model has them
    assert all("reasoning" not in m for m in body["messages"])  # inlined as the visible thought


def test_a_replay_sends_every_turn_and_each_comes_back_at_its_recorded_length(
        fake_api: str) -> None:
    plan = recorded_plan(branch("clean"), RECORD, "clean")
    sent: list[int] = []
    result = replay(plan, ReplaySettings(api_url=fake_api, model_name="target", wire=INLINE),
                    on_request=lambda record, _: sent.append(record.completion_tokens or 0))
    assert result.terminal_status == REPLAYED and result.error is None
    assert sent == [t.completion_tokens for t in plan.turns]
    assert result.forced_exact == len(plan.turns) == result.turns
    assert [r.labels["recorded_completion_tokens"] for r in result.requests] == sent
    assert result.postfork_s > 0 and result.rewrite_s == 0.0


def test_a_dead_server_ends_the_replay_with_its_error_and_the_time_so_far() -> None:
    plan = recorded_plan(branch("clean"), RECORD, "clean")
    result = replay(plan, ReplaySettings(api_url="http://127.0.0.1:9/v1", model_name="target",
                                         wire=INLINE))
    assert result.terminal_status == "TransportError" and result.error_phase == "run"
    assert result.error is not None and "127.0.0.1:9" in result.error
    assert result.turns == 1 and result.forced_exact == 0
