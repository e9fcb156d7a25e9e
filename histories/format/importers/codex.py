"""Importer for Codex CLI session rollouts (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`).

Each line is `{timestamp, type, payload}`. What the model saw and said is in the
`response_item` lines (OpenAI Responses API items); the rest is metadata:

- `session_meta`: the session's id, CLI version and `base_instructions` (the system prompt,
  which becomes the first message);
- `turn_context`: the model of each turn (`provenance.model`);
- `response_item`: `message` (developer -> system, user, assistant), `reasoning` (its summary
  and content texts are the turn's `reasoning`; `encrypted_content` cannot be read and is
  counted in provenance), `function_call` / `custom_tool_call` / `local_shell_call` (tool
  calls) and their `*_output` items (tool results); other items (web searches) are counted in
  `provenance.skipped_items`. A `custom_tool_call` (freeform: raw text input, `apply_patch`) is
  held as histories/format/freeform.py says, its id listed in its turn's
  `extra.freeform_tool_calls`;
- `event_msg` `token_count`: the usage of the response just finished (`last_token_usage`), kept
  on that assistant turn as `extra.usage` in OpenAI's shape, so a continuation after the fork
  carries per-turn usage (no wall times: Codex does not log a response's duration);
- `event_msg` `user_message`: the user's prompt. The CLI logs it beside the same prompt's
  `response_item` user message, where it adds nothing; some rollouts (Codex Desktop) log the
  prompt only here, and then it is the user turn;
- `compacted`: the agent's own compaction. Its `replacement_history` is what the model saw from
  then on (the user messages kept, the instructions, and a `compaction` item whose summary is
  encrypted). The log is a recorded pair (importers/compaction.py): `clean` undoes the
  compaction; `recorded` is refused while the summary is encrypted, since it cannot be read.

The assistant items between two inputs, closed by their token count, are one assistant turn.
The rollout holds no tool schemas (`tools` stays empty).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.freeform import FREEFORM_KEY, HELD_AS, INPUT_KEY
from compaction_bench.histories.format.history import History, refusal
from compaction_bench.histories.format.importers.compaction import recorded_pair
from compaction_bench.histories.format.importers.jsonlines import line, strip_suffixes
from compaction_bench.histories.format.importers.normalize import build_history, source_record

RECORD_TYPES = ("session_meta", "turn_context", "response_item", "event_msg", "compacted")
CALLS = ("function_call", "custom_tool_call", "local_shell_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def is_codex_rollout(records: list[Any]) -> bool:
    """True for a JSON Lines file of Codex rollout records."""
    return bool(records) and all(
        isinstance(r, dict) and r.get("type") in RECORD_TYPES and isinstance(r.get("payload"),
                                                                            dict)
        for r in records) and any(r["type"] == "response_item" for r in records)


def _texts(parts: Any) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [str(p.get("text") or "") for p in parts if isinstance(p, dict) and "text" in p]


def _usage(info: Any) -> dict[str, Any] | None:
    last = info.get("last_token_usage") if isinstance(info, dict) else None
    if not isinstance(last, dict) or not isinstance(last.get("output_tokens"), int):
        return None
    return {"prompt_tokens": last.get("input_tokens"),
            "completion_tokens": last["output_tokens"],
            "total_tokens": last.get("total_tokens"),
            "completion_tokens_details": {"reasoning_tokens": last.get("reasoning_output_tokens",
                                                                       0)},
            "prompt_tokens_details": {"cached_tokens": last.get("cached_input_tokens", 0)}}


def _call(item: dict[str, Any], origin: str, where: str) -> dict[str, Any]:
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str):
        raise refusal(origin, "missing: a tool call needs its call_id", index=where,
                      field_name="payload.call_id")
    if item["type"] == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    elif item["type"] == "custom_tool_call":
        name, arguments = item.get("name"), json.dumps({INPUT_KEY: item.get("input")})
    else:
        name, arguments = "local_shell", json.dumps(item.get("action") or {})
    if not isinstance(name, str):
        raise refusal(origin, "missing: a tool call needs its name", index=where,
                      field_name="payload.name")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _output(item: dict[str, Any], origin: str, where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise refusal(origin, "missing: a tool output names the call it answers", index=where,
                      field_name="payload.call_id")
    output = item.get("output")
    if isinstance(output, dict):  # {"content": ..., "success": ...} in some versions
        output = output.get("content", json.dumps(output))
    elif isinstance(output, list):
        output = "\n".join(_texts(output))
    return {"role": "tool", "tool_call_id": call_id, "content": str(output or "")}


def codex_from_data(records: Any, path: str | Path, *, task: str | None = None,
                    fork: int | None = None, arm: str | None = None) -> History:
    """A parsed Codex CLI rollout as a History (see the module docstring)."""
    origin = str(path)
    if not isinstance(records, list) or not is_codex_rollout(records):
        raise refusal(origin, "a Codex rollout is JSON Lines of {timestamp, type, payload} "
                      f"records (type one of {', '.join(RECORD_TYPES)})")
    messages: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None  # the assistant turn being assembled
    last_assistant: dict[str, Any] | None = None
    meta: dict[str, Any] = {}
    skipped: Counter[str] = Counter()
    encrypted = 0
    segments: list[list[dict[str, Any]]] = []
    compactions: list[dict[str, Any]] = []
    prompts = 0  # user turns taken from event_msg user_message
    freeform = 0  # custom (freeform) tool calls, which the history holds as function calls
    for number, record in enumerate(records):
        where, payload = line(number), record["payload"]
        kind = payload.get("type")
        if record["type"] == "compacted":
            segments.append(messages)
            messages, current, last_assistant = [], None, None
            compactions.append(_compaction(payload, number + 1, origin, where))
            continue
        if record["type"] == "session_meta":
            meta = {"session_id": payload.get("id"), "cli_version": payload.get("cli_version"),
                    "originator": payload.get("originator")}
            instructions = payload.get("base_instructions")
            text = instructions.get("text") if isinstance(instructions, dict) else instructions
            if isinstance(text, str) and text:
                messages.append({"role": "system", "content": text})
            continue
        if record["type"] == "turn_context":
            meta.setdefault("model", payload.get("model"))
            continue
        if record["type"] == "event_msg" and kind == "user_message":
            text = str(payload.get("message") or "")
            if text and not _logged_already(messages, text):
                messages.append({"role": "user", "content": text,
                                 "extra": {"logged_as": "event_msg user_message"}})
                prompts += 1
                current = None
            continue
        if record["type"] == "event_msg":
            usage = _usage(payload.get("info")) if kind == "token_count" else None
            turn = current or last_assistant
            if usage is not None and turn is not None and "usage" not in turn["extra"]:
                turn["extra"]["usage"] = usage
                current = None  # the response is complete
            continue
        if record["type"] != "response_item":
            skipped[str(record["type"])] += 1
            continue
        role = ROLES.get(str(payload.get("role"))) if kind == "message" else None
        if kind == "message" and role != "assistant":
            if role is None:
                raise refusal(origin, f"unknown role {payload.get('role')!r} (expected "
                              f"{', '.join(ROLES)})", index=where, field_name="payload.role")
            text = "\n".join(_texts(payload.get("content")))
            if messages and (messages[-1].get("extra") or {}).get("logged_as") and _same(
                    messages[-1]["content"], text):
                messages.pop()  # the event's copy came first: the response item is the turn
                prompts -= 1
            messages.append({"role": role, "content": text})
            current = None
            continue
        if kind in OUTPUTS:
            messages.append(_output(payload, origin, where))
            current = None
            continue
        if kind not in ("message", "reasoning", *CALLS):
            skipped[str(kind)] += 1
            continue
        if current is None:
            current = {"role": "assistant", "content": "", "extra": {}}
            messages.append(current)
            last_assistant = current
        if kind == "message":
            text = "\n".join(_texts(payload.get("content")))
            current["content"] = f"{current['content']}\n{text}" if current["content"] else text
            if payload.get("phase"):
                current["extra"]["phase"] = payload["phase"]
        elif kind == "reasoning":
            thought = "\n".join(_texts(payload.get("summary")) + _texts(payload.get("content")))
            encrypted += bool(payload.get("encrypted_content"))
            if thought:
                prior = current.get("reasoning")
                current["reasoning"] = f"{prior}\n{thought}" if prior else thought
        else:
            call = _call(payload, origin, where)
            current.setdefault("tool_calls", []).append(call)
            if kind == "custom_tool_call":  # its recorded shape stays known (freeform.py)
                current["extra"].setdefault(FREEFORM_KEY, []).append(call["id"])
                freeform += 1
    provenance = {"source_format": "codex-rollout", **meta,
                  "encrypted_reasoning_items": encrypted,
                  "user_turns_from_user_message_events": prompts,
                  **({FREEFORM_KEY: {"count": freeform, "held_as": HELD_AS}}
                     if freeform else {}),
                  "skipped_items": dict(sorted(skipped.items())), "tools": "not in the log"}
    messages, fork = recorded_pair(segments, messages, compactions, arm or "clean", fork,
                                   origin, provenance, boundary="compacted")
    return build_history(messages, origin=origin, task=task or strip_suffixes(path),
                         arm=arm or "clean", fork=fork, source=source_record("codex", path),
                         provenance=provenance)


def _same(logged: Any, text: str) -> bool:
    return str(logged).strip() == text.strip()


def _logged_already(messages: list[dict[str, Any]], text: str) -> bool:
    """Whether the prompt of a `user_message` event is already a user turn: the response item
    the CLI logs beside it, after the last assistant turn."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return False
        if message.get("role") == "user" and _same(message.get("content"), text):
            return True
    return False


