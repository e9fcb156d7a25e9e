"""The second paper's policies on hand-made histories, scored by the real proxy model: the
embedded SmolLM2-135M in-process on the CPU (converted from its PyPI package on first use, like
`make serve` does; nothing downloads). A test that uses them asks, through them, for the
`proxy_model` fixture, and so is e2e."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.histories.format.history import Fork, History
from compaction_bench.histories.policies.scorer import ProxyScorer, ScorerConfig

SCORER = ScorerConfig(model="embedded:smollm2-135m-instruct")


@pytest.fixture(scope="session")
def scorer_config(proxy_model: Path) -> ScorerConfig:
    return SCORER


@pytest.fixture(scope="session")
def scorer(proxy_model: Path) -> ProxyScorer:
    return ProxyScorer.shared(SCORER)


@pytest.fixture
def make_native() -> Callable[..., History]:
    return native_history


def native_history(*reasonings: str, task: str = "hand-made") -> History:
    """A native-reasoning tool-call history: one assistant turn per reasoning, each calling
    `bash` with a distinct command and answered by a tool message, the last turn the fork."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs in a small Python repository."},
        {"role": "user", "content": "The median of [1, 2, 3, 4] comes out as 3; fix it."}]
    for number, reasoning in enumerate(reasonings):
        call = {"name": "bash", "arguments": f'{{"command": "ls {number}"}}'}
        messages.append({"role": "assistant", "content": "", "reasoning": reasoning,
                         "tool_calls": [{"id": f"call-{number}", "type": "function",
                                         "function": call}]})
        if number < len(reasonings) - 1:
            messages.append({"role": "tool", "tool_call_id": f"call-{number}",
                             "content": f"OBSERVATION-{number}"})
    last = len(reasonings) - 1
    return History(messages=messages, task=task, reasoning_mode="native",
                   action_protocol="tool_calls",
                   fork=Fork(message_index=len(messages) - 1,
                             action={"command": f"ls {last}", "tool_call_id": f"call-{last}",
                                     "tool_name": "bash"},
                             pending_result="PENDING-RESULT"))
