"""Decision tasks through the real agent loop (ChatModel + HistoryAgent + DecisionEnvironment),
acquisition, continuation and a bench block, against the suite's one fake OpenAI-compatible
server (`loadgen.fakeserver`), which streams scripted chat completions, so the truth is known
exactly."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compaction_bench.bench.run.agent_source import AgentSource
from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings, run_block
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.histories.agent.acquisition import AcquisitionError, acquire
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.continuation import continue_history
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import History, load_history, save_history
from compaction_bench.histories.policies.base import CleanPolicy
from compaction_bench.histories.tasks.decision_protocol import structured_regex
from compaction_bench.histories.tasks.task import (
    Task,
    TaskError,
    known_tasks,
    load_task,
    runnable_tasks,
)
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

TASK = "wildfire-evacuation"
Reply = dict[str, Any]


def reply(content: str = "", tool: tuple[str, dict[str, Any]] | None = None) -> Reply:
    out: Reply = {"content": content}
    if tool is not None:
        out["tool_calls"] = [{"name": tool[0], "arguments": tool[1]}]
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0)) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProcess) -> FakeProcess:
    server.reset()
    return server


@pytest.fixture
def task() -> Task:
    return load_task(TASK)


def phase_call(task: Task, index: int) -> Reply:
    assert task.decision is not None
    phase = task.decision.phases[index]
    return reply(tool=(phase.name, phase.expected_arguments))


def text_call(task: Task, index: int, thought: str = "Next phase.") -> Reply:
    assert task.decision is not None
    phase = task.decision.phases[index]
    call = json.dumps({"name": phase.name, "arguments": phase.expected_arguments})
    return reply(f"THOUGHT: {thought}\n\n```json\n{call}\n```")


def tool_config(url: str) -> ChatModelConfig:
    return ChatModelConfig(api_url=url, protocol="tool_calls")


def text_config(url: str) -> ChatModelConfig:
    return ChatModelConfig(api_url=url, protocol="text", structured_text=True,
                           reasoning_mode="tagged-visible")


def test_decision_tasks_are_known_and_runnable_by_id(task: Task) -> None:
    assert TASK in known_tasks() and TASK not in runnable_tasks()
    assert task.spec.kind == "decision" and task.decision is not None
    assert task.spec.fork_turn == task.decision.fork_after
    task.check_runnable()
    with pytest.raises(TaskError, match=r"unknown task 'nope'; known tasks: .*wildfire"):
        load_task("nope")


@pytest.mark.e2e
def test_tool_call_run_acquires_the_fork_and_continues_to_a_correct_answer(
        fake: FakeProcess, task: Task, tmp_path: Path) -> None:
    assert task.decision is not None
    fork = task.decision.fork_after
    fake.script([phase_call(task, i) for i in range(fork)])
    got = acquire(task, tool_config(fake.api_url))
    first = fake.requests()[0]
    assert [t["function"]["name"] for t in first["tools"]] == [
        t["function"]["name"] for t in task.decision.tools()]
    assert first["messages"] == task.decision.initial_messages()
    history = got.history
    assert history.fork is not None and history.tools == task.decision.tools()
    assert history.fork.pending_result == task.decision.fork_info()["pending_result"]
    assert history.fork.action["tool_name"] == task.decision.fork_phase.name
    assert history.provenance["fork_call_correct"] is True
    # tool results go back as tool messages with the study's exact result text
    tool_messages = [m for m in history.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [
        json.dumps(p.result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        for p in task.decision.phases[: fork - 1]]
    path = tmp_path / "clean.json"
    save_history(history, path)
    loaded = load_history(path)

    fake.reset()
    fake.script([phase_call(task, i) for i in range(fork, len(task.decision.phases))])
    fake.script([reply(f"All constraints hold.\nFINAL: {task.decision.final_answer}")])
    result = continue_history(loaded, task, tool_config(fake.api_url))
    assert result.error is None and result.terminal_status == "Submitted"
    assert result.validation is not None and result.validation.passed
    assert task.decision.check_answer(result.submission) and result.patch == ""
    assert result.turns == len(task.decision.phases) - fork + 1
    # the continuation's first request carries the saved prefix and the pending result
    sent = fake.requests()[0]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": history.fork.action["tool_call_id"],
                        "content": history.fork.pending_result}
    assert result.messages[-1]["extra"]["final_correct"] is True


@pytest.mark.e2e
def test_wrong_tools_get_deterministic_error_observations(fake: FakeProcess, task: Task) -> None:
    assert task.decision is not None
    late = task.decision.phases[3]
    fake.script([reply(tool=(late.name, late.expected_arguments)),
                 reply(tool=("launch_rockets", {"case_id": "FIRE-41"})),
                 reply(tool=(task.decision.distractor["name"], {"case_id": "FIRE-41"})),
                 reply("I am not sure."),
                 reply("FINAL: E4")])
    with pytest.raises(AcquisitionError, match="ended with Submitted after 4 action turn"):
        acquire(task, tool_config(fake.api_url))
    observations = [m["messages"][-1] for m in fake.requests()[1:]]
    assert json.loads(observations[0]["content"])["error"] == "phase_not_available"
    assert json.loads(observations[1]["content"])["error"] == "unknown_tool"
    assert json.loads(observations[2]["content"]) == task.decision.distractor["result"]
    assert observations[3]["role"] == "user" and observations[3]["content"].startswith(
        "Format error: no tool call and no FINAL line found")
    # deterministic: the same call in the same state gives the same text
    session = task.decision.session()
    assert session.execute(late.name, late.expected_arguments) == observations[0]["content"]


@pytest.mark.e2e
def test_text_protocol_forces_a_json_call_or_final_line(fake: FakeProcess, task: Task) -> None:
    assert task.decision is not None
    fork = task.decision.fork_after
    fake.script([text_call(task, i) for i in range(fork)])
    got = acquire(task, text_config(fake.api_url))
    first = fake.requests()[0]
    assert "tools" not in first
    regex = first["structured_outputs"]["regex"]
    assert regex == structured_regex(task.decision.tools(), final=False)
    assert "Tools:\n- load_evacuation_brief(case_id: string)" in first["messages"][0]["content"]
    for call in [text_call(task, i) for i in range(len(task.decision.phases))]:
        assert re.fullmatch(regex, call["content"])
    assert not re.fullmatch(regex, "THOUGHT: done.\n\nFINAL: E2")
    assert re.fullmatch(structured_regex(task.decision.tools()), "THOUGHT: done.\n\nFINAL: E2")
    history = got.history
    assert history.action_protocol == "text" and history.fork is not None
    assert history.fork.pending_result == task.decision.fork_info()["pending_result"]
    assert history.provenance["final_line_allowed"] is False
    History.from_json(history.to_json(), origin="acquired")  # the fork validates

    fake.reset()
    fake.script([text_call(task, i) for i in range(fork, len(task.decision.phases))])
    fake.script([reply("THOUGHT: E4 wins.\n\nFINAL: E4")])
    result = continue_history(history, task, text_config(fake.api_url))
    assert fake.requests()[0]["structured_outputs"]["regex"] == structured_regex(
        task.decision.tools())
    assert result.terminal_status == "Submitted" and result.validation is not None
    assert not result.validation.passed and "expected FINAL: E2" in result.validation.output


@pytest.mark.e2e
def test_a_bench_block_runs_a_decision_task(fake: FakeProcess, task: Task,
                                            tmp_path: Path) -> None:
    assert task.decision is not None
    fork = task.decision.fork_after
    fake.script([phase_call(task, i) for i in range(fork)])
    history = acquire(task, tool_config(fake.api_url)).history
    fake.script([phase_call(task, i) for i in range(fork, len(task.decision.phases))])
    fake.script([reply(f"FINAL: {task.decision.final_answer}")])
    writer = RunWriter(tmp_path, origin=0.0)
    config = BenchConfig(regime="dedicated", task=task.id, arms=("clean",))
    settings = BlockSettings(
        config=config, run_id="t", source=AgentSource(config, task),
        model=tool_config(fake.api_url), protocol="strict", block_size=16, ledger=Ledger())
    arm = Arm("clean", history, lambda _: CleanPolicy())
    (record,) = run_block([arm], settings=settings, regime="dedicated", block=1,
                          rng=np.random.default_rng(0), writer=writer).records
    assert record.status == "complete" and record.terminal_status == "Submitted"
    assert record.validation is True and record.turns == len(task.decision.phases) - fork + 1
