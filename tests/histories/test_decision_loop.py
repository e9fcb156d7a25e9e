"""Decision tasks through the real agent loop (ChatModel + HistoryAgent + DecisionEnvironment),
acquisition, continuation and a bench block, against a fake OpenAI-compatible server: a real
HTTP server in a thread that streams canned chat completions, so the truth is known exactly."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.block import ArmPlan, RunWriter, run_block
from histories.acquire import AcquisitionError, acquire
from histories.chat import ChatModelConfig
from histories.continuation import continue_history
from histories.decision import DEFAULT_TASKS_PATH
from histories.decision_actions import structured_regex
from histories.format import History, load_history, save_history
from histories.policy import CleanPolicy
from histories.tasks import Task, TaskError, known_tasks, load_task, runnable_tasks

pytestmark = pytest.mark.skipif(not DEFAULT_TASKS_PATH.is_file(),
                                reason=f"study tasks not found at {DEFAULT_TASKS_PATH}")
TASK = "wildfire-evacuation"


@dataclass
class Reply:
    content: str = ""
    tool: tuple[str, dict[str, Any]] | None = None  # (name, arguments)


@dataclass
class FakeServer:
    """Streams `replies` in order, one per chat-completions request; keeps each request body."""

    replies: list[Reply]
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(404)
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                reply = server.replies.pop(0)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in _chunks(reply, len(server.requests)):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        return Handler


def _chunks(reply: Reply, n: int) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": f"c{n}", "object": "chat.completion.chunk", "created": 0, "model": "target",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": reply.content})]
    if reply.tool is not None:
        name, arguments = reply.tool
        out.append(chunk({"tool_calls": [{"index": 0, "id": f"call_{n}", "type": "function",
                                          "function": {"name": name,
                                                       "arguments": json.dumps(arguments)}}]}))
    out.append(chunk({}, "tool_calls" if reply.tool else "stop"))
    out.append({"id": f"c{n}", "object": "chat.completion.chunk", "created": 0,
                "model": "target", "choices": [],
                "usage": {"prompt_tokens": 10 * n, "completion_tokens": 5, "total_tokens": 0}})
    return out


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    fake = FakeServer(replies=[])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield fake
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def task() -> Task:
    return load_task(TASK)


def phase_call(task: Task, index: int) -> Reply:
    assert task.decision is not None
    phase = task.decision.phases[index]
    return Reply(content="", tool=(phase.name, phase.expected_arguments))


def text_call(task: Task, index: int, thought: str = "Next phase.") -> Reply:
    assert task.decision is not None
    phase = task.decision.phases[index]
    call = json.dumps({"name": phase.name, "arguments": phase.expected_arguments})
    return Reply(content=f"THOUGHT: {thought}\n\n```json\n{call}\n```")


def tool_config(url: str) -> ChatModelConfig:
    return ChatModelConfig(base_url=url, protocol="tool_calls")


def text_config(url: str) -> ChatModelConfig:
    return ChatModelConfig(base_url=url, protocol="text", structured_text=True,
                           reasoning_mode="tagged-visible")


def test_decision_tasks_are_known_and_runnable_by_id(task: Task) -> None:
    assert TASK in known_tasks() and TASK not in runnable_tasks()
    assert task.spec.kind == "decision" and task.decision is not None
    assert task.spec.fork_turn == task.decision.fork_after
    task.check_runnable()
    with pytest.raises(TaskError, match=r"unknown task 'nope'; known tasks: .*wildfire"):
        load_task("nope")


def test_tool_call_run_acquires_the_fork_and_continues_to_a_correct_answer(
        fake: FakeServer, task: Task, tmp_path: Path) -> None:
    assert task.decision is not None
    fork = task.decision.fork_after
    fake.replies = [phase_call(task, i) for i in range(fork)]
    got = acquire(task, tool_config(fake.url))
    first = fake.requests[0]
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

    fake.requests.clear()
    fake.replies = [phase_call(task, i) for i in range(fork, len(task.decision.phases))]
    fake.replies.append(Reply(content=f"All constraints hold.\nFINAL: "
                                      f"{task.decision.final_answer}"))
    result = continue_history(loaded, task, tool_config(fake.url))
    assert result.error is None and result.terminal_status == "Submitted"
    assert result.validation is not None and result.validation.passed
    assert task.decision.check_answer(result.submission) and result.patch == ""
    assert result.turns == len(task.decision.phases) - fork + 1
    # the continuation's first request carries the saved prefix and the pending result
    sent = fake.requests[0]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": history.fork.action["tool_call_id"],
                        "content": history.fork.pending_result}
    assert result.messages[-1]["extra"]["final_correct"] is True


def test_wrong_tools_get_deterministic_error_observations(fake: FakeServer, task: Task) -> None:
    assert task.decision is not None
    late = task.decision.phases[3]
    fake.replies = [Reply(tool=(late.name, late.expected_arguments)),
                    Reply(tool=("launch_rockets", {"case_id": "FIRE-41"})),
                    Reply(tool=(task.decision.distractor["name"], {"case_id": "FIRE-41"})),
                    Reply(content="I am not sure."),
                    Reply(content="FINAL: E4")]
    with pytest.raises(AcquisitionError, match="ended with Submitted after 4 action turn"):
        acquire(task, tool_config(fake.url))
    observations = [m["messages"][-1] for m in fake.requests[1:]]
    assert json.loads(observations[0]["content"])["error"] == "phase_not_available"
    assert json.loads(observations[1]["content"])["error"] == "unknown_tool"
    assert json.loads(observations[2]["content"]) == task.decision.distractor["result"]
    assert observations[3]["role"] == "user" and observations[3]["content"].startswith(
        "Format error: no tool call and no FINAL line found")
    # deterministic: the same call in the same state gives the same text
    session = task.decision.session()
    assert session.execute(late.name, late.expected_arguments) == observations[0]["content"]


def test_text_protocol_forces_a_json_call_or_final_line(fake: FakeServer, task: Task) -> None:
    assert task.decision is not None
    fork = task.decision.fork_after
    fake.replies = [text_call(task, i) for i in range(fork)]
    got = acquire(task, text_config(fake.url))
    first = fake.requests[0]
    assert "tools" not in first
    regex = first["structured_outputs"]["regex"]
    assert regex == structured_regex(task.decision.tools(), final=False)
    assert "Tools:\n- load_evacuation_brief(case_id: string)" in first["messages"][0]["content"]
    for reply in [text_call(task, i) for i in range(len(task.decision.phases))]:
        assert re.fullmatch(regex, reply.content)
    assert not re.fullmatch(regex, "THOUGHT: done.\n\nFINAL: E2")
    assert re.fullmatch(structured_regex(task.decision.tools()), "THOUGHT: done.\n\nFINAL: E2")
    history = got.history
    assert history.action_protocol == "text" and history.fork is not None
    assert history.fork.pending_result == task.decision.fork_info()["pending_result"]
    assert history.provenance["final_line_allowed"] is False
    History.from_json(history.to_json(), origin="acquired")  # the fork validates

    fake.requests.clear()
    fake.replies = [text_call(task, i) for i in range(fork, len(task.decision.phases))]
    fake.replies.append(Reply(content="THOUGHT: E4 wins.\n\nFINAL: E4"))
    result = continue_history(history, task, text_config(fake.url))
    assert fake.requests[0]["structured_outputs"]["regex"] == structured_regex(
        task.decision.tools())
    assert result.terminal_status == "Submitted" and result.validation is not None
    assert not result.validation.passed and "expected FINAL: E2" in result.validation.output


def test_a_bench_block_runs_a_decision_task(fake: FakeServer, task: Task,
                                            tmp_path: Path) -> None:
    assert task.decision is not None
    fork = task.decision.fork_after
    fake.replies = [phase_call(task, i) for i in range(fork)]
    history = acquire(task, tool_config(fake.url)).history
    fake.replies = [phase_call(task, i) for i in range(fork, len(task.decision.phases))]
    fake.replies.append(Reply(content=f"FINAL: {task.decision.final_answer}"))
    writer = RunWriter(tmp_path, origin=0.0)
    (record,) = run_block([ArmPlan("clean", history, CleanPolicy)], task=task,
                          config=tool_config(fake.url), regime="idle", block=1,
                          rng=np.random.default_rng(0), writer=writer)
    assert record.status == "complete" and record.terminal_status == "Submitted"
    assert record.validation is True and record.turns == len(task.decision.phases) - fork + 1
