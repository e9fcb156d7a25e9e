"""Compaction every n turns (`self-every-3`): the study's compactor, run only before the request
after turns n, 2n, ...; counted on the suite's fake compressor, where every request is seen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from compaction_bench.histories.compaction.arms import compact_history
from compaction_bench.histories.compaction.compactor import Compactor, self_compressor
from compaction_bench.histories.format.history import Fork, History
from compaction_bench.histories.policies.compacting import ContinuousCompaction, policy_for
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

LONG = ("I should look at the median function first because the failing test says the even "
        "length case returns the wrong value for lists of four items")  # 26 words


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0, default_content="short record")) as process:
        yield process


def turn(number: int) -> dict[str, Any]:
    return {"role": "assistant",
            "content": f"THOUGHT: {number} {LONG}\n\n```bash\nls {number}\n```"}


def history(turns: int) -> History:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "S"},
                                      {"role": "user", "content": "U"}]
    for number in range(1, turns + 1):
        messages.append(turn(number))
        if number < turns:
            messages.append({"role": "user", "content": f"OBS {number}"})
    return History(messages=messages, task="t", reasoning_mode="tagged-visible",
                   action_protocol="text",
                   fork=Fork(message_index=len(messages) - 1, action={"command": f"ls {turns}"},
                             pending_result="PENDING"))


def records(messages: list[dict[str, Any]]) -> list[bool]:
    """Which assistant turns went out compacted."""
    return [m["content"].startswith("THOUGHT: short record") for m in messages
            if m["role"] == "assistant"]


@pytest.mark.e2e
def test_the_arm_file_holds_only_the_compactions_due_before_the_fork(fake: FakeProcess) -> None:
    fake.reset()
    two, _, _ = compact_history(history(2), Compactor(self_compressor(fake.api_url)),
                                "self-every-3", every=3)
    assert records(two.messages) == [False, False] and fake.requests() == []
    four, blocks, _ = compact_history(history(4), Compactor(self_compressor(fake.api_url)),
                                      "self-every-3", every=3)
    assert records(four.messages) == [True, True, True, False] and len(blocks) == 3
    assert four.provenance["compaction"]["every"] == 3
    # the continuation's policy: the file's three compactions are settled, the fourth is not
    fake.reset()
    policy = policy_for(four, self_compressor(fake.api_url), name="self-every-3", every=3)
    messages = [*four.messages, {"role": "user", "content": "PENDING"}]
    assert records(policy.prepare(messages)) == [True, True, True, False]
    assert fake.requests() == []  # four turns: off the cadence, nothing settled is redone
    for number in (5, 6):
        messages += [turn(number), {"role": "user", "content": f"OBS {number}"}]
    assert records(policy.prepare(messages)) == [True] * 6
    assert len(fake.requests()) == 3  # turns 4, 5 and 6, once each


@pytest.mark.e2e
def test_compaction_runs_before_the_request_after_every_third_turn(fake: FakeProcess) -> None:
    fake.reset()
    policy = ContinuousCompaction(Compactor(self_compressor(fake.api_url)), name="self-every-3",
                                  reasoning_mode="tagged-visible", protocol="text", every=3)
    messages = [*history(2).messages, {"role": "user", "content": "OBS 2"}]
    assert records(policy.prepare(messages)) == [False, False] and fake.requests() == []
    for number in (3, 4, 5, 6):
        messages += [turn(number), {"role": "user", "content": f"OBS {number}"}]
        sent = policy.prepare(messages)
        if number == 3:
            assert records(sent) == [True, True, True]
        if number in (4, 5):
            assert records(sent) == [True] * 3 + [False] * (number - 3)
    assert records(sent) == [True] * 6
    assert [c["new_blocks"] for c in policy.calls] == [0, 3, 0, 0, 3]
    assert len(fake.requests()) == 6  # each block rewritten once


def test_every_one_turn_is_the_study_arm() -> None:
    with pytest.raises(ValueError, match="at least 1 turn"):
        ContinuousCompaction(Compactor(self_compressor("http://127.0.0.1:9/v1")), name="x",
                             reasoning_mode="tagged-visible", protocol="text", every=0)
