"""Formats other agents write, each imported from a real sample of its own project
(samples/SOURCES.md): OpenHands event streams, Claude Code and Codex CLI session logs, and a
request/response log (generated from a study record: no public one exists) that replays. Shapes
the importer does not know are refused as "unrecognized format", never misread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.analysis.replay import ReplayAnalysis, SourceRow
from compaction_bench.bench.report.document import Bullets
from compaction_bench.bench.report.replay_sections import replay_sections
from compaction_bench.common.paths import repo_root, study_root
from compaction_bench.histories.format.freeform import freeform_ids
from compaction_bench.histories.format.history import HistoryError, load_history
from compaction_bench.histories.format.importers import (
    FORMATS,
    detect_format,
    import_history,
    import_study_record,
)
from compaction_bench.histories.format.importers.jsonlines import read_source
from compaction_bench.loadgen.replay import describe_plan, recorded_plan

SAMPLES = Path(__file__).parent / "samples"
OPENHANDS = SAMPLES / "openhands" / "wrong_initial_state.json"
CLAUDE = SAMPLES / "claudecode" / "tool_heavy.jsonl"
CLAUDE_COMPACTED = (SAMPLES / "claudecode" / "auto_compact.jsonl",
                    SAMPLES / "claudecode" / "auto_compact_2.jsonl")
CODEX = SAMPLES / "codex" / "rollout-2026-05-11T11-26-55-019e1625-first-task.jsonl"
CODEX_PROMPTS = SAMPLES / "codex" / "agentv-prompts.jsonl"
CODEX_COMPACTED = SAMPLES / "codex" / "agentv-compacted-first-window.jsonl"
RECORD = "laguna-s-2.1__atcoder-abc400_a__rep-01__seed-1411000"
REQUEST_LOG = SAMPLES / "requestlog" / f"{RECORD}.clean.jsonl"
STUDY_FORK = 4  # the record's fork: the last assistant turn of its first recorded request


def request_log_lines(record: dict[str, Any], branch: str = "clean") -> list[dict[str, Any]]:
    """A study record's branch as a request/response log: each recorded turn's exact request,
    the provider's response (with its usage) and the turn's wall time, one object per line."""
    return [{"request": t["request"], "response": t["response"],
             "wall_seconds": t["wall_seconds"]} for t in record["branches"][branch]["turns"]]


def write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
                            for line in lines), encoding="utf-8")
    return path


def refused(path: Path, **kwargs: Any) -> str:
    with pytest.raises(HistoryError) as caught:
        import_history(path, **kwargs)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(str(path)), text
    return text


# --- detection -------------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "shape"), [
    # tau-bench's results file: a list of {task_id, reward, info, traj, trial}
    ([{"task_id": 0, "reward": 1.0, "trial": 0, "info": {"task": {"user_id": "u"}},
       "traj": [{"role": "system", "content": "policy"}]}], "first item has keys"),
    ([], "an empty list"),
    ({"events": []}, "an object with keys ['events']"),
])
def test_unknown_shapes_are_unrecognized_not_misread(tmp_path: Path, content: Any,
                                                     shape: str) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(content))
    text = refused(path)
    assert "unrecognized format" in text and shape in text and "'role'" not in text
    assert all(description in text for description in FORMATS.values())


def test_a_wrapped_list_of_other_items_and_text_that_is_not_json_are_unrecognized(
        tmp_path: Path) -> None:
    # issue 33: a Gemini CLI-like {"messages": [...]} of items without 'role' got "message 0:
    # field 'role': missing"; an Aider-like Markdown history got "broken JSON at line 1"; neither
    # listed the formats. (Shapes written here: no licensed public sample of either was found.)
    wrapped = tmp_path / "session.json"
    wrapped.write_text(json.dumps({"sessionId": "s", "messages": [
        {"id": "1", "type": "user", "content": "fix the bug"},
        {"id": "2", "type": "gemini", "content": "done", "toolCalls": []}]}))
    text = refused(wrapped)
    assert text.startswith(f"{wrapped}: unrecognized format (an object whose 'messages' are not "
                           "OpenAI messages (each needs a 'role'; the first has keys "
                           "['content', 'id', 'type'])): expected one of ")
    assert all(description in text for description in FORMATS.values())
    markdown = tmp_path / ".aider.chat.history.md"
    markdown.write_text("\n# aider chat started at 2026-01-01 10:00:00\n\n#### fix it\n")
    text = refused(markdown)
    assert "unrecognized format (text that is not JSON, opening '# aider chat started" in text
    assert all(description in text for description in FORMATS.values())
    # a JSON file that breaks still says where
    broken = tmp_path / "broken.json"
    broken.write_text('[{"role": "user",\n')
    assert "broken JSON at line 2" in refused(broken)


def test_refusals_that_are_almost_a_format_say_what_to_do(tmp_path: Path) -> None:
    # an OpenHands evaluation output of several instances: one line imports
    instance = json.loads(OPENHANDS.read_text(encoding="utf-8"))
    lines = [{"instance_id": f"i{k}", "history": instance} for k in range(3)]
    many = write_lines(tmp_path / "output.jsonl", lines)
    assert "evaluation output of 3 instances" in refused(many)
    assert "head -n 1 output.jsonl > one.json" in refused(many)
    # a Claude Code file holding only a subagent's records
    records = [json.loads(text) for text in CLAUDE.read_text(encoding="utf-8").splitlines()]
    side = write_lines(tmp_path / "agent-x.jsonl", [{**r, "isSidechain": True} for r in records])
    text = refused(side)
    assert "every message record is a subagent's" in text and "```bash" not in text
    # a message list that declares tools but makes no tool call
    talk = tmp_path / "talk.json"
    talk.write_text(json.dumps({"tools": [{"type": "function", "function": {"name": "bash"}}],
                                "messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}))
    text = refused(talk)
    assert "expected one tool call" in text and "declares tools" in text


def test_each_sample_is_detected_as_its_format() -> None:
    found = {path.parent.name: detect_format(read_source(path))
             for path in (OPENHANDS, CLAUDE, CODEX, REQUEST_LOG)}
    assert found == {"openhands": "openhands", "claudecode": "claude-code", "codex": "codex",
                     "requestlog": "request-log"}
    assert detect_format([{"role": "user", "content": "hi"}]) == "openai-messages"


def test_a_broken_json_lines_file_names_its_line(tmp_path: Path) -> None:
    text = CLAUDE.read_text(encoding="utf-8")
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 40], encoding="utf-8")  # a log cut off mid-write
    lines = text.count("\n")
    assert f"line {lines}: broken JSON" in refused(cut)
    gap = tmp_path / "gap.jsonl"
    first, rest = text.split("\n", 1)
    gap.write_text(f"{first}\n\n{rest}", encoding="utf-8")
    assert "line 2: empty line" in refused(gap)
    broken = tmp_path / "broken.json"
    broken.write_text('{"messages": [\n')
    assert "broken JSON at line 2" in refused(broken)  # a document keeps its own error


# --- OpenHands -------------------------------------------------------------------------------

def test_openhands_events_import_with_model_responses_and_usage() -> None:
    history = import_history(OPENHANDS)
    full = history.messages + history.continuation
    assert [m["role"] for m in full] == ["user", *["assistant", "tool"] * 3, "assistant"]
    calls = [m["tool_calls"][0]["function"]["name"] for m in full if m["role"] == "assistant"]
    assert calls == ["str_replace_editor", "execute_bash", "str_replace_editor", "finish"]
    assert json.loads(full[3]["tool_calls"][0]["function"]["arguments"])["command"].startswith(
        "mv /workspace/game_2048.py")
    events = json.loads(OPENHANDS.read_text())
    usage = events[1]["tool_call_metadata"]["model_response"]["usage"]
    assert full[1]["extra"]["usage"] == usage and full[2]["tool_call_id"] == full[1][
        "tool_calls"][0]["id"]
    assert history.provenance["model"] == "claude-3-5-sonnet-20241022"
    assert history.task == "wrong_initial_state" and history.action_protocol == "tool_calls"


def test_openhands_usage_makes_the_continuation_replayable() -> None:
    history = import_history(OPENHANDS, fork=1)  # the first response: three recorded after it
    events = json.loads(OPENHANDS.read_text())
    lengths = [e["tool_call_metadata"]["model_response"]["usage"]["completion_tokens"]
               for e in events if e.get("action") and e["source"] == "agent"]
    plan = recorded_plan(history, "openhands", "clean")
    assert [t.completion_tokens for t in plan.turns] == lengths[1:]
    assert plan.recorded_wall_s is None  # OpenHands logs no response durations


def test_openhands_evaluation_output_and_environment_events(tmp_path: Path) -> None:
    events = json.loads(OPENHANDS.read_text())
    state = {"id": 1, "source": "environment", "observation": "agent_state_changed",
             "content": "", "extras": {"agent_state": "running"}}
    path = tmp_path / "output.json"
    path.write_text(json.dumps({"instance_id": "repo__issue-1",
                                "history": [events[0], state, *events[1:]]}))
    history = import_history(path)
    assert history.task == "repo__issue-1"
    assert history.provenance["skipped_events"] == {"agent_state_changed": 1}
    assert len(history.messages + history.continuation) == len(events)


# --- Claude Code -----------------------------------------------------------------------------

def test_claude_code_thinking_is_reasoning_and_streamed_lines_are_one_turn() -> None:
    history = import_history(CLAUDE)
    full = history.messages + history.continuation
    assert history.reasoning_mode == "native" and history.tools is None
    thinking = [m for m in full if m.get("reasoning")]
    assert len(thinking) == 1 and thinking[0]["reasoning"].startswith(
        "The user wants me to research why scrolling in xterm.js")
    # one response streamed over four lines: text, thinking and two tool calls
    assert [c["function"]["name"] for c in thinking[0]["tool_calls"]] == ["WebSearch", "Glob"]
    # Read's result was logged between the response's two tool_use lines: still one turn
    two = next(i for i, m in enumerate(full) if m.get("tool_calls") and len(
        m["tool_calls"]) == 2 and m["tool_calls"][0]["function"]["name"] == "Read")
    assert [m["role"] for m in full[two + 1: two + 3]] == ["tool", "tool"]
    assert history.provenance["skipped_records"] == {"file-history-snapshot": 3,
                                                     "progress": 10, "queue-operation": 2,
                                                     "system": 2}
    assert history.provenance["model"] == "claude-opus-4-6"
    assert all("usage" not in (m.get("extra") or {}) for m in full)  # not a replay source


def test_claude_code_tool_result_without_its_call_is_refused_by_line(tmp_path: Path) -> None:
    lines = CLAUDE.read_text(encoding="utf-8").splitlines()
    first_call = next(i for i, text in enumerate(lines) if '"tool_use"' in text)
    kept = lines[:first_call] + lines[first_call + 1:]
    path = tmp_path / "resumed.jsonl"
    path.write_text("\n".join(kept) + "\n")
    text = refused(path)
    assert "answers no earlier tool_use" in text and "field 'message.content.tool_use_id'" in text
    result = next(i for i, entry in enumerate(kept) if '"tool_result"' in entry)
    assert f": line {result + 1}:" in text


@pytest.mark.parametrize(("sample", "boundary", "tokens"), [
    (CLAUDE_COMPACTED[0], 31, 155250), (CLAUDE_COMPACTED[1], 37, 155461)])
def test_the_agents_own_compaction_is_a_recorded_pair_never_a_turn_after_what_it_replaced(
        sample: Path, boundary: int, tokens: int) -> None:
    # issue 33: before, the summary was imported as a user turn after the 17 (21) messages it
    # replaced, so clean.json claimed the model saw both
    lines = [json.loads(text) for text in sample.read_text(encoding="utf-8").splitlines()]
    assert lines[boundary - 1]["subtype"] == "compact_boundary"
    summary = lines[boundary]["message"]["content"]
    assert lines[boundary]["isCompactSummary"] is True
    clean = import_history(sample)
    recorded = import_history(sample, arm="recorded")
    assert clean.arm == "clean" and recorded.arm == "recorded"
    for history in (clean, recorded):
        assert not any(m.get("content") == summary for m in history.continuation)
        (compaction,) = history.provenance["compactions"]
        assert compaction == {"line": boundary, "trigger": "auto", "tokens_before": tokens,
                              "summary_line": boundary + 1, "summary_chars": len(summary)}
    before = clean.provenance["recorded_pair"]["clean_messages_before_the_boundary"]
    # clean: the context as it stood at the boundary, no summary in it; recorded: the summary
    # alone in its place; both fork at the same action and continue alike
    assert all(m.get("content") != summary for m in clean.messages)
    assert recorded.messages[0] == {"role": "user", "content": summary, "extra": {
        "compaction": f"the agent's own (Claude Code, auto, line {boundary})"}}
    assert clean.messages[before:] == recorded.messages[1:]
    assert clean.fork is not None and recorded.fork is not None
    assert clean.fork.action == recorded.fork.action
    assert clean.continuation == recorded.continuation
    assert clean.provenance["starts_mid_session"] is True  # Entire's slice of a session
    assert "mid-session" in clean.provenance["recorded_pair"]["clean_context"]


def test_a_compaction_pair_refuses_a_fork_and_a_log_without_one_refuses_recorded() -> None:
    assert "fork= does not apply" in refused(CLAUDE_COMPACTED[0], fork=3)
    assert "records none (no compact_boundary record)" in refused(CLAUDE, arm="recorded")
    assert "has arms clean and recorded, not 'self'" in refused(CLAUDE_COMPACTED[0], arm="self")


def test_a_second_compaction_starts_the_clean_context_at_the_first_ones_summary(
        tmp_path: Path) -> None:
    # two real sessions' compactions, one after the other: the second session's records follow
    # the first's whole file, so the model's context at the second boundary began with the
    # first boundary's summary
    first, second = (p.read_text(encoding="utf-8") for p in CLAUDE_COMPACTED)
    path = tmp_path / "two.jsonl"
    path.write_text(first.rstrip("\n") + "\n" + second, encoding="utf-8")
    clean = import_history(path)
    one = import_history(CLAUDE_COMPACTED[0])
    assert [c["line"] for c in clean.provenance["compactions"]] == [31, 54 + 37]
    pair = clean.provenance["recorded_pair"]
    assert pair["clean_context"] == "the replacement of the compaction at line 31"
    assert pair["messages_before_the_context"] == one.provenance["recorded_pair"][
        "clean_messages_before_the_boundary"]
    assert clean.messages[0]["extra"]["compaction"].endswith("line 31)")


# --- Codex CLI -------------------------------------------------------------------------------

def test_codex_rollout_imports_with_its_prompt_calls_and_per_response_usage() -> None:
    history = import_history(CODEX)
    full = history.messages + history.continuation
    assert [m["role"] for m in full] == ["system", "system", "user", "user", "assistant",
                                         "tool", "assistant", "tool", "assistant"]
    assert full[0]["content"].startswith("You are Codex")  # base_instructions
    assert [c["function"]["name"] for m in full for c in m.get("tool_calls", [])] == [
        "exec_command", "write_stdin"]
    token_counts = [r["payload"]["info"]["last_token_usage"] for r in read_source(CODEX)
                    if r["payload"].get("type") == "token_count"]
    usages = [m["extra"]["usage"] for m in full if m["role"] == "assistant"]
    assert [u["completion_tokens"] for u in usages] == [t["output_tokens"] for t in token_counts]
    assert usages[0]["completion_tokens_details"]["reasoning_tokens"] == token_counts[0][
        "reasoning_output_tokens"]
    assert history.provenance["encrypted_reasoning_items"] == 1  # present, not readable
    assert history.provenance["model"] == "gpt-5.5"
    plan = recorded_plan(history, "codex", "clean")  # per-response usage: a replay source
    assert [t.completion_tokens for t in plan.turns] == [token_counts[-1]["output_tokens"]]


# --- request/response logs -------------------------------------------------------------------

def study_record() -> dict[str, Any]:
    return json.loads((study_root() / "records" / f"{RECORD}.json").read_text())


def test_the_request_log_fixture_is_what_the_helper_writes(tmp_path: Path) -> None:
    again = write_lines(tmp_path / "again.jsonl", request_log_lines(study_record()))
    assert again.read_bytes() == REQUEST_LOG.read_bytes()


def test_a_request_log_imports_as_the_study_record_it_was_made_from() -> None:
    history = import_history(REQUEST_LOG, fork=STUDY_FORK)
    study = import_study_record(study_root() / "records" / f"{RECORD}.json")["clean"]
    kept = ("role", "content", "reasoning", "tool_calls", "tool_call_id")

    def core(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: m[k] for k in kept if k in m} for m in messages]

    assert core(history.messages) == core(study.messages) and history.fork == study.fork
    assert core(history.continuation) == core(study.continuation)
    assert history.tools == study.tools
    for ours, theirs in zip(history.continuation, study.continuation, strict=True):
        for key in ("usage", "wall_seconds"):
            assert (ours.get("extra") or {}).get(key) == (theirs.get("extra") or {}).get(key)


def test_a_request_log_plans_its_replay_at_the_recorded_lengths() -> None:
    history = import_history(REQUEST_LOG, fork=STUDY_FORK)
    plan = recorded_plan(history, "requestlog", "clean")
    turns = study_record()["branches"]["clean"]["turns"]
    assert [t.completion_tokens for t in plan.turns] == [
        t["response"]["usage"]["completion_tokens"] for t in turns]
    assert [t.recorded_prompt_tokens for t in plan.turns] == [
        t["response"]["usage"]["prompt_tokens"] for t in turns]
    assert [t.recorded_wall_s for t in plan.turns] == [t["wall_seconds"] for t in turns]
    assert plan.tools == turns[0]["request"]["tools"]


@pytest.mark.parametrize(("change", "needle"), [
    (lambda lines: lines[1]["response"].pop("usage"), "line 2: field 'response.usage'"),
    (lambda lines: lines[1]["request"]["messages"].pop(0),
     "line 2: field 'request.messages': is not the previous request plus its response"),
    (lambda lines: lines[0]["response"].update(choices=[]),
     "line 1: field 'response.choices[0].message'"),
    (lambda lines: lines[1].update(wall_seconds="2s"), "line 2: field 'wall_seconds'"),
])
def test_bad_request_logs_are_refused_naming_line_and_field(
        tmp_path: Path, change: Any, needle: str) -> None:
    lines = request_log_lines(study_record())
    change(lines)
    assert needle in refused(write_lines(tmp_path / "log.jsonl", lines))


@pytest.mark.e2e
def test_an_imported_request_log_replays_against_the_fake_engine(tmp_path: Path) -> None:
    """The user's path: `histories import` the log as a replay source's clean.json, then a
    replay block of it with clean and a history policy, every turn forced to its recorded
    length."""
    from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

    source = tmp_path / "mylog"
    imported = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "histories", "import", str(REQUEST_LOG),
         str(source / "clean.json"), "--fork", str(STUDY_FORK)],
        cwd=repo_root(), capture_output=True, text=True, timeout=120, check=False)
    assert imported.returncode == 0, imported.stderr
    recorded = [m["extra"]["usage"]["completion_tokens"]
                for m in load_history(source / "clean.json").continuation
                if m["role"] == "assistant"]
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=0.5)) as fake:
        done = subprocess.run(
            [sys.executable, "-m", "compaction_bench", "bench", "source=replay",
             "profile=cpu-tiny", f"base_url={fake.api_url}", "selfcheck=0", f"records={source}",
             "arms=clean,delete-all-thinking", "blocks=1", "run_id=mylog"],
            cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path / "results")})
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "results" / "mylog"
    arms = [json.loads(x) for x in (run / "arms.jsonl").read_text().splitlines() if x.strip()]
    assert [a["arm"] for a in arms] == ["clean", "delete-all-thinking"]
    for arm in arms:  # the policy arm: clean's history thinned, clean's recorded turns
        assert arm["status"] == "complete" and arm["terminal_status"] == "Replayed", arm
        assert arm["forced_requests"] == arm["forced_exact"] == len(recorded) == 2
        assert arm["recorded_completion_tokens"] == sum(recorded)


def test_codex_prompts_logged_only_as_user_message_events_are_user_turns(tmp_path: Path) -> None:
    # issue 33: Codex Desktop logs a prompt only as an event_msg user_message; the importer
    # dropped it. The CLI sample logs each prompt both ways: its turns must not double, and the
    # same file without the response items' copies (as Desktop writes it) keeps every prompt
    lines = CODEX_PROMPTS.read_text(encoding="utf-8").splitlines()
    events = [json.loads(text)["payload"]["message"] for text in lines
              if '"type":"user_message"' in text]
    assert len(events) == 5
    both = import_history(CODEX_PROMPTS)
    full = both.messages + both.continuation
    assert both.provenance["user_turns_from_user_message_events"] == 0
    assert all(sum(m["content"].strip() == e.strip() for m in full if m["role"] == "user") == 1
               for e in events)
    def prompt_item(record: dict[str, Any]) -> bool:
        payload = record["payload"]
        return record["type"] == "response_item" and payload.get("role") == "user" and any(
            "".join(p.get("text", "") for p in payload["content"]).strip() == e.strip()
            for e in events)

    only_events = [text for text in lines if not prompt_item(json.loads(text))]
    assert len(only_events) == len(lines) - 5
    path = tmp_path / "desktop-like.jsonl"
    path.write_text("\n".join(only_events) + "\n", encoding="utf-8")
    alone = import_history(path)
    assert alone.provenance["user_turns_from_user_message_events"] == 5
    prompts = [m for m in alone.messages + alone.continuation
               if (m.get("extra") or {}).get("logged_as") == "event_msg user_message"]
    assert [m["content"] for m in prompts] == events


def test_codex_compaction_is_recorded_and_its_encrypted_summary_is_no_arm() -> None:
    # issue 33: the `compacted` record was only counted, and the turns before it stayed in the
    # history as if the model had seen them after it
    clean = import_history(CODEX_COMPACTED)
    (compaction,) = clean.provenance["compactions"]
    assert compaction["line"] == 272 and compaction["items_kept"] == 9
    assert "encrypted" in compaction["unreadable"]
    pair = clean.provenance["recorded_pair"]
    assert pair["boundary_line"] == 272 and pair["recorded"].startswith("none: ")
    assert clean.fork is not None and clean.fork.message_index == pair[
        "clean_messages_before_the_boundary"]  # the first action after the boundary
    assert clean.fork.pending_result is not None
    assert "cannot be a recorded arm" in refused(CODEX_COMPACTED, arm="recorded")
    assert "fork= does not apply" in refused(CODEX_COMPACTED, fork=5)


def test_anthropic_content_parts_in_a_message_list_become_tool_calls_and_results(
        tmp_path: Path) -> None:
    # issue 33: a list of Anthropic Messages API messages (what Cline and Roo Code log) passed as
    # OpenAI messages with every tool_use part dropped. The real Claude Code sample's `message`
    # objects are such a list: imported that way, it must give the Claude Code import's calls.
    records = [json.loads(text) for text in CLAUDE.read_text(encoding="utf-8").splitlines()]
    messages = [{"role": r["message"]["role"], "content": r["message"]["content"]}
                for r in records if r.get("type") in ("user", "assistant")
                and not r.get("isSidechain") and isinstance(r.get("message"), dict)]
    assert sum(isinstance(m["content"], list) and any(
        p.get("type") == "tool_use" for p in m["content"]) for m in messages) > 0
    path = tmp_path / "anthropic.json"
    path.write_text(json.dumps(messages), encoding="utf-8")
    listed = import_history(path)
    logged = import_history(CLAUDE)

    def calls(history: Any) -> list[tuple[str, str]]:
        return [(c["id"], c["function"]["name"]) for m in history.messages + history.continuation
                for c in m.get("tool_calls") or []]

    def results(history: Any) -> list[str]:
        return [m["tool_call_id"] for m in history.messages + history.continuation
                if m["role"] == "tool"]

    assert calls(listed) == calls(logged) and len(calls(listed)) > 5
    assert results(listed) == results(logged)
    converted = listed.provenance["anthropic_parts"]
    assert converted["tool_use"] == len(calls(listed)) and converted["thinking"] >= 1
    # a part the suite cannot replay is refused by name, never dropped
    image = [*messages[:1], {"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "AAAA"}}]}]
    bad = tmp_path / "image.json"
    bad.write_text(json.dumps(image), encoding="utf-8")
    assert "a content part of type 'image' cannot be imported" in refused(bad)


def test_codex_freeform_calls_keep_their_recorded_shape_and_the_report_names_theirs() -> None:
    # issue 33: custom (freeform) tool calls such as apply_patch became {"input": ...} function
    # arguments, so a replay sent another call shape, unrecorded. Each call's turn now lists it,
    # so the recorded call is rebuilt from the history byte for byte; the replay plan counts the
    # calls it sends as function calls (vLLM's chat completions take no other kind) and the
    # report says so
    recorded = [r["payload"] for r in read_source(CODEX_PROMPTS) if r["type"] == "response_item"
                and r["payload"].get("type") == "custom_tool_call"]
    assert len(recorded) == 4
    history = import_history(CODEX_PROMPTS)
    full = history.messages + history.continuation
    rebuilt = [{"call_id": c["id"], "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"])["input"]}
               for m in full for c in m.get("tool_calls") or [] if c["id"] in freeform_ids(m)]
    assert rebuilt == [{k: p[k] for k in ("call_id", "name", "input")} for p in recorded]
    note = history.provenance["freeform_tool_calls"]
    assert note["count"] == 4 and "a replay sends that shape" in note["held_as"]
    assert "freeform_tool_calls" not in import_history(CODEX).provenance
    plan = recorded_plan(history, "agentv", "clean")
    assert plan.freeform_tool_calls == describe_plan(plan)["freeform_tool_calls"] == 4
    row = SourceRow(source="agentv", model="gpt-5.5", recorded_by=None, blocks=1,
                    recorded_prompt={}, served_prompt={},
                    freeform_tool_calls=plan.freeform_tool_calls)
    replay = ReplayAnalysis(sources=(row,), skipped={}, continuation={}, forced=(), splits=(),
                            identical=(), tool_time=None, measured_on="here", recorded={},
                            side_by_side=True)
    what = replay_sections(replay, ["clean"])[0]
    said = [item for part in what.parts if isinstance(part, Bullets) for item in part.items]
    assert [item for item in said if "freeform" in item] == [
        'agentv: 4 freeform (custom) tool call(s) sent as function calls with {"input": <the '
        "recorded text>}, not in their recorded shape: vLLM's chat completions take function "
        "tool calls only, so those prompt tokens are the text as a JSON string"]
