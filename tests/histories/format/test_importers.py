"""Importers: one synthetic file per format, the refusals, and the study's real records."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import histories_root, repo_root, study_root
from compaction_bench.histories.format.history import HistoryError, load_history
from compaction_bench.histories.format.importers import (
    detect_format,
    import_history,
    import_minisweagent_v1,
    import_minisweagent_v2,
    import_openai_messages,
    import_study_record,
    import_swe_agent,
)

REPO = repo_root()
STUDY_DIR = study_root() / "records"
RECORDS = sorted(STUDY_DIR.glob("*__rep-*.json"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`compaction-bench histories ...`, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "compaction_bench", "histories", *args],
                          capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_study_records_ship_with_the_project() -> None:
    # 12 LiveCodeBench and 6 decision-task records of two models (data/study/SOURCES.md)
    assert len(RECORDS) == 18, f"{STUDY_DIR} should hold the study's 18 continuation records"


def call(call_id: str, command: str) -> dict[str, Any]:
    return {"function": {"arguments": json.dumps({"command": command}), "name": "bash"},
            "id": call_id, "type": "function"}


def msa_v2_toolcall() -> dict[str, Any]:
    """Shaped like mini-swe-agent 2.4's litellm tool-call trajectories (message.model_dump())."""
    def assistant(reasoning: str, call_id: str, command: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "reasoning_content": reasoning,
                "tool_calls": [call(call_id, command)], "function_call": None,
                "provider_specific_fields": {"refusal": None, "stop": 1},
                "extra": {"actions": [{"command": command, "tool_call_id": call_id}],
                          "cost": 0.0, "timestamp": 1.5}}

    def observation(call_id: str, output: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id,
                "content": f"<returncode>0</returncode>\n<output>\n{output}</output>",
                "extra": {"raw_output": output, "returncode": 0}}

    return {"trajectory_format": "mini-swe-agent-1.1", "info": {
        "exit_status": "Submitted", "submission": "diff", "mini_version": "2.4.6",
        "model_stats": {"instance_cost": 0.0, "api_calls": 3},
        "config": {"model": {"model_name": "hosted_vllm/tiny"}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
            assistant("Look first.", "call_a", "ls"), observation("call_a", "a.py\n"),
            assistant("Run tests.", "call_b", "pytest -q"), observation("call_b", "1 failed\n"),
            assistant("Submit.", "call_c", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
            {"role": "exit", "content": "diff",
             "extra": {"exit_status": "Submitted", "submission": "diff"}}]}


def text_messages(fence: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Reply with one bash block."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": f"THOUGHT: look.\n\n```{fence}\nls\n```"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>"},
        {"role": "assistant",
         "content": "THOUGHT: two at once\n```bash\nls\n```\n```bash\npwd\n```"},
        {"role": "user",
         "content": "Please always provide EXACTLY ONE action in triple backticks."},
        {"role": "assistant", "content": f"THOUGHT: test.\n\n```{fence}\npytest -q\n```"},
        {"role": "user", "content": "<returncode>1</returncode>\n<output>\n1 failed\n</output>"},
    ]
    return messages


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_minisweagent_v2_tool_calls(tmp_path: Path) -> None:
    path = write(tmp_path / "run1.traj.json", msa_v2_toolcall())
    history = import_minisweagent_v2(path)
    assert detect_format(msa_v2_toolcall()) == "minisweagent-v2"
    assert (history.task, history.arm) == ("run1", "clean")
    assert (history.reasoning_mode, history.action_protocol) == ("native", "tool_calls")
    # Default fork: the last action whose result was recorded; the submit after it was
    # answered by the exit message, not by a result.
    assert history.fork is not None and history.fork.message_index == 4
    assert history.fork.action["command"] == "pytest -q"
    assert history.fork.pending_result == (
        "<returncode>0</returncode>\n<output>\n1 failed\n</output>")
    assert history.provenance["fork_choice"] == (
        "default: the last action whose result was recorded (message 4); the later action at "
        "[6] has no recorded result")
    assert [m["role"] for m in history.continuation] == ["tool", "assistant", "exit"]
    third = history.messages[2]
    assert third["reasoning"] == "Look first." and "reasoning_content" not in third
    assert "function_call" not in third
    assert third["extra"]["source_fields"] == {"provider_specific_fields":
                                               {"refusal": None, "stop": 1}}
    assert third["extra"]["actions"] == [{"command": "ls", "tool_call_id": "call_a"}]
    assert history.messages[1]["content"] == "Fix the bug."
    assert history.tools is not None and history.tools[0]["function"]["name"] == "bash"
    assert history.provenance["model"] == "hosted_vllm/tiny"
    assert history.source is not None and history.source["importer"] == "minisweagent-v2"
    assert len(history.source["sha256"]) == 64


def test_fork_argument_picks_the_turn_and_its_pending_result(tmp_path: Path) -> None:
    path = write(tmp_path / "run1.traj.json", msa_v2_toolcall())
    history = import_history(path, fork=4, task="fix-median", arm="clean")
    assert history.fork is not None
    assert history.fork.action == {"command": "pytest -q", "tool_call_id": "call_b",
                                   "tool_name": "bash"}
    assert history.fork.pending_result == (
        "<returncode>0</returncode>\n<output>\n1 failed\n</output>")
    assert len(history.messages) == 5 and history.task == "fix-median"
    assert [m["role"] for m in history.continuation] == ["tool", "assistant", "exit"]


def test_minisweagent_v2_text_based(tmp_path: Path) -> None:
    data: dict[str, Any] = {"trajectory_format": "mini-swe-agent-1.1", "info": {},
                            "messages": text_messages("mswea_bash_command")}
    history = import_minisweagent_v2(write(tmp_path / "t.traj.json", data))
    assert (history.reasoning_mode, history.action_protocol) == ("tagged-visible", "text")
    assert history.fork is not None and history.fork.message_index == 6
    assert history.fork.action == {"command": "pytest -q"}
    assert history.fork.pending_result == data["messages"][7]["content"]
    assert history.tools is None
    assert history.reasoning_blocks() == [(2, "THOUGHT: look."),
                                          (4, "THOUGHT: two at once\n```bash\nls\n```\n"
                                              "```bash\npwd\n```"),
                                          (6, "THOUGHT: test.")]


def test_minisweagent_v1(tmp_path: Path) -> None:
    data: dict[str, Any] = {"trajectory_format": "mini-swe-agent-1",
                            "instance_id": "django__django-1",
                            "info": {"exit_status": "Submitted", "submission": ""},
                            "messages": text_messages("bash")}
    data["messages"][2]["extra"] = {"response": {"model": "gpt-x"}}
    history = import_minisweagent_v1(write(tmp_path / "v1.traj.json", data))
    assert history.task == "django__django-1"
    assert history.action_protocol == "text"
    assert history.messages[2]["extra"] == {"response": {"model": "gpt-x"}}
    assert history.source is not None and history.source["importer"] == "minisweagent-v1"
    assert import_history(tmp_path / "v1.traj.json", fork=2).fork == history_fork(2, "ls", data)


def history_fork(index: int, command: str, data: dict[str, Any]) -> Any:
    from compaction_bench.histories.format.history import Fork

    return Fork(index, {"command": command}, data["messages"][index + 1]["content"])


def swe_agent_history() -> dict[str, Any]:
    return {"environment": "swe_main", "info": {"exit_status": "submitted"}, "trajectory": [],
            "history": [
                {"role": "system", "content": "SETTING", "agent": "main",
                 "message_type": "system_prompt"},
                {"role": "user", "content": [{"type": "text", "text": "demo"}], "agent": "main",
                 "is_demo": True, "message_type": "demonstration"},
                {"role": "user", "content": [{"type": "text", "text": "<issue>x</issue>"}],
                 "agent": "main", "message_type": "observation"},
                {"role": "assistant", "content": "Let me look.", "thought": "Let me look.",
                 "action": "ls", "agent": "main", "message_type": "action",
                 "tool_calls": [call("toolu_1", "ls")]},
                {"role": "tool", "content": [{"type": "text", "text": "OBSERVATION:\na.py"}],
                 "agent": "main", "message_type": "observation", "tool_call_ids": ["toolu_1"]},
                {"role": "assistant", "content": "Edit it.", "thought": "Edit it.",
                 "action": "sed -i s/a/b/ a.py", "agent": "main", "message_type": "action",
                 "tool_calls": [call("toolu_2", "sed -i s/a/b/ a.py")]},
                {"role": "tool", "content": "", "agent": "main", "message_type": "observation",
                 "tool_call_ids": ["toolu_2"]},
            ]}


def test_swe_agent_history(tmp_path: Path) -> None:
    history = import_swe_agent(write(tmp_path / "astropy__astropy-1.traj", swe_agent_history()))
    assert history.task == "astropy__astropy-1"
    assert (history.reasoning_mode, history.action_protocol) == ("tagged-visible", "tool_calls")
    assert history.messages[4]["tool_call_id"] == "toolu_1"
    assert history.messages[4]["content"] == "OBSERVATION:\na.py"
    assert history.messages[1]["extra"]["source_fields"]["is_demo"] is True
    assert history.fork is not None and history.fork.message_index == 5
    assert history.fork.action["command"] == "sed -i s/a/b/ a.py"
    assert history.reasoning_blocks() == [(3, "Let me look."), (5, "Edit it.")]
    assert history.provenance["built_from"] == "history"


def test_swe_agent_trajectory_only(tmp_path: Path) -> None:
    data = {"info": {}, "trajectory": [
        {"thought": "Look.", "action": "ls", "observation": "a.py",
         "response": "DISCUSSION\nLook.\n\n```\nls\n```",
         "query": [{"role": "system", "content": "SETTING"},
                   {"role": "user", "content": "issue"}], "execution_time": 0.1},
        {"thought": "Test.", "action": "pytest", "observation": "1 failed", "response": ""},
    ]}
    history = import_history(write(tmp_path / "t.traj", data))
    assert detect_format(data) == "swe-agent"
    assert [m["role"] for m in history.messages] == ["system", "user", "assistant", "user",
                                                     "assistant"]
    assert history.messages[4]["content"] == "Test.\n\n```\npytest\n```"
    assert history.fork is not None and history.fork.action == {"command": "pytest"}
    assert history.fork.pending_result == "1 failed"
    assert history.messages[2]["extra"]["swe_agent_step"]["execution_time"] == 0.1


def test_plain_openai_list_and_object_with_tools(tmp_path: Path) -> None:
    messages = copy.deepcopy(msa_v2_toolcall()["messages"][:6])
    listed = import_openai_messages(write(tmp_path / "chat.json", messages))
    assert detect_format(messages) == "openai-messages"
    assert listed.task == "chat" and listed.fork is not None and listed.fork.message_index == 4
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    boxed = import_history(write(tmp_path / "boxed.json", {"messages": messages, "tools": tools}))
    assert boxed.tools == tools and boxed.messages == listed.messages


@pytest.mark.parametrize(("fork", "expected"), [
    (3, "message 3: field 'fork': cannot fork here: it is not an assistant turn (turns with an "
        "action: [2, 4, 6])"),
    (99, "field 'fork': requested fork at message 99 is out of range (the file has 8 messages)"),
])
def test_a_fork_that_cannot_be_found_is_refused(tmp_path: Path, fork: int, expected: str) -> None:
    path = write(tmp_path / "run.traj.json", msa_v2_toolcall())
    with pytest.raises(HistoryError) as caught:
        import_history(path, fork=fork)
    assert str(caught.value) == f"{path}: {expected}"


def test_fork_on_a_turn_with_two_actions_is_refused(tmp_path: Path) -> None:
    data = {"trajectory_format": "mini-swe-agent-1", "messages": text_messages("bash")}
    with pytest.raises(HistoryError, match="message 4: field 'fork': cannot fork here: that "
                       "assistant turn requests no single action"):
        import_history(write(tmp_path / "x.json", data), fork=4)


def test_a_file_without_any_action_is_refused(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(HistoryError, match="field 'fork': no assistant turn with an action"):
        import_history(write(tmp_path / "x.json", messages))


def test_imports_refuse_unknown_roles_and_orphan_tool_results(tmp_path: Path) -> None:
    data = msa_v2_toolcall()
    data["messages"][3]["role"] = "robot"
    with pytest.raises(HistoryError, match="message 3: field 'role': unknown role 'robot'"):
        import_history(write(tmp_path / "a.json", data))
    data = msa_v2_toolcall()
    data["messages"][5]["tool_call_id"] = "call_zz"
    with pytest.raises(HistoryError, match="message 5: field 'tool_call_id': 'call_zz' matches "
                       "no earlier tool call"):
        import_history(write(tmp_path / "b.json", data))


def test_broken_and_unknown_files_are_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"messages": [}')
    with pytest.raises(HistoryError, match="broken JSON at line 1 column 15"):
        import_history(broken)
    with pytest.raises(HistoryError, match="unrecognized format"):
        import_history(write(tmp_path / "odd.json", {"foo": 1}))


def test_a_history_file_imports_as_itself(tmp_path: Path) -> None:
    history = import_history(write(tmp_path / "r.traj.json", msa_v2_toolcall()), fork=4)
    saved = tmp_path / "h.json"
    from compaction_bench.histories.format.history import save_history

    save_history(history, saved)
    assert import_history(saved) == history
    with pytest.raises(HistoryError, match="field 'fork': the history's fork is at message 4"):
        import_history(saved, fork=2)


# --- the study's records ----------------------------------------------------------------------

@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.stem)
def test_study_record_gives_a_clean_and_an_external_arm(record: Path) -> None:
    data = json.loads(record.read_text())
    arms = import_study_record(record)
    assert sorted(arms) == ["clean", "external"]
    clean, external = arms["clean"], arms["external"]
    assert (clean.arm, external.arm) == ("clean", "external")
    assert clean.task == external.task == data["task_id"]
    assert clean.fork == external.fork or (
        clean.fork is not None and external.fork is not None
        and clean.fork.message_index == external.fork.message_index
        and clean.fork.action["tool_name"] == external.fork.action["tool_name"]
        and clean.fork.pending_result == external.fork.pending_result)
    assert clean.tools == external.tools == data["branches"]["clean"]["turns"][0]["request"][
        "tools"]
    # Reasoning-only difference before the fork: everything else equal, assistant reasoning not.
    changed = []
    for index, (a, b) in enumerate(zip(clean.messages, external.messages, strict=True)):
        assert {k: v for k, v in a.items() if k != "reasoning"} == {
            k: v for k, v in b.items() if k != "reasoning"}
        if a.get("reasoning") != b.get("reasoning"):
            assert a["role"] == "assistant"
            changed.append(index)
    assert changed
    for arm, branch in ((clean, "clean"), (external, "rewritten")):
        turns = data["branches"][branch]["turns"]
        transcript = [{k: v for k, v in m.items() if k != "extra"}
                      for m in arm.messages + arm.continuation]
        for turn in turns:  # every recorded request is a prefix of the kept transcript
            sent = turn["request"]["messages"]
            assert transcript[: len(sent)] == sent
        first = turns[0]["request"]["messages"]
        assert arm.fork is not None and arm.fork.pending_result == first[-1]["content"]
        assistants = [m for m in arm.continuation if m["role"] == "assistant"]
        assert [m["extra"]["wall_seconds"] for m in assistants] == [
            t["wall_seconds"] for t in turns]
        assert [m["extra"]["usage"] for m in assistants] == [t["response"]["usage"]
                                                             for t in turns]
        study = arm.provenance["study"]
        assert study["source_sha256"] == data["source_sha256"]
        assert study["continuation_seed"] == data["continuation_seed"]
        assert study["branch"] == branch and study["outcome"]["status"] == (
            data["branches"][branch]["status"])
        assert arm.provenance["sampling"]["temperature"] == 0


def test_study_record_refuses_another_fork_and_unknown_arm() -> None:
    record = RECORDS[0]
    with pytest.raises(HistoryError, match="field 'fork': the record fixes its fork at message 4"):
        import_history(record, fork=2)
    with pytest.raises(HistoryError, match="field 'arm': a study record has arms"):
        import_history(record, arm="self")
    assert import_history(record, arm="external").arm == "external"


def test_inconsistent_study_record_is_refused(tmp_path: Path) -> None:
    record = next(r for r in RECORDS if "vaccine" in r.name)
    data = json.loads(record.read_text())
    data["branches"]["rewritten"]["turns"][1]["request"]["messages"][1]["content"] = "edited"
    with pytest.raises(HistoryError, match=r"field 'branches\.rewritten\.turns\[1\]\.request\."
                       r"messages': a turn's request is not the previous request"):
        import_study_record(write(tmp_path / "r__rep-01.json", data))


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.stem)
def test_shipped_study_histories_match_a_fresh_import(record: Path) -> None:
    for arm, fresh in import_study_record(record).items():
        shipped = load_history(histories_root() / "study" / record.stem / f"{arm}.json")
        assert shipped.source is not None and fresh.source is not None
        assert shipped.source["sha256"] == fresh.source["sha256"]
        shipped.source = fresh.source
        assert shipped == fresh


@pytest.mark.e2e  # runs the CLI as a child process
def test_cli_converts_all_study_records(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "compaction_bench", "study", "import",
                           str(STUDY_DIR), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    written = sorted((tmp_path / "out" / "study").glob("*/*.json"))
    assert len(written) == 2 * len(RECORDS)
    assert all(load_history(p).arm in ("clean", "external") for p in written)
    assert done.stdout.count(".json") == len(written)


@pytest.mark.e2e  # runs the CLI as a child process
def test_cli_imports_one_file_and_reports_refusals(tmp_path: Path) -> None:
    source = write(tmp_path / "run.traj.json", msa_v2_toolcall())
    out = tmp_path / "histories" / "run" / "clean.json"
    done = cli("import", str(source), str(out), "--fork", "4", "--task", "run")
    assert done.returncode == 0, done.stderr
    assert load_history(out).fork is not None
    refused = cli("import", str(source), str(out), "--fork", "3")
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(source) in lines[0]
    assert load_history(out).fork is not None
    # the settings grammar of every command (issue 31): words, then the flags as aliases
    worded = tmp_path / "worded" / "run" / "clean.json"
    again = cli("import", str(source), str(worded), "fork=4", "task=run")
    assert again.returncode == 0, again.stderr
    assert worded.read_bytes() == out.read_bytes()
    def said(text: str, where: Path) -> str:
        return text.replace(str(where.parent), "X").replace(str(where.parent.parent), "Y")

    assert said(again.stdout, worded) == said(done.stdout, out)
