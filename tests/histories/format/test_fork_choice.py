"""Bring-your-own-logs, on real public trajectories (samples/SOURCES.md): the fork chosen by
default, SWE-agent's recorded actions, the arm files written from the default fork, the commands
`import` prints, and reasoning that is read, noted or left alone."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.replay import find_sources, live_policy, replay_arms
from compaction_bench.histories.cli import MODEL_FREE_ARMS, TOKENIZER, app
from compaction_bench.histories.format.history import (
    HistoryError,
    load_history,
    message_action,
    save_history,
)
from compaction_bench.histories.format.importers import import_history
from compaction_bench.histories.format.importers.normalize import RAW_REASONING
from compaction_bench.histories.policies.armfile import PolicyArmError, rehearse, write_arm_files
from compaction_bench.histories.policies.registry import parse_arm
from compaction_bench.histories.policies.scorer import ScorerConfig
from compaction_bench.histories.policies.segments import reasoning_span

SAMPLES = Path(__file__).parent / "samples"
MSWEA = SAMPLES / "minisweagent" / "sqlfluff__sqlfluff-2419.traj.json"
SWE_TEXT = SAMPLES / "sweagent" / "swe-agent__test-repo-i1.traj"
SWE_MULTI = SAMPLES / "sweagent" / "97af1e.traj"
SWE_FC = SAMPLES / "sweagent" / "marshmallow-code__marshmallow-1867.traj"
# The policies' ledgers count tokens with the embedded tokenizer; no model server is involved.
SCORER = ScorerConfig(model=TOKENIZER, device="cpu")


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_the_samples_are_the_files_sources_md_names() -> None:
    sources = (SAMPLES / "SOURCES.md").read_text()
    for sample in (MSWEA, SWE_TEXT, SWE_MULTI, SWE_FC):
        digest = hashlib.sha256(sample.read_bytes()).hexdigest()
        assert f"`{sample.parent.name}/{sample.name}`" in sources and digest in sources


@pytest.mark.parametrize(("sample", "fork", "command", "submit_at"), [
    (MSWEA, 80, "cat patch.txt", 82),  # mini-swe-agent 2: submit answered by `role: exit`
    (SWE_TEXT, 9, "python tests/missing_colon.py", 11),  # SWE-agent: history ends at submit
], ids=["minisweagent-v2-tool-calls", "swe-agent-text"])
@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_a_run_ending_in_submit_forks_at_its_last_answered_action_and_gets_arm_files(
        tmp_path: Path, sample: Path, fork: int, command: str, submit_at: int) -> None:
    history = import_history(sample)
    assert history.fork is not None and history.fork.message_index == fork
    assert history.fork.action["command"] == command and history.fork.pending_result
    assert history.provenance["fork_choice"] == (
        f"default: the last action whose result was recorded (message {fork}); the later "
        f"action at [{submit_at}] has no recorded result")
    clean = tmp_path / history.task / "clean.json"
    save_history(history, clean)
    results = write_arm_files(clean, MODEL_FREE_ARMS, scorer=SCORER)
    assert [(r.arm, r.written, r.problems) for r in results] == [
        (arm, True, []) for arm in MODEL_FREE_ARMS]
    for result in results:  # every arm shares the fork: the same action, the same result
        arm = load_history(result.path)
        assert arm.fork == history.fork
        assert message_action(arm.messages[-1], arm.action_protocol) == message_action(
            history.messages[-1], history.action_protocol)


@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_swe_agent_turns_with_several_fenced_blocks_import_from_the_recorded_action(
        tmp_path: Path) -> None:
    raw = json.loads(SWE_MULTI.read_text())["history"]
    history = import_history(SWE_MULTI)
    # SWE-agent ran the last of five blocks (the model made up outputs between them)
    assert history.fork is not None and history.fork.message_index == 3
    assert history.fork.action == {"command": raw[3]["action"].strip()}
    [(index, thought)] = history.reasoning_blocks()
    assert index == 3 and "```\nls -R /testbed/src/simpy/\n```" in thought
    assert "```\nopen /testbed/src/simpy/resources/container.py\n```" not in thought
    clean = tmp_path / history.task / "clean.json"
    save_history(history, clean)
    results = write_arm_files(clean, ["delete-all-thinking", "random-30"], scorer=SCORER)
    assert [(r.written, r.problems) for r in results] == [(True, []), (True, [])]
    emptied = load_history(results[0].path).messages[3]["content"]
    assert emptied == "\n\n```\nopen /testbed/src/simpy/resources/container.py\n```"


def test_swe_agent_function_calling_says_its_tool_schemas_are_unknown() -> None:
    history = import_history(SWE_FC)
    assert history.action_protocol == "tool_calls" and history.tools is None
    assert history.provenance["tool_schemas"].startswith(
        "unknown: the trajectory names its tool bundles (tools/defaults, tools/search, "
        "tools/edit_linting, tools/submit) but not their schemas")


@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_the_commands_import_prints_run_as_printed(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "histories" / "sqlfluff" / "clean.json"
    done = runner.invoke(app, ["import", str(MSWEA), str(out)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == f"wrote {out}"
    assert lines[1].startswith("reasoning: 0 of 41 assistant turns readable; the policies use "
                               "the visible text before each action")
    assert lines[2] == ("fork: message 80: default: the last action whose result was recorded "
                        "(message 80); the later action at [82] has no recorded result")
    [arms] = [line.strip() for line in lines if "histories arms" in line]
    words = shlex.split(arms)
    assert words[:3] == ["compaction-bench", "histories", "arms"]
    written = runner.invoke(app, words[2:])
    assert written.exit_code == 0, written.output
    assert sorted(p.name for p in out.parent.glob("*.json")) == sorted(
        ["clean.json", *(f"{arm}.json" for arm in MODEL_FREE_ARMS)])
    # mini-swe-agent kept each response's usage: the import is a replay source
    [replay] = [line.strip() for line in lines if "source=replay" in line]
    assert replay == (f"compaction-bench bench source=replay records={out.parent} "
                      f"arms=clean,{','.join(MODEL_FREE_ARMS)}")
    # the arm files just written recorded no continuation: replay applies those policies live
    # to clean's history and sends clean's recorded turns
    config = BenchConfig(source="replay", records=(str(out.parent),),
                         arms=("clean", *MODEL_FREE_ARMS))
    sources = find_sources(config.records)
    assert [set(s.histories) for s in sources] == [{"clean"}]
    arms = replay_arms(config, sources, {}, {})
    for arm in arms:
        [plan] = arm.replay.values()
        assert [turn.completion_tokens for turn in plan.turns] == [90], arm.name
        assert live_policy(parse_arm(arm.name), sources[0]) == (arm.name != "clean")


def test_a_text_run_without_usage_gets_no_replay_command(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["import", str(SWE_TEXT), str(tmp_path / "t" / "clean.json")])
    assert done.exit_code == 0, done.output
    assert "histories arms" in done.output and "source=replay" not in done.output


def test_no_action_with_a_recorded_result_is_refused_at_import(tmp_path: Path) -> None:
    data = json.loads(MSWEA.read_text())
    data["messages"] = [*data["messages"][:3], data["messages"][-1]]  # one call, then exit
    path = write(tmp_path / "short.traj.json", data)
    with pytest.raises(HistoryError) as caught:
        import_history(path)
    assert str(caught.value) == (
        f"{path}: field 'fork': no action has a recorded result to give the arms after the "
        "fork; pick a turn with --fork N (N indexes all messages from 0; turns with an action: "
        "[2])")


def test_arm_files_of_a_fork_without_result_are_refused_naming_the_file_and_fix(
        tmp_path: Path) -> None:
    history = import_history(MSWEA, fork=82)
    assert history.provenance["fork_choice"] == (
        "requested: --fork 82 (its result was not recorded, so no arm file can be written "
        "from it)")
    clean = tmp_path / "t" / "clean.json"
    save_history(history, clean)
    with pytest.raises(PolicyArmError) as caught:
        write_arm_files(clean, ["delete-all-thinking"], scorer=SCORER)
    assert str(caught.value) == (
        f"{clean}: field 'extra.fork.pending_result': the fork's action (message 82) has no "
        "recorded result, so no arm can be shown one; re-import it at an action whose result "
        "was recorded: `compaction-bench histories import "
        f"tests/histories/format/samples/minisweagent/{MSWEA.name} {clean} --fork N` (without "
        "--fork the import picks the last one)")


# A chat agent that answered its user without an action, then acted in a ```bash block: read as
# text actions (no tool call anywhere), as a Cline log whose tool_use parts were lost was read.
TALKS_FIRST = [
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "How many files are there?"},
    {"role": "assistant", "content": "I can count them once I have looked around the folder."},
    {"role": "user", "content": "Go ahead."},
    {"role": "assistant", "content": "THOUGHT: count them.\n\n```bash\nls | wc -l\n```"},
    {"role": "user", "content": "3"},
]
UNEDITABLE = ("message 2: field 'content': a reasoning policy cannot edit this turn (ValueError: "
              "text-protocol message without exactly one action block); 1 of the 2 assistant "
              "turns up to the fork fail so, and `histories arms` would write no arm file; fix: "
              "give every assistant turn up to the fork exactly one action (one fenced ```bash "
              "block or one tool call)")


def test_import_refuses_a_history_that_its_printed_arms_command_would_refuse(
        tmp_path: Path) -> None:
    # issue 33: a Cline log passed the import, whose printed arms command then exited 1 with a
    # ValueError per turn. The import now runs the arms step's own checks before it writes.
    path = write(tmp_path / "chat.json", TALKS_FIRST)
    history = import_history(path)  # a valid history: the refusal is the arms step's
    assert history.action_protocol == "text" and history.fork is not None
    assert history.fork.message_index == 4 and history.fork.pending_result == "3"
    out = tmp_path / "chat" / "clean.json"
    done = CliRunner().invoke(app, ["import", str(path), str(out)])
    assert isinstance(done.exception, PolicyArmError) and done.exit_code != 0
    assert str(done.exception) == f"{path}: {UNEDITABLE}" and not out.exists()
    # the same log, answered with an action in the first turn too, imports and can be rehearsed
    first = {"role": "assistant", "content": "THOUGHT: look first.\n\n```bash\nls\n```"}
    acting = [*TALKS_FIRST[:2], first, *TALKS_FIRST[3:]]
    fine = CliRunner().invoke(app, ["import", str(write(tmp_path / "acts.json", acting)),
                                    str(out)])
    assert fine.exit_code == 0, fine.output
    assert "histories arms" in fine.output
    assert rehearse(load_history(out), str(out)).passed


@pytest.mark.parametrize("sample", sorted(p for p in SAMPLES.glob("*/*") if p.is_file()),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_sample_imports_with_its_arms_command_or_is_refused_in_one_line(
        tmp_path: Path, sample: Path) -> None:
    # issue 33: a refusal comes before anything is written (the Codex sample whose compaction
    # summary is encrypted wrote clean.json, then failed on its recorded arm)
    out = tmp_path / "s" / "clean.json"
    done = CliRunner().invoke(app, ["import", str(sample), str(out)])
    if done.exit_code == 0:
        assert "histories arms" in done.output or "no arm files" in done.output, done.output
    else:
        assert isinstance(done.exception, HistoryError | PolicyArmError), done.output
        assert "\n" not in str(done.exception) and str(done.exception).startswith(str(sample))
        assert not out.parent.exists()


@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_the_arms_step_fails_where_the_import_refuses_and_for_the_same_reason(
        tmp_path: Path) -> None:
    clean = tmp_path / "chat" / "clean.json"
    save_history(import_history(write(tmp_path / "chat.json", TALKS_FIRST)), clean)
    [result] = write_arm_files(clean, ["delete-all-thinking"], scorer=SCORER)
    assert not result.written
    assert result.problems == [
        "message 2: ValueError: text-protocol message without exactly one action block"]


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_a_chat_agents_replies_are_dialogue_not_reasoning(tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "My order is late."},
        {"role": "assistant", "content": "Sorry to hear that! What is the order number?"},
        {"role": "user", "content": "42"},
        {"role": "assistant", "content": "I should look the order up before promising anything.",
         "tool_calls": [call("c1", "lookup", '{"order": 42}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "shipped yesterday"},
        {"role": "assistant", "content": "It shipped yesterday. Anything else?"},
        {"role": "user", "content": "Refund the shipping, please."},
        {"role": "assistant", "content": "Late delivery qualifies for a shipping refund.",
         "tool_calls": [call("c2", "refund", '{"order": 42}')]},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]
    history = import_history(write(tmp_path / "support.json", messages))
    assert history.fork is not None and history.fork.message_index == 8
    assert history.reasoning_blocks() == [
        (2, ""), (4, "I should look the order up before promising anything."), (6, ""),
        (8, "Late delivery qualifies for a shipping refund.")]
    assert reasoning_span(history.messages[2], "tagged-visible", "tool_calls").text == ""
    clean = tmp_path / "support" / "clean.json"
    save_history(history, clean)
    [result] = write_arm_files(clean, ["delete-all-thinking"], scorer=SCORER)
    assert result.written, result.problems
    sent = load_history(result.path).messages
    assert [sent[i]["content"] for i in (2, 4, 6, 8)] == [
        messages[2]["content"], "", messages[6]["content"], ""]


def test_anthropic_thinking_parts_are_read_as_reasoning(tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "ls shows them.", "signature": "sig"},
            {"type": "text", "text": "Listing."}],
         "tool_calls": [call("t1", "bash", '{"command": "ls"}')]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.py"},
    ]
    history = import_history(write(tmp_path / "claude.json", messages))
    assert history.reasoning_mode == "native"
    assert history.messages[1]["reasoning"] == "ls shows them."
    assert history.messages[1]["content"] == "Listing."
    assert history.provenance["reasoning_read_from"] == (
        "Anthropic 'thinking' content parts (1 assistant turns), as the turn's reasoning")


def test_reasoning_kept_only_in_the_raw_response_is_noted_as_unused(tmp_path: Path) -> None:
    response = {"choices": [{"message": {"content": "x", "reasoning": "a hidden chain"}}]}
    data = {"trajectory_format": "mini-swe-agent-1", "messages": [
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": "THOUGHT: look.\n\n```bash\nls\n```",
         "extra": {"response": response}},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>"}]}
    history = import_history(write(tmp_path / "openrouter.traj.json", data))
    assert history.reasoning_mode == "tagged-visible"
    assert "reasoning" not in history.messages[1]
    assert history.messages[1]["extra"]["response"] == response  # kept, not sent
    [note] = history.provenance["reasoning_unused"]
    assert (note["field"], note["turns"]) == (RAW_REASONING, 1)


def test_import_writes_the_agents_own_compaction_beside_clean(tmp_path: Path) -> None:
    # issue 33: a Claude Code log with an auto-compaction gives a recorded pair, both files
    sample = SAMPLES / "claudecode" / "auto_compact.jsonl"
    out = tmp_path / "session" / "clean.json"
    done = CliRunner().invoke(app, ["import", str(sample), str(out)])
    assert done.exit_code == 0, done.output
    clean, recorded = load_history(out), load_history(out.parent / "recorded.json")
    assert recorded.arm == "recorded" and clean.continuation == recorded.continuation
    line = next(text for text in done.output.splitlines() if "recorded.json" in text)
    assert "the agent's own compaction (auto, 155250 tokens before, line 31)" in line
    assert f"in place of the {len(clean.messages) - 1} messages clean.json keeps" in line


def test_an_encrypted_compaction_imports_clean_and_says_why_it_has_no_recorded_arm(
        tmp_path: Path) -> None:
    sample = SAMPLES / "codex" / "agentv-compacted-first-window.jsonl"
    out = tmp_path / "window" / "clean.json"
    done = CliRunner().invoke(app, ["import", str(sample), str(out)])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["clean.json"]
    assert ("no recorded.json: the agent's own compaction at line 272 cannot be a recorded arm "
            "(1 item(s) of its replacement history (the compaction summary) are encrypted)"
            ) in done.output.splitlines()


def test_import_says_what_reasoning_it_read_and_what_the_policies_will_edit(
        tmp_path: Path) -> None:
    # issue 33: where every reasoning item is encrypted, a reasoning policy edits the visible
    # commentary; the import says so instead of leaving it to be found in the arm files
    codex = SAMPLES / "codex" / "rollout-2026-05-11T11-26-55-019e1625-first-task.jsonl"
    history = import_history(codex)
    encrypted = history.provenance["encrypted_reasoning_items"]
    assert encrypted > 0
    done = CliRunner().invoke(app, ["import", str(codex), str(tmp_path / "c" / "clean.json")])
    assert done.exit_code == 0, done.output
    [line] = [text for text in done.output.splitlines() if text.startswith("reasoning: ")]
    turns = sum(m["role"] == "assistant" for m in history.messages + history.continuation)
    readable = sum(bool(m.get("reasoning")) for m in history.messages + history.continuation
                   if m["role"] == "assistant")
    assert line.startswith(f"reasoning: {readable} of {turns} assistant turns readable "
                           f"({encrypted} encrypted, not readable)")
    claude = CliRunner().invoke(app, ["import", str(SAMPLES / "claudecode" / "tool_heavy.jsonl"),
                                      str(tmp_path / "k" / "clean.json")])
    assert "; the policies use the reasoning field (native)" in claude.output


def test_two_logs_of_one_task_never_import_over_each_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 33: two runs of the same instance were both sent to <task>/clean.json
    monkeypatch.setenv("COMPBENCH_HISTORIES", str(tmp_path / "h"))
    first = tmp_path / "a" / "run.traj.json"
    second = tmp_path / "b" / "run.traj.json"
    for path in (first, second):
        path.parent.mkdir()
    first.write_bytes(MSWEA.read_bytes())
    data = json.loads(MSWEA.read_text())
    data["info"] = {**data.get("info", {}), "note": "a second run"}
    write(second, data)
    runner = CliRunner()
    outs = []
    for path in (first, second, first):
        done = runner.invoke(app, ["import", str(path)])
        assert done.exit_code == 0, done.output
        outs.append(Path(done.output.splitlines()[0].removeprefix("wrote ")))
    task = load_history(outs[0]).task  # the trajectory names its instance
    assert outs[0] == tmp_path / "h" / "imported" / task / "clean.json"
    assert outs[1].parent.name.startswith(f"{task}-") and outs[1] != outs[0]
    assert outs[2] == outs[0]  # the same log again goes where it went
    assert load_history(outs[0]).source != load_history(outs[1]).source


def test_a_fork_refusal_names_the_nearest_turns_not_all_of_them() -> None:
    # issue 33: a --fork refusal listed about 130 candidate indices
    history = import_history(MSWEA)
    turns = [i for i, m in enumerate(history.messages + history.continuation)
             if message_action(m, history.action_protocol) is not None]
    assert len(turns) > 12
    with pytest.raises(HistoryError) as caught:
        import_history(MSWEA, fork=turns[5] + 1)  # a tool result, not an action
    text = str(caught.value)
    assert f"{len(turns)} turns, messages {turns[0]} to {turns[-1]}; nearest: " in text
    assert str(turns[5]) in text and str(turns[-1] - 2) not in text.split("nearest: ")[1]