def _compaction(payload: dict[str, Any], number: int, origin: str, where: str) -> dict[str, Any]:
    """A `compacted` record as importers/compaction.py takes it: its replacement where every
    item of it can be read, else why not."""
    found: dict[str, Any] = {"line": number, "trigger": None, "tokens_before": None,
                             "window_number": payload.get("window_number")}
    history = payload.get("replacement_history")
    summary = payload.get("message")
    if not isinstance(history, list):
        if isinstance(summary, str) and summary:  # older rollouts: the summary as plain text
            found["replacement"] = [{"role": "user", "content": summary, "extra": {
                "compaction": f"the agent's own (Codex, line {number})"}}]
        else:
            found["unreadable"] = "it records neither a replacement history nor a summary"
        return found
    replacement: list[dict[str, Any]] = []
    hidden = 0
    for item in history:
        if not isinstance(item, dict):
            continue
        role = ROLES.get(str(item.get("role"))) if item.get("type") == "message" else None
        if role is not None:
            replacement.append({"role": role, "content": "\n".join(_texts(item.get("content")))})
        else:
            hidden += 1
    found["items_kept"] = len(replacement)
    if hidden:
        found["unreadable"] = (f"{hidden} item(s) of its replacement history (the compaction "
                               "summary) are encrypted")
    else:
        found["replacement"] = replacement
    return found
