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
    reasoning_details, content parts joined, empty tool_calls dropped, null fields dropped, other
    provider fields kept under extra.source_fields. Idempotent."""
    message: dict[str, Any] = {"role": raw.get("role")}
    message["content"] = text_of(raw.get("content"))
    reasoning = raw.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = raw.get("reasoning_content")
    if not isinstance(reasoning, str) and isinstance(raw.get("reasoning_details"), list):
        texts = [d.get("text") for d in raw["reasoning_details"] if isinstance(d, dict)]
        reasoning = "\n".join(t for t in texts if isinstance(t, str)) or None
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


def cut_at_fork(messages: list[dict[str, Any]], protocol: str, requested: int | None, *,
                origin: str) -> tuple[list[dict[str, Any]], Fork, list[dict[str, Any]]]:
    """Split messages at the fork: (history, fork, continuation).

    `requested` is an assistant message index; None picks the last assistant turn with an
    action. A fork that cannot be found is refused with the file, the index and the reason.
    """
    candidates = [i for i, m in enumerate(messages) if message_action(m, protocol) is not None]
    if requested is None:
        if not candidates:
            raise refusal(origin, "no assistant turn with an action to fork at (expected "
                          + ("one tool call" if protocol == "tool_calls" else
                             "one fenced ```bash block") + " in some assistant message)",
                          field_name="fork")
        index = candidates[-1]
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
                          f"{candidates})", index=index, field_name="fork")
    action = message_action(messages[index], protocol)
    assert action is not None
    if action.get("tool_call_id") is None:
        action.pop("tool_call_id", None)
    pending = _observation_for(messages, index, action, protocol)
    fork = Fork(message_index=index, action=action, pending_result=pending)
    return messages[: index + 1], fork, messages[index + 1:]


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
                  tools: list[dict[str, Any]] | None = None) -> History:
    """Normalize, validate, cut at the fork and return a checked History."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise refusal(origin, "must be a list of message objects", field_name="messages")
    normalized = [normalize_message(m) for m in messages]
    validate_messages(normalized, origin=origin)
    mode, protocol = detect_modes(normalized)
    kept, cut, rest = cut_at_fork(normalized, protocol, fork, origin=origin)
    history = History(messages=kept, task=task, arm=arm, reasoning_mode=mode,
                      action_protocol=protocol, fork=cut, info=minisweagent_info(info),
                      provenance=dict(provenance or {}), source=source, tools=tools,
                      continuation=rest)
    return checked(history, origin=origin)


def checked(history: History, *, origin: str) -> History:
    """Run the file validator over a built history, so importers never return what
    `load_history` would refuse."""
    return History.from_json(history.to_json(), origin=origin)
