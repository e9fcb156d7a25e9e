"""Shared steps of every importer: normalize messages, detect modes, pick the fork, build a History.

Normalization is idempotent (a normalized message comes back unchanged), which is what makes
`import_history(export_minisweagent(h))` equal to `h`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from compaction_bench.common.paths import repo_root
from compaction_bench.histories.format.history import (
    Fork,
    History,
    HistoryError,
    message_action,
    refusal,
    validate_messages,
)

# Keys a history message keeps at top level; anything else that is not null moves to
# extra.source_fields, so provider-specific fields are kept but never sent back to a server.
MESSAGE_KEYS = ("role", "content", "reasoning", "tool_calls", "tool_call_id", "name", "extra")


def file_sha256(path: str | Path) -> str:
    """sha256 of the file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def source_record(importer: str, path: str | Path) -> dict[str, Any]:
    """The `source` entry of an imported history (a path inside the checkout is stored relative
    to it, so shipped files do not carry one machine's folders)."""
    shown = Path(path)
    with contextlib.suppress(ValueError):
        shown = Path(path).resolve().relative_to(repo_root().resolve())
    return {"importer": importer, "path": str(shown), "sha256": file_sha256(path)}


def default_task(path: str | Path) -> str:
    """Task id from a file name: `x.traj.json`, `x.traj`, `x.json` all give `x`."""
    name = Path(path).name
    for suffix in (".traj.json", ".traj", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def text_of(content: Any) -> Any:
    """Content parts ([{"type": "text", "text": ...}]) joined into one string; others unchanged."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content
                         if isinstance(part, dict) and part.get("type", "text") == "text")
    return content


THINKING_PARTS = ("thinking", "redacted_thinking")  # Anthropic's reasoning content parts
RAW_REASONING = "extra.response.choices[0].message.reasoning"


def _thinking_text(content: Any) -> str | None:
    """The text of Anthropic `thinking` content parts, joined; None when there are none."""
    if not isinstance(content, list):
        return None
    texts = [part["thinking"] for part in content if isinstance(part, dict)
             and part.get("type") == "thinking" and isinstance(part.get("thinking"), str)]
    return "\n".join(texts) if texts else None


def _raw_reasoning(raw: dict[str, Any]) -> str | None:
    """Reasoning kept only inside the raw provider response (mini-swe-agent 1.x via OpenRouter
    records `extra.response`), never in the message the run sent back."""
    extra = raw.get("extra")
    response = extra.get("response") if isinstance(extra, dict) else None
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return None
    found = message.get("reasoning") or message.get("reasoning_content")
    return found if isinstance(found, str) and found.strip() else None


def reasoning_notes(raw_messages: list[Any]) -> dict[str, Any]:
    """What the provenance says about reasoning the source held: where it was read from, and
    reasoning that is present but not used (never dropped without a word)."""
    thinking = redacted = raw_only = 0
    for raw in raw_messages:
        if not isinstance(raw, dict) or raw.get("role") != "assistant":
            continue
        content = raw.get("content")
        parts: list[Any] = content if isinstance(content, list) else []
        thinking += _thinking_text(parts) is not None
        redacted += any(isinstance(p, dict) and p.get("type") == "redacted_thinking"
                        for p in parts)
        has_field = any(isinstance(raw.get(k), str | list) and raw.get(k)
                        for k in ("reasoning", "reasoning_content", "reasoning_details"))
        raw_only += not has_field and _raw_reasoning(raw) is not None
    notes: dict[str, Any] = {}
    if thinking:
        notes["reasoning_read_from"] = (f"Anthropic 'thinking' content parts ({thinking} "
                                        "assistant turns), as the turn's reasoning")
    unused = []
    if raw_only:
        unused.append({"field": RAW_REASONING, "turns": raw_only,
                       "why": "kept only in the raw response: the run never sent it back to "
                       "the model, so the history (what was sent) leaves it out; it stays in "
                       "each message's extra.response"})
    if redacted:
        unused.append({"field": "content parts of type 'redacted_thinking'", "turns": redacted,
                       "why": "encrypted by the provider: no text to count or rewrite"})
    if unused:
        notes["reasoning_unused"] = unused
    return notes


# Content parts a message list may hold: text (OpenAI's and Anthropic's), and the Messages API's
# own parts that Anthropic-API agents (Cline, Roo Code) log. Anything else is refused by name.
ANTHROPIC_PARTS = ("text", "thinking", "redacted_thinking", "tool_use", "tool_result")


def anthropic_parts(messages: Any, origin: str) -> tuple[Any, dict[str, int]]:
    """A message list whose content parts are the Anthropic Messages API's, in our form:
    `tool_use` parts become the turn's tool calls, `tool_result` parts tool messages (before
    the user's text, as Anthropic orders them), `thinking` stays for `normalize_message`. A part
    of another type (`image`, `document`, ...) is refused naming it, never dropped. Returns the
    messages and how many parts of each converted type there were (empty: nothing to do)."""
    if not isinstance(messages, list):
        return messages, {}
    out: list[Any] = []
    counts: dict[str, int] = {}
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = [p for p in content if isinstance(p, dict)]
        for part in parts:
            kind = str(part.get("type", "text"))
            if kind not in ANTHROPIC_PARTS:
                raise refusal(origin, f"a content part of type {kind!r} cannot be imported (the "
                              "suite replays text, tool calls and reasoning only): remove the "
                              "part, or put what it showed into text, and import again",
                              index=index, field_name="content")
            if kind in ("tool_use", "tool_result", "thinking"):
                counts[kind] = counts.get(kind, 0) + 1
        kept = [p for p in parts if p.get("type", "text") not in ("tool_use", "tool_result")]
        uses = [p for p in parts if p.get("type") == "tool_use"]
        results = [p for p in parts if p.get("type") == "tool_result"]
        role = message.get("role")
        if (uses and role != "assistant") or (results and role != "user"):
            raise refusal(origin, f"a {'tool_use' if uses else 'tool_result'} part in a "
                          f"{role!r} message (Anthropic puts tool_use in assistant turns and "
                          "tool_result in user turns)", index=index, field_name="content")
        for result in results:
            out.append(_anthropic_result(result, origin, index))
        if results and not any(str(p.get("text") or "").strip() for p in kept):
            continue  # the user turn held only tool results
        converted = {**message, "content": kept}
        if uses:
            calls = [{"id": p.get("id"), "type": "function", "function": {
                "name": p.get("name"), "arguments": json.dumps(p.get("input") or {})}}
                for p in uses]
            prior = message.get("tool_calls")
            converted["tool_calls"] = [*(prior if isinstance(prior, list) else []), *calls]
        out.append(converted)
    return out, counts


def _anthropic_result(part: dict[str, Any], origin: str, index: int) -> dict[str, Any]:
    content = part.get("content")
    if isinstance(content, list):
        kinds = {str(p.get("type", "text")) for p in content if isinstance(p, dict)}
        if kinds - {"text"}:
            raise refusal(origin, f"a tool_result holds a part of type "
                          f"{sorted(kinds - {'text'})[0]!r}, which cannot be imported (text "
                          "only): remove it and import again", index=index,
                          field_name="content")
        content = text_of(content)
    result: dict[str, Any] = {"role": "tool", "tool_call_id": part.get("tool_use_id"),
                              "content": "" if content is None else str(content)}
    if part.get("is_error"):
        result["extra"] = {"is_error": True}
    return result


def _normalize_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    call = dict(call)
    call.setdefault("type", "function")
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
        call["function"] = {**function, "arguments": json.dumps(function["arguments"])}
    return call


def normalize_message(raw: dict[str, Any]) -> dict[str, Any]:
    """One message in our form: `reasoning` from reasoning / reasoning_content /
    reasoning_details / Anthropic `thinking` content parts, text content parts joined, empty
    tool_calls dropped, null fields dropped, other
    provider fields kept under extra.source_fields. Idempotent."""
    message: dict[str, Any] = {"role": raw.get("role")}
    message["content"] = text_of(raw.get("content"))
    reasoning = raw.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = raw.get("reasoning_content")
    if not isinstance(reasoning, str) and isinstance(raw.get("reasoning_details"), list):
        texts = [d.get("text") for d in raw["reasoning_details"] if isinstance(d, dict)]
        reasoning = "\n".join(t for t in texts if isinstance(t, str)) or None
    if not isinstance(reasoning, str):
        reasoning = _thinking_text(raw.get("content"))
    if isinstance(reasoning, str):
        message["reasoning"] = reasoning
    calls = raw.get("tool_calls")
    if isinstance(calls, list) and calls:
        message["tool_calls"] = [_normalize_call(c) for c in calls]
    elif calls:  # not a list (`tool_calls: 1`): kept, so validation refuses it by field
        message["tool_calls"] = calls
    if message["content"] is None and not message.get("tool_calls"):
        message["content"] = ""
    for key in ("tool_call_id", "name"):
        if raw.get(key) is not None:
            message[key] = raw[key]
    extra = dict(raw["extra"]) if isinstance(raw.get("extra"), dict) else {}
    folded = {"reasoning", "reasoning_content", "reasoning_details"}
    leftovers = {k: v for k, v in raw.items()
                 if k not in MESSAGE_KEYS and k not in folded and v is not None}
    if leftovers:
        prior = extra.get("source_fields", {})
        extra["source_fields"] = {**(prior if isinstance(prior, dict) else {"value": prior}),
                                  **leftovers}
    if extra or "extra" in raw:
        message["extra"] = extra
    return message


def detect_modes(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(reasoning_mode, action_protocol): native when any assistant turn carries a reasoning
    field, tool_calls when any assistant turn makes a tool call."""
    assistants = [m for m in messages if m.get("role") == "assistant"]
    mode = "native" if any(m.get("reasoning") for m in assistants) else "tagged-visible"
    protocol = "tool_calls" if any(m.get("tool_calls") for m in assistants) else "text"
    return mode, protocol


def _observation_for(messages: list[dict[str, Any]], index: int, action: dict[str, Any],
                     protocol: str) -> str | None:
    """The result shown after the action at `index`, if the source recorded it."""
    for message in messages[index + 1:]:
        if protocol == "tool_calls":
            if message.get("role") == "tool" and message.get("tool_call_id") == action.get(
                    "tool_call_id"):
                return str(message.get("content") or "")
        elif message.get("role") in ("user", "tool"):
            return str(message.get("content") or "")
        elif message.get("role") == "assistant":
            return None
    return None


def listed(indices: list[int], *, near: int | None = None, most: int = 12) -> str:
    """Message indices for a refusal: all of a short list; of a long one its count, range and
    the few nearest `near` (or its ends), so the line stays one line."""
    if not indices:
        return "none"
    if len(indices) <= most:
        return str(indices)
    shown = (sorted(sorted(indices, key=lambda i: abs(i - near))[:6]) if near is not None
             else [*indices[:3], *indices[-3:]])
    return (f"{len(indices)} turns, messages {indices[0]} to {indices[-1]}; "
            f"{'nearest' if near is not None else 'first and last'}: {shown}")


def _fork_refusal(origin: str, problem: str, candidates: list[int],
                  index: int | None = None) -> HistoryError:
    return refusal(origin, f"{problem}; pick a turn with --fork N (N indexes all messages from "
                   f"0; turns with an action: {listed(candidates)})", index=index,
                   field_name="fork")


def cut_at_fork(messages: list[dict[str, Any]], protocol: str, requested: int | None, *,
                origin: str, tools: bool = False
                ) -> tuple[list[dict[str, Any]], Fork, list[dict[str, Any]], str]:
    """Split messages at the fork: (history, fork, continuation, why this fork).

    `requested` is a message index (of all messages, from 0). None picks the last action whose
    result was recorded: a run's final `submit` usually has none (mini-swe-agent 2 answers it
    with a `role: exit` message, SWE-agent's history ends at it), and an arm needs the result
    it will be shown. No such action is refused here, naming the file and `--fork`.
    """
    candidates = [i for i, m in enumerate(messages) if message_action(m, protocol) is not None]
    if requested is None:
        if not candidates:
            raise refusal(origin, "no assistant turn with an action to fork at (expected "
                          + ("one tool call" if protocol == "tool_calls" or tools else
                             "one fenced ```bash block") + " in some assistant message"
                          + ("; the file declares tools, but no assistant turn calls one: a "
                             "log that kept its tool calls elsewhere?" if tools
                             and protocol != "tool_calls" else "") + ")",
                          field_name="fork")
        answered = [i for i in candidates if _result_of(messages, i, protocol) is not None]
        if not answered:
            raise _fork_refusal(origin, "no action has a recorded result to give the arms after "
                                "the fork", candidates)
        index = answered[-1]
        later = [i for i in candidates if i > index]
        why = (f"default: the last action whose result was recorded (message {index})"
               + (f"; the later action at {later} has no recorded result" if len(later) == 1
                  else f"; the later actions at {later} have no recorded result"
                  if later else ""))
    else:
        index = requested
        if not 0 <= index < len(messages):
            raise refusal(origin, f"requested fork at message {index} is out of range (the "
                          f"file has {len(messages)} messages)", field_name="fork")
        if index not in candidates:
            role = messages[index].get("role")
            reason = ("it is not an assistant turn" if role != "assistant"
                      else "that assistant turn requests no single action")
            raise refusal(origin, f"cannot fork here: {reason} (turns with an action: "
                          f"{listed(candidates, near=index)})", index=index, field_name="fork")
        why = f"requested: --fork {index}"
        if _result_of(messages, index, protocol) is None:
            why += " (its result was not recorded, so no arm file can be written from it)"
    action = message_action(messages[index], protocol)
    assert action is not None
    if action.get("tool_call_id") is None:
        action.pop("tool_call_id", None)
    fork = Fork(message_index=index, action=action,
                pending_result=_result_of(messages, index, protocol))
    return messages[: index + 1], fork, messages[index + 1:], why


def _result_of(messages: list[dict[str, Any]], index: int, protocol: str) -> str | None:
    action = message_action(messages[index], protocol)
    return None if action is None else _observation_for(messages, index, action, protocol)


def minisweagent_info(info: dict[str, Any] | None) -> dict[str, Any]:
    """`info` with the keys mini-swe-agent always writes (exit_status, submission, model_stats);
    a history at a fork has not exited, so exit_status and submission are empty."""
    result = dict(info or {})
    result.setdefault("exit_status", "")
    result.setdefault("submission", "")
    result.setdefault("model_stats", {"instance_cost": 0.0, "api_calls": 0})
    return result


def build_history(messages: Any, *, origin: str, task: str, arm: str,
                  fork: int | None, source: dict[str, Any] | None,
                  info: dict[str, Any] | None = None,
                  provenance: dict[str, Any] | None = None,
                  tools: list[dict[str, Any]] | None = None,
                  marked_fork: bool = False) -> History:
    """Normalize, validate, cut at the fork and return a checked History. Its provenance says
    which fork was chosen and why (`fork_choice`), unless the source itself marks the fork
    (`marked_fork`, a study record), and what reasoning the source held (`reasoning_notes`)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise refusal(origin, "must be a list of message objects", field_name="messages")
    normalized = [normalize_message(m) for m in messages]
    validate_messages(normalized, origin=origin)
    mode, protocol = detect_modes(normalized)
    kept, cut, rest, why = cut_at_fork(normalized, protocol, fork, origin=origin,
                                       tools=bool(tools))
    notes = {**reasoning_notes(messages), **dict(provenance or {})}
    history = History(messages=kept, task=task, arm=arm, reasoning_mode=mode,
                      action_protocol=protocol, fork=cut, info=minisweagent_info(info),
                      provenance=notes if marked_fork else {**notes, "fork_choice": why},
                      source=source, tools=tools,
                      continuation=rest)
    return checked(history, origin=origin)


def checked(history: History, *, origin: str) -> History:
    """Run the file validator over a built history, so importers never return what
    `load_history` would refuse."""
    return History.from_json(history.to_json(), origin=origin)
