"""Importer for Claude Code session logs (`~/.claude/projects/<project>/<session>.jsonl`).

Each line is a record. `user` and `assistant` records carry an Anthropic Messages API
`message`; everything else (summaries, file-history snapshots, progress and hook events, queue
operations, local-command system lines) is the UI's, never sent to the model, and is counted in
`provenance.skipped_records`. Subagent records (`isSidechain`) belong to another conversation and
are skipped too.

Claude Code writes one line per content block as the response streams, so the lines of one
response share `message.id`; they are merged into one assistant turn (a tool's result may be
logged before the response's next block, and still follows the merged turn):

- `text` blocks are the content; `thinking` blocks are the turn's `reasoning` (native);
  `redacted_thinking` blocks cannot be read and are counted in provenance;
- `tool_use` blocks are tool calls (`input` as the arguments JSON);
- a user record's `tool_result` blocks are tool results; its text is a user turn.

The log holds no tool schemas (`tools` stays empty) and its `usage` is the streamed count of the
line it is on (the first block's lines often say 1 or 11 output tokens), so it is kept as
`extra.claude_usage` for reference and the import is not a replay source.

**The agent's own compaction** (auto-compaction or `/compact`): a `system` record with subtype
`compact_boundary` (`compactMetadata`: trigger, tokens before) and the `isCompactSummary` user
record after it. From the boundary on, the model saw the summary, not the turns before it. Such a
log is a **recorded pair**, forked at the first action after the last boundary:
- `clean`: the model's context as it stood at the boundary (from the log's start, or from the
  previous compaction's summary), then the turns after the boundary: compaction undone;
- `recorded` (`arm=recorded`): the agent's own summary, then the same turns: what it really saw.
The summary is never a turn after the turns it replaced. `provenance.compactions` lists each
boundary (line, trigger, tokens before, the summary's size); turns before the context's start are
counted in `provenance.recorded_pair`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, refusal
from compaction_bench.histories.format.importers.compaction import recorded_pair
from compaction_bench.histories.format.importers.jsonlines import line, strip_suffixes
from compaction_bench.histories.format.importers.normalize import (
    build_history,
    source_record,
    text_of,
)

MESSAGE_RECORDS = ("user", "assistant")


def is_claude_code_log(records: list[Any]) -> bool:
    """True for a JSON Lines file of Claude Code records with at least one message record."""
    return bool(records) and all(isinstance(r, dict) and isinstance(r.get("type"), str)
                                 for r in records) and any(
        r["type"] in MESSAGE_RECORDS and isinstance(r.get("message"), dict)
        and "payload" not in r for r in records)


class _Turn:
    """One assistant response being assembled from its lines."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self.texts: list[str] = []
        self.thoughts: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def finish(self) -> None:
        self.message["content"] = "\n".join(self.texts)
        if self.thoughts:
            self.message["reasoning"] = "\n".join(self.thoughts)
        if self.calls:
            self.message["tool_calls"] = self.calls


def _tool_result(part: dict[str, Any], known: set[str], origin: str,
                 where: str) -> dict[str, Any]:
    call_id = part.get("tool_use_id")
    if not isinstance(call_id, str) or call_id not in known:
        raise refusal(origin, f"{call_id!r} answers no earlier tool_use in this file (a "
                      "session continued from another log: import that log, or cut this one "
                      "before the line)", index=where, field_name="message.content.tool_use_id")
    content = part.get("content")
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id,
                               "content": text_of(content) if isinstance(content, list)
                               else str(content if content is not None else "")}
    if part.get("is_error"):
        message["extra"] = {"is_error": True}
    return message


