"""Export to mini-swe-agent and back: every shipped and every imported history survives."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import histories_root, repo_root
from compaction_bench.histories.format.export import export_minisweagent, write_minisweagent
from compaction_bench.histories.format.history import History, load_history
from compaction_bench.histories.format.importers import detect_format, import_history

REPO = repo_root()
SHIPPED = sorted((histories_root() / "study").glob("*/*.json"))


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def msa_tool_calls() -> dict[str, Any]:
    return {"trajectory_format": "mini-swe-agent-1.1", "info": {"mini_version": "2.4.6"},
            "messages": [
                {"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "", "reasoning_content": "r1",
                 "tool_calls": [bash_call("c1", "ls")], "function_call": None,
                 "extra": {"actions": [{"command": "ls", "tool_call_id": "c1"}]}},
                {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
                {"role": "assistant", "content": None, "reasoning_content": "r2",
                 "tool_calls": [bash_call("c2", "cat a.py")]},
                {"role": "tool", "tool_call_id": "c2", "content": "x = 1"}]}


def msa_text(fmt: str, fence: str) -> dict[str, Any]:
    return {"trajectory_format": fmt, "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
        {"role": "assistant", "content": f"THOUGHT: a\n```{fence}\nls\n```"},
        {"role": "user", "content": "<output>a.py</output>"},
        {"role": "assistant", "content": f"THOUGHT: b\n```{fence}\npytest\n```"}]}


def swe_agent() -> dict[str, Any]:
    return {"history": [
        {"role": "system", "content": "S", "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": [{"type": "text", "text": "issue"}], "agent": "main"},
        {"role": "assistant", "content": "Look.", "thought": "Look.", "action": "ls",
         "tool_calls": [bash_call("t1", "ls")]},
        {"role": "tool", "content": [{"type": "text", "text": "a.py"}], "tool_call_ids": ["t1"]},
        {"role": "assistant", "content": "Edit.", "tool_calls": [bash_call("t2", "vi a.py")]}],
        "info": {"instance_id": "repo__repo-1"}}


SYNTHETIC: dict[str, Callable[[], Any]] = {
    "msa-v2-tool-calls": msa_tool_calls,
    "msa-v2-text": lambda: msa_text("mini-swe-agent-1.1", "mswea_bash_command"),
    "msa-v1": lambda: msa_text("mini-swe-agent-1", "bash"),
    "swe-agent": swe_agent,
    "openai-list": lambda: msa_tool_calls()["messages"][:5],
}


def round_trip(history: History, folder: Path) -> History:
    target = folder / "export.traj.json"
    write_minisweagent(history, target)
    return import_history(target)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shipped_histories_round_trip(path: Path, tmp_path: Path) -> None:
    history = load_history(path)
    again = round_trip(history, tmp_path)
    assert (again.messages, again.fork, again.task, again.arm) == (
        history.messages, history.fork, history.task, history.arm)
    assert again == history


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_imported_histories_round_trip(name: str, tmp_path: Path) -> None:
    source = tmp_path / f"{name}.json"
    source.write_text(json.dumps(SYNTHETIC[name]()))
    history = import_history(source)
    assert round_trip(history, tmp_path) == history


def test_export_is_a_plain_minisweagent_trajectory() -> None:
    history = load_history(SHIPPED[0])
    before = copy.deepcopy(history)
    data = export_minisweagent(history)
    assert history == before  # the history itself is not changed
    assert data["trajectory_format"] == "mini-swe-agent-1.1"
    assert "history_format" not in data and "history_version" not in data
    assert detect_format(data) == "minisweagent-v2"
    assert {"exit_status", "submission", "model_stats"} <= set(data["info"])
    assert data["messages"] == history.messages
    # What mini-swe-agent's inspector reads: a role and string (or null) content per message.
    assert all(isinstance(m["role"], str) and (m["content"] is None
                                                or isinstance(m["content"], str))
               for m in data["messages"])
    json.dumps(data)


def test_export_keeps_task_and_arm_overrides_out(tmp_path: Path) -> None:
    history = load_history(SHIPPED[1])
    target = tmp_path / "x.traj.json"
    write_minisweagent(history, target)
    renamed = import_history(target, task="other", arm="self")
    assert (renamed.task, renamed.arm) == ("other", "self")
    assert renamed.messages == history.messages and renamed.fork == history.fork
