"""The history file format: load/save, every refusal message, atomic writes, reasoning blocks."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import histories_root, repo_root
from compaction_bench.histories.format.actions import split_text_action
from compaction_bench.histories.format.history import (
    Fork,
    History,
    HistoryError,
    load_history,
    message_action,
    save_history,
)

REPO = repo_root()
SHIPPED = sorted((histories_root() / "study").glob("*/*.json"))


def tool_history() -> History:
    """A small native-reasoning, tool-call history ending at a pending bash call."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "", "reasoning": "Look at the files first.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
        {"role": "assistant", "content": None, "reasoning": "Now run the tests.",
         "tool_calls": [{"id": "call_2", "type": "function",
                         "function": {"name": "bash", "arguments": '{"command": "pytest"}'}}],
         "extra": {"usage": {"completion_tokens": 12}}},
    ]
    return History(messages=messages, task="fix-x",
                   fork=Fork(4, {"command": "pytest", "tool_call_id": "call_2",
                                 "tool_name": "bash"}, "1 failed"),
                   provenance={"model": "m"})


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_save_and_load_give_the_same_history(tmp_path: Path) -> None:
    history = tool_history()
    target = tmp_path / "deep" / "fix-x" / "clean.json"
    save_history(history, target)
    assert load_history(target) == history
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    data = json.loads(target.read_text())
    assert data["trajectory_format"] == "mini-swe-agent-1.1"
    assert data["extra"]["fork"]["message_index"] == 4


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_history_loads(path: Path) -> None:
    history = load_history(path)
    assert history.fork is not None
    assert history.fork.message_index == len(history.messages) - 1
    assert history.reasoning_mode == "native" and history.action_protocol == "tool_calls"


def test_shipped_histories_exist() -> None:
    assert len(SHIPPED) == 36  # the study's 18 records, a clean and an external arm each


def refused(tmp_path: Path, data: Any) -> str:
    path = write(tmp_path / "x.json", data)
    with pytest.raises(HistoryError) as caught:
        load_history(path)
    return str(caught.value)


def as_json() -> dict[str, Any]:
    return copy.deepcopy(tool_history().to_json())


def test_broken_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"messages": [\n  {"role": "user",, }\n]}')
    with pytest.raises(HistoryError, match=r"x\.json: broken JSON at line 2 column 19"):
        load_history(path)


def test_missing_file_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=r"nope\.json: no such file"):
        load_history(tmp_path / "nope.json")


def test_unknown_role_names_file_index_field(tmp_path: Path) -> None:
    data = as_json()
    data["messages"][3]["role"] = "robot"
    message = refused(tmp_path, data)
    assert message == (f"{tmp_path / 'x.json'}: message 3: field 'role': unknown role 'robot' "
                       "(expected system, user, assistant, tool, exit)")


def test_tool_result_without_its_call_is_refused(tmp_path: Path) -> None:
    data = as_json()
    data["messages"][3]["tool_call_id"] = "call_9"
    assert "message 3: field 'tool_call_id': 'call_9' matches no earlier tool call" in refused(
        tmp_path, data)


def test_tool_result_before_its_call_is_refused(tmp_path: Path) -> None:
    data = as_json()
    data["messages"].insert(2, {"role": "tool", "tool_call_id": "call_1", "content": "x"})
    data["extra"]["fork"]["message_index"] = 5
    assert "message 2: field 'tool_call_id'" in refused(tmp_path, data)


@pytest.mark.parametrize(("index", "expected"), [
    (9, "field 'extra.fork.message_index': fork at message 9 is out of range (the history has "
        "5 messages)"),
    (-1, "out of range"),
    (3, "message 3: field 'extra.fork.message_index': the fork must be an assistant turn, this "
        "is a tool message"),
    (2, "message 2: field 'extra.fork.message_index': messages continue after the fork"),
])
def test_bad_fork_is_refused(tmp_path: Path, index: int, expected: str) -> None:
    data = as_json()
    data["extra"]["fork"]["message_index"] = index
    data["extra"]["fork"]["action"]["tool_call_id"] = "call_1"
    assert expected in refused(tmp_path, data)


def test_fork_on_a_turn_without_action_is_refused(tmp_path: Path) -> None:
    data = as_json()
    data["messages"][4] = {"role": "assistant", "content": "I am done."}
    assert ("message 4: field 'extra.fork.message_index': the fork's assistant turn has no "
            "action (expected exactly one tool call)") in refused(tmp_path, data)