def claude_code_from_data(records: Any, path: str | Path, *, task: str | None = None,
                          fork: int | None = None, arm: str | None = None) -> History:
    """A parsed Claude Code session log as a History (see the module docstring)."""
    origin = str(path)
    if not isinstance(records, list) or not is_claude_code_log(records):
        raise refusal(origin, "a Claude Code session log is JSON Lines with 'user' and "
                      "'assistant' records, each holding a 'message'")
    messages: list[dict[str, Any]] = []
    segments: list[list[dict[str, Any]]] = []  # the messages before each compaction boundary
    compactions: list[dict[str, Any]] = []
    turns: dict[str, _Turn] = {}
    known_calls: set[str] = set()
    skipped: Counter[str] = Counter()
    redacted = 0
    meta: dict[str, Any] = {}
    uuids = {r.get("uuid") for r in records}
    first: dict[str, Any] = next((r for r in records if "uuid" in r), {})
    if first.get("parentUuid") is not None and first.get("parentUuid") not in uuids:
        # a log that continues another (a resumed session, or a checkpoint tool's slice of one):
        # its first turn's parent is not here, so the context started before this file
        meta["starts_mid_session"] = True
    for number, record in enumerate(records):
        where = line(number)
        kind, message = record["type"], record.get("message")
        if record.get("isSidechain"):
            skipped["sidechain"] += 1
            continue
        summary = record.get("isCompactSummary") is True and isinstance(message, dict)
        if (kind == "system" and record.get("subtype") == "compact_boundary") or (
                summary and (not compactions or "summary" in compactions[-1])):
            meta_ = record.get("compactMetadata")
            info = meta_ if isinstance(meta_, dict) else {}
            segments.append(messages)
            messages = []
            compactions.append({"line": number + 1, "trigger": info.get("trigger"),
                                "tokens_before": info.get("preTokens")})
        if summary:
            assert isinstance(message, dict)
            content = message.get("content")
            compactions[-1]["summary"] = (content if isinstance(content, str)
                                          else text_of(content) if isinstance(content, list)
                                          else "")
            compactions[-1]["summary_line"] = number + 1
            continue
        if kind not in MESSAGE_RECORDS or not isinstance(message, dict):
            skipped["sidechain" if record.get("isSidechain") else kind] += 1
            continue
        meta.setdefault("session_id", record.get("sessionId"))
        meta.setdefault("claude_code_version", record.get("version"))
        content = message.get("content")
        if kind == "user":
            if isinstance(content, str):
                messages.append({"role": "user", "content": content})
                continue
            if not isinstance(content, list):
                raise refusal(origin, "must be a string or a list of content blocks",
                              index=where, field_name="message.content")
            parts = [p for p in content if isinstance(p, dict)]
            messages.extend(_tool_result(p, known_calls, origin, where) for p in parts
                            if p.get("type") == "tool_result")
            text = text_of([p for p in parts if p.get("type") == "text"])
            if text:
                messages.append({"role": "user", "content": text})
            continue
        meta.setdefault("model", message.get("model"))
        key = str(message.get("id") or f"{where}")
        turn = turns.get(key)
        if turn is None:
            turn = turns[key] = _Turn({"role": "assistant", "content": "",
                                       "extra": {"message_id": message.get("id")}})
            messages.append(turn.message)
        if isinstance(message.get("usage"), dict):
            turn.message["extra"]["claude_usage"] = message["usage"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                turn.texts.append(str(block.get("text") or ""))
            elif block.get("type") == "thinking":
                turn.thoughts.append(str(block.get("thinking") or ""))
            elif block.get("type") == "redacted_thinking":
                redacted += 1
            elif block.get("type") == "tool_use":
                call_id = block.get("id")
                if not isinstance(call_id, str) or not isinstance(block.get("name"), str):
                    raise refusal(origin, "a tool_use block needs a string 'id' and 'name'",
                                  index=where, field_name="message.content")
                known_calls.add(call_id)
                turn.calls.append({"id": call_id, "type": "function", "function": {
                    "name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
    for turn in turns.values():
        turn.finish()
    if not messages and not any(segments) and skipped.get("sidechain"):
        raise refusal(origin, f"every message record is a subagent's ({skipped['sidechain']} "
                      "with isSidechain): this is a subagent's log, not the session's; import "
                      "the session's own <session-id>.jsonl")
    provenance = {"source_format": "claude-code", **meta,
                  "skipped_records": dict(sorted(skipped.items())),
                  "redacted_thinking_blocks": redacted,
                  "usage": "streamed per line (partial), kept as extra.claude_usage; not a "
                           "replay source", "tools": "not in the log"}
    chosen = arm or "clean"
    for compaction in compactions:
        if "summary" in compaction:
            compaction["replacement"] = [{
                "role": "user", "content": compaction["summary"],
                "extra": {"compaction": f"the agent's own (Claude Code, {compaction['trigger']}, "
                                        f"line {compaction['line']})"}}]
            compaction["summary_chars"] = len(compaction.pop("summary"))
        else:
            compaction["unreadable"] = ("no isCompactSummary record after it (a log cut at the "
                                        "boundary?)")
    messages, fork = recorded_pair(segments, messages, compactions, chosen, fork, origin,
                                   provenance, boundary="compact_boundary")
    return build_history(messages, origin=origin, task=task or strip_suffixes(path),
                         arm=chosen, fork=fork,
                         source=source_record("claude-code", path), provenance=provenance)
