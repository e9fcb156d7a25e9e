"""The reasoning-only invariant on the first postfork request each arm puts on the wire, on real
study histories (no server needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from compaction_bench.common.paths import histories_root
from compaction_bench.histories.agent.continuation import check_reasoning_only, first_request
from compaction_bench.histories.format.history import Fork, History, load_history
from compaction_bench.histories.format.invariant import InvariantError

STUDY = histories_root() / "study"
PAIRS = sorted(STUDY.glob("*/clean.json"))


@pytest.mark.parametrize("clean_path", PAIRS, ids=lambda p: p.parent.name[:40])
def test_study_arms_differ_from_clean_only_in_reasoning(clean_path: Path) -> None:
    clean = load_history(clean_path)
    external = load_history(clean_path.parent / "external.json")
    report = check_reasoning_only(clean, external)
    assert report.passed and report.reasoning_fields
    assert all(f.endswith(".reasoning") for f in report.reasoning_fields)


def test_a_changed_tool_argument_is_named_as_the_first_differing_field() -> None:
    clean = load_history(PAIRS[0])
    arm = copy.deepcopy(clean)
    arm.arm = "external"
    index = next(i for i, m in enumerate(arm.messages) if m.get("tool_calls"))
    arm.messages[index]["tool_calls"][0]["function"]["arguments"] = "{}"
    with pytest.raises(InvariantError, match=rf"'messages\[{index}\]\.tool_calls\[0\]\."
                                             r"function\.arguments'"):
        check_reasoning_only(clean, arm)


def test_a_changed_observation_or_pending_result_fails() -> None:
    clean = load_history(PAIRS[0])
    arm = copy.deepcopy(clean)
    index = next(i for i, m in enumerate(arm.messages) if m["role"] == "tool")
    arm.messages[index]["content"] += " changed"
    with pytest.raises(InvariantError, match=rf"messages\[{index}\]\.content"):
        check_reasoning_only(clean, arm)
    arm = copy.deepcopy(clean)
    assert arm.fork is not None
    arm.fork.pending_result = "another result"
    last = len(json.loads(first_request(clean).body)["messages"]) - 1
    with pytest.raises(InvariantError, match=rf"messages\[{last}\]\.content"):
        check_reasoning_only(clean, arm)


def _text(thought: str, command: str) -> History:
    turn = f"THOUGHT: {thought}\n\n```bash\n{command}\n```"
    return History(
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                  {"role": "assistant", "content": turn}],
        task="t", reasoning_mode="tagged-visible", action_protocol="text",
        fork=Fork(message_index=2, action={"command": "ls"}, pending_result="r"))


def test_tagged_visible_thought_may_differ_but_not_the_action() -> None:
    clean = _text("a long thought", "ls")
    assert check_reasoning_only(clean, _text("short", "ls")).reasoning_fields == [
        "messages[2].content"]
    with pytest.raises(InvariantError, match=r"messages\[2\]\.content"):
        check_reasoning_only(clean, _text("a long thought", "ls -la"))


def test_native_reasoning_mode_does_not_allow_content_changes() -> None:
    clean = load_history(PAIRS[0])
    arm = copy.deepcopy(clean)
    index = next(i for i, m in enumerate(arm.messages) if m["role"] == "assistant")
    arm.messages[index]["content"] = "visible text"
    with pytest.raises(InvariantError, match=rf"messages\[{index}\]\.content"):
        check_reasoning_only(clean, arm)