def test_fork_action_must_name_the_turns_call(tmp_path: Path) -> None:
    data = as_json()
    data["extra"]["fork"]["action"]["tool_call_id"] = "call_1"
    assert "field 'extra.fork.action.tool_call_id'" in refused(tmp_path, data)


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda d: d["extra"].pop("task"), "field 'extra.task': missing"),
    (lambda d: d.pop("messages"), "field 'messages': missing"),
    (lambda d: d.pop("extra"), "field 'extra': missing"),
    (lambda d: d["messages"][1].pop("content"), "message 1: field 'content': missing"),
    (lambda d: d["messages"][1].pop("role"), "message 1: field 'role': missing"),
    (lambda d: d["messages"][1].update(content=None), "message 1: field 'content': must be a "
     "string"),
    (lambda d: d["messages"][3].pop("tool_call_id"), "message 3: field 'tool_call_id': missing"),
    (lambda d: d["messages"][1].update(reasoning="x"), "message 1: field 'reasoning'"),
    (lambda d: d["extra"].update(reasoning_mode="hidden"), "field 'extra.reasoning_mode': "
     "unknown value 'hidden' (expected native, tagged-visible)"),
    (lambda d: d["extra"]["fork"]["action"].pop("command"),
     "field 'extra.fork.action.command': missing"),
    (lambda d: d["messages"][2]["tool_calls"][0]["function"].update(arguments={}),
     "message 2: field 'tool_calls[0].function.arguments': must be a JSON string"),
])
def test_missing_or_wrong_fields_are_refused(tmp_path: Path, edit: Any, expected: str) -> None:
    data = as_json()
    edit(data)
    assert expected in refused(tmp_path, data)


def test_wrong_version_names_the_supported_ones(tmp_path: Path) -> None:
    data = as_json()
    data["history_version"] = 2
    assert "field 'history_version': version 2 is not supported (supported: 1)" in refused(
        tmp_path, data)


def test_a_trajectory_is_not_a_history_and_the_error_says_how_to_import(tmp_path: Path) -> None:
    message = refused(tmp_path, {"trajectory_format": "mini-swe-agent-1.1", "messages": []})
    assert "field 'history_format'" in message
    assert "`compaction-bench histories import FILE OUT.json`" in message


def test_save_refuses_an_invalid_history_and_writes_nothing(tmp_path: Path) -> None:
    history = tool_history()
    history.messages[1]["role"] = "robot"
    with pytest.raises(HistoryError, match="unknown role"):
        save_history(history, tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "clean.json"
    save_history(tool_history(), target)
    before = target.read_bytes()
    broken = tool_history()
    # Not JSON-serializable, deep inside: the writer fails after the temp file has content.
    broken.provenance = {"seeds": [1, 2], "bad": {1, 2}}
    with pytest.raises(HistoryError, match=r"cannot write .*previous file, if any, is unchanged"):
        save_history(broken, target)
    assert target.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["clean.json"]


def test_native_reasoning_blocks() -> None:
    assert tool_history().reasoning_blocks() == [(2, "Look at the files first."),
                                                 (4, "Now run the tests.")]


def test_tagged_visible_text_reasoning_blocks_cut_the_action() -> None:
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "THOUGHT: list files.\n\n```bash\nls -la\n```\n"},
                {"role": "user", "content": "<output>a</output>"},
                {"role": "assistant", "content": "no action here"}]
    history = History(messages=messages, task="t", reasoning_mode="tagged-visible",
                      action_protocol="text")
    assert history.reasoning_blocks() == [(1, "THOUGHT: list files."), (3, "no action here")]


def test_tagged_visible_tool_call_reasoning_is_the_content() -> None:
    history = tool_history()
    history.reasoning_mode = "tagged-visible"
    history.messages[2]["content"] = "  I will list.  "
    assert history.reasoning_blocks() == [(2, "I will list."), (4, "")]


def test_text_actions_need_exactly_one_action_block() -> None:
    assert split_text_action("a\n```bash\nls\n```") == ("a", "ls")
    assert split_text_action("```mswea_bash_command\nls\n```") == ("", "ls")
    assert split_text_action("```python\nx = 1\n```\nthen\n```bash\nls\n```") == (
        "```python\nx = 1\n```\nthen", "ls")
    assert split_text_action("```bash\nls\n```\n```bash\npwd\n```") is None
    assert split_text_action("no fence") is None


def test_message_action_reads_bash_and_other_tools() -> None:
    bash = tool_history().messages[4]
    assert message_action(bash, "tool_calls") == {"command": "pytest", "tool_call_id": "call_2",
                                                  "tool_name": "bash"}
    other = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    assert message_action(other, "tool_calls") == {"command": '{"a": 1}', "tool_call_id": "c",
                                                   "tool_name": "f"}


def test_content_hash_covers_messages_and_fork_only() -> None:
    a, b = tool_history(), tool_history()
    assert a.content_hash() == b.content_hash()
    b.arm, b.provenance = "external", {"other": 1}
    assert a.content_hash() == b.content_hash()
    b.messages[2]["reasoning"] = "shorter"
    assert a.content_hash() != b.content_hash()
    c = tool_history()
    assert c.fork is not None
    c.fork.pending_result = "2 failed"
    assert a.content_hash() != c.content_hash()


def test_wrong_field_types_say_what_is_expected(tmp_path: Path) -> None:
    data = as_json()
    data["extra"]["fork"]["message_index"] = "4"
    assert "field 'extra.fork.message_index': must be an integer, got str" in refused(
        tmp_path, data)
    data = as_json()
    data["extra"]["task"] = 7
    assert "field 'extra.task': must be a string, got int" in refused(tmp_path, data)
