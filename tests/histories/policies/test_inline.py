"""The `self-inline` arm's policy (histories/policies/inline.py) against the fake engine with its
prefix cache, in a thread of this process: one compaction request, in the agent's own context,
whose prefix the engine holds; its summary replaces the history before the fork's action; and
the invariant that holds the first request to clean's, on inputs built to fail it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from compaction_bench.common.net import free_port
from compaction_bench.histories.agent.chat import ChatModel, ChatModelConfig
from compaction_bench.histories.agent.continuation import first_request, pending_observation
from compaction_bench.histories.format.history import Fork, History
from compaction_bench.histories.format.invariant import InvariantError
from compaction_bench.histories.policies.inline import (
    SUMMARY_HEADER,
    UNBOUND_SUMMARY,
    InlineCompaction,
    InlineCompactionError,
    check_replaced,
    check_tail,
)
from compaction_bench.histories.policies.registry import parse_arm
from compaction_bench.loadgen.fakeserver import FakeConfig
from compaction_bench.transport.client import RequestRecord

FakeInThread = Callable[[FakeConfig], AbstractContextManager[str]]
REPLY = "THOUGHT: the median test fails on even lengths.\n\n```bash\npytest -q\n```"


def history() -> History:
    """A text-protocol history (what cpu-tiny acquires): two turns, forked at the second."""
    return History(
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the median of stats.py for even lengths."},
            {"role": "assistant", "content": "THOUGHT: read it first.\n\n```bash\ncat stats.py\n"
                                             "```"},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\ndef median(xs):"
                                        " return sorted(xs)[len(xs) // 2]\n</output>"},
            {"role": "assistant", "content": "THOUGHT: run the tests.\n\n```bash\npytest -q\n```"},
        ],
        task="fix-median", reasoning_mode="tagged-visible", action_protocol="text",
        fork=Fork(message_index=4, action={"command": "pytest -q"},
                  pending_result="<returncode>1</returncode>\n<output>\n1 failed\n</output>"))


def config(url: str) -> ChatModelConfig:
    return ChatModelConfig(api_url=url, protocol="text", reasoning_mode="tagged-visible",
                           structured_text=True, max_tokens=64)


def seeded(clean: History) -> list[dict[str, Any]]:
    assert clean.fork is not None
    return [*clean.messages[: clean.fork.message_index + 1], pending_observation(clean)]


def test_one_compaction_in_context_hits_the_cache_and_its_summary_replaces_the_prefix(
        fake_in_thread: FakeInThread) -> None:
    assert parse_arm("self-inline").kind == "inline"
    clean = history()
    fake = FakeConfig(engine="steps", ttft_ms=1, itl_ms=0, default_content=REPLY, tokens=16,
                      block_tokens=4)
    with fake_in_thread(fake) as url:
        # the acquisition's request that produced the fork's action: what the engine holds
        warm = ChatModel(config(url))
        warm.request(warm.api_messages(clean.messages[:4]))
        warm.close()
        records: list[RequestRecord] = []
        policy = InlineCompaction(name="self-inline", fork_index=4, on_record=records.append)
        model = ChatModel(config(url), policy=policy)
        first = model.query(seeded(clean))
        model.query([*seeded(clean), first, {"role": "user", "content": "<returncode>0"}])
        model.close()
    (compaction,) = records  # once, not before every request
    assert compaction.ok and compaction.labels["phase"] == "compaction"
    assert compaction.prompt_tokens and compaction.cached_tokens
    assert 0 < compaction.cached_tokens < compaction.prompt_tokens  # the history, not the ask
    assert policy.rewrite_record() == {
        "rewrite_requests": 1, "rewrite_cache_hits": 0,
        "rewrite_prompt_tokens": compaction.prompt_tokens,
        "rewrite_cached_tokens": compaction.cached_tokens,
        "rewrite_completion_tokens": compaction.completion_tokens, "rewrite_failed_blocks": 0}
    assert policy.not_applied() is None and policy.summary == REPLY
    assert model.first_body is not None
    sent = json.loads(model.first_body)
    clean_body = json.loads(first_request(clean, config(url)).body)
    report = check_replaced(clean_body, sent, arm_name="self-inline", fork_index=4)
    assert report == {"passed": True, "kept_messages": 2, "replaced_messages": 2,
                      "summary_chars": len(REPLY)}
    assert sent["messages"][2] == {"role": "user", "content": SUMMARY_HEADER + REPLY}
    assert sent["messages"][3:] == clean_body["messages"][4:]  # the fork's action and result
    # the agent's own list keeps everything; the second request sends the same replacement
    assert len(model.records) == 2 and all(r.ok for r in model.records)


def test_unbound_the_summary_has_its_place_held_and_the_check_fails_on_what_it_must(
        ) -> None:
    clean = history()
    policy = InlineCompaction(name="self-inline", fork_index=4)
    clean_body = json.loads(first_request(clean).body)
    arm_body = json.loads(first_request(clean, policy=policy).body)
    assert arm_body["messages"][2]["content"] == SUMMARY_HEADER + UNBOUND_SUMMARY
    assert check_replaced(clean_body, arm_body, arm_name="a", fork_index=4)["passed"]

    def broken(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        body = copy.deepcopy(arm_body)
        change(body)
        return body

    cases = {
        "pending result changed": lambda b: b["messages"][-1].update(content="0 failed"),
        "fork action changed": lambda b: b["messages"][3].update(content="```bash\nls\n```"),
        "sampling changed": lambda b: b.update(temperature=0.1),
        "task dropped": lambda b: b["messages"].pop(1),
        "no summary": lambda b: b["messages"][2].update(content="hello"),
        "history kept": lambda b: b["messages"].insert(3, clean_body["messages"][2]),
    }
    for name, change in cases.items():
        with pytest.raises(InvariantError):
            check_replaced(clean_body, broken(change), arm_name="a", fork_index=4)
            pytest.fail(name)


def test_nothing_to_compact_and_a_failed_request_are_refused() -> None:
    clean = history()
    early = InlineCompaction(name="self-inline", fork_index=2)
    with pytest.raises(InlineCompactionError, match="nothing to compact"):
        early.prepare(seeded(clean))
    down = InlineCompaction(name="self-inline", fork_index=4)
    model = ChatModel(config(f"http://127.0.0.1:{free_port()}/v1"), policy=down)
    with pytest.raises(InlineCompactionError, match="compaction request failed"):
        model.query(seeded(clean))
    model.close()
    assert down.not_applied() and down.rewrite_record()["rewrite_failed_blocks"] == 1
    assert model.records == []  # no target request went out raw in its place


def test_the_recorded_arms_check_holds_the_fork_and_after_and_fails_on_what_it_must() -> None:
    # `recorded` (the agent's own compaction from its log): the history before the fork's
    # action is the log's replacement, anything; from the action on, clean's
    clean = {"model": "target", "max_tokens": 7, "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "task"},
        {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "r1"},
        {"role": "assistant", "content": "fork action"}, {"role": "tool", "content": "pending"}]}
    arm = {**clean, "messages": [{"role": "user", "content": "summary"},
                                 *clean["messages"][-2:]]}
    assert check_tail(clean, arm, arm_name="recorded") == {
        "passed": True, "clean_messages_before_the_fork": 4, "arm_messages_before_the_fork": 1}
    cases = {
        "pending result changed": {**arm, "messages": [*arm["messages"][:-1],
                                                       {"role": "tool", "content": "other"}]},
        "length changed": {**arm, "max_tokens": 8},
        "nothing compacted": clean,
        "no action": {**arm, "messages": [{"role": "user", "content": "summary"}]},
    }
    for name, body in cases.items():
        with pytest.raises(InvariantError):
            check_tail(clean, body, arm_name="recorded")
            pytest.fail(name)
